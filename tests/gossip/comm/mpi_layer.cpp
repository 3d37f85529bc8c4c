// Run under mpirun with P >= 2 ranks: the RAII MPI layer works and reports failures as errors
// that name the call, instead of aborting.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mpi.hpp"
#include "tests/gossip/mpi_check.hpp"

using namespace gg;

namespace {
using test::check;
using test::failures;
}  // namespace

int main(int argc, char** argv) {
  mpi::Environment env(&argc, &argv);
  const mpi::Comm world = mpi::Comm::world();
  const int rank = world.rank(), p = world.size();
  check(env.thread_level() == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE granted", rank);

  {  // Point-to-point through Request: a ring shift.
    int out = 100 + rank, in = -1;
    mpi::Request send, recv;
    GG_MPI_CHECK(MPI_Irecv(&in, 1, MPI_INT, (rank + p - 1) % p, 7, world.get(), recv.out()));
    GG_MPI_CHECK(MPI_Isend(&out, 1, MPI_INT, (rank + 1) % p, 7, world.get(), send.out()));
    recv.wait();
    send.wait();
    check(in == 100 + (rank + p - 1) % p, "ring shift through Request", rank);
  }

  {  // A shared window on the node: every rank writes its segment, reads its neighbour's.
    const mpi::Comm node = world.split_shared();
    const int nr = node.rank(), np = node.size();
    mpi::Window win(node, 64, mpi::Window::Kind::Shared);
    // The unified-memory pattern: a passive epoch, MPI_Win_sync around the barrier.
    GG_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win.get()));
    std::memset(win.base(), nr + 1, 64);
    GG_MPI_CHECK(MPI_Win_sync(win.get()));
    node.barrier();
    GG_MPI_CHECK(MPI_Win_sync(win.get()));
    const auto* other = static_cast<const unsigned char*>(win.shared_base((nr + 1) % np));
    check(other[0] == (nr + 1) % np + 1 && other[63] == (nr + 1) % np + 1,
          "shared window segment of the neighbour", rank);
    GG_MPI_CHECK(MPI_Win_unlock_all(win.get()));
  }

  {  // An RMA window with PSCW: every rank puts its rank into its right neighbour.
    // 4 KiB, not sizeof(int): Debian's MPICH 4.0.2 (ch4:ucx) lost PSCW puts into 4- and 8-byte
    // windows in our trials, while 64 bytes and up worked; real windows are buffers of MBs.
    mpi::Window win(world, 4096, mpi::Window::Kind::Allocate);
    *static_cast<int*>(win.base()) = -1;
    world.barrier();
    MPI_Group all, to, from;
    GG_MPI_CHECK(MPI_Comm_group(world.get(), &all));
    const int right = (rank + 1) % p, left = (rank + p - 1) % p;
    GG_MPI_CHECK(MPI_Group_incl(all, 1, &right, &to));
    GG_MPI_CHECK(MPI_Group_incl(all, 1, &left, &from));
    GG_MPI_CHECK(MPI_Win_post(from, 0, win.get()));
    GG_MPI_CHECK(MPI_Win_start(to, 0, win.get()));
    GG_MPI_CHECK(MPI_Put(&rank, 1, MPI_INT, right, 0, 1, MPI_INT, win.get()));
    GG_MPI_CHECK(MPI_Win_complete(win.get()));
    GG_MPI_CHECK(MPI_Win_wait(win.get()));
    MPI_Group_free(&to);
    MPI_Group_free(&from);
    MPI_Group_free(&all);
  }

  {  // A failing call becomes an MpiError naming the call.
    bool thrown = false;
    try {
      int v = 0;
      GG_MPI_CHECK(MPI_Send(&v, 1, MPI_INT, p + 5, 0, world.get()));
    } catch (const mpi::MpiError& e) {
      thrown = std::string(e.what()).find("MPI_Send") != std::string::npos;
    }
    check(thrown, "an invalid rank throws MpiError naming MPI_Send", rank);
  }

  {  // The allreduce exchange averages every bucket, in whatever order they become ready.
    std::vector<float> g(10);
    for (int i = 0; i < 10; ++i) g[i] = static_cast<float>(rank * 10 + i);
    gossip::AllreduceExchange ex(world, g.data(), {{6, 10}, {2, 6}, {0, 2}});
    ex.begin_step(0);
    for (int b : {2, 0, 1}) ex.on_bucket_ready(b);
    ex.finish_step();
    bool ok = true;
    for (int i = 0; i < 10; ++i) ok &= std::fabs(g[i] - (5.0 * (p - 1) + i)) < 1e-4;
    check(ok, "allreduce exchange averages every bucket", rank);
  }

  {  // The peer-lost state belongs to a communicator and every one made from it; another
     // family (a second world object) keeps its own. Last: a lost family frees no window.
    const mpi::Comm base = mpi::Comm::world(), other = mpi::Comm::world();
    const mpi::Comm family = base.dup();
    const mpi::Comm node = family.split_shared(), half = family.split(rank % 2, rank);
    const mpi::Comm kept = rank < p - 1 ? family.without({p - 1}, 0x77) : mpi::Comm();
    check(!base.peer_lost() && !node.peer_lost(), "no peer lost at first", rank);
    half.mark_peer_lost();
    check(base.peer_lost() && family.peer_lost() && node.peer_lost() && half.peer_lost(),
          "a peer lost on one communicator is lost on its whole family", rank);
    check(rank == p - 1 || kept.peer_lost(), "the survivors' communicator shares it", rank);
    check(!other.peer_lost(), "another world object keeps its own peer-lost state", rank);
    world.barrier();
  }

  int bad = failures;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("mpi layer on %d ranks: %s\n", p, bad ? "FAIL" : "PASS");
  return bad ? 1 : 0;
}
