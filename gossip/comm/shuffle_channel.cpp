#include "gossip/comm/shuffle_channel.hpp"

#include "gossip/comm/wait_watch.hpp"

namespace gg::gossip {

MpiShuffleChannel::MpiShuffleChannel(const mpi::Comm& comm) : comm_(comm.dup()) {}

MpiShuffleChannel::~MpiShuffleChannel() {
  if (!in_flight_) return;
  if (*recv_size_.out() != MPI_REQUEST_NULL) {
    MPI_Cancel(recv_size_.out());
    MPI_Wait(recv_size_.out(), MPI_STATUS_IGNORE);
  }
  for (mpi::Request* r : {&send_size_, &send_data_})
    if (*r->out() != MPI_REQUEST_NULL) MPI_Request_free(r->out());
}

void MpiShuffleChannel::start(int64_t step, int to, int from, std::vector<uint8_t> payload) {
  if (static_cast<int64_t>(payload.size()) > mpi::kMaxCount)
    throw std::runtime_error("shuffle: payload of " + std::to_string(payload.size()) +
                             " bytes is too large for one message; lower data.shuffle_per_step");
  out_ = std::move(payload);
  out_size_ = static_cast<int64_t>(out_.size());
  from_ = from;
  // Tags cycle well inside MPI's guaranteed range; steps are finished in order anyway.
  tag_ = static_cast<int>(step % 8192) * 2;
  GG_MPI_CHECK(MPI_Isend(&out_size_, 1, MPI_INT64_T, to, tag_, comm_.get(), send_size_.out()));
  GG_MPI_CHECK(MPI_Isend(out_.data(), static_cast<int>(out_size_), MPI_BYTE, to, tag_ + 1,
                         comm_.get(), send_data_.out()));
  GG_MPI_CHECK(MPI_Irecv(&in_size_, 1, MPI_INT64_T, from, tag_, comm_.get(), recv_size_.out()));
  in_flight_ = true;
}

std::vector<uint8_t> MpiShuffleChannel::finish(int64_t /*step*/) {
  recv_size_.wait();
  if (in_size_ < 0 || in_size_ > mpi::kMaxCount)
    throw std::runtime_error("shuffle: partner announced " + std::to_string(in_size_) + " bytes");
  std::vector<uint8_t> in(static_cast<size_t>(in_size_));
  const mpi::WatchedWait wait("MPI_Recv");
  GG_MPI_CHECK(MPI_Recv(in.data(), static_cast<int>(in_size_), MPI_BYTE, from_, tag_ + 1,
                        comm_.get(), MPI_STATUS_IGNORE));
  send_size_.wait();
  send_data_.wait();
  in_flight_ = false;
  return in;
}

}  // namespace gg::gossip
