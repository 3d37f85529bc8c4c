// The distributed shuffle's channel over MPI: how samples travel between shuffle partners.
#pragma once

#include <cstdint>
#include <vector>

#include "gossip/comm/mpi.hpp"
#include "shuffle/distributed.hpp"

namespace gg::gossip {

// The shuffle's payloads over MPI, on a private duplicate of the communicator: per step a size
// and a payload each way (MPI_Isend/MPI_Irecv posted by start(), so the transfer overlaps the
// forward pass where MPI progresses in the background; the receive completes in finish()).
class MpiShuffleChannel : public shuffle::ShuffleChannel {
 public:
  explicit MpiShuffleChannel(const mpi::Comm& comm);  // collective
  // A step still in flight (training failed mid-step) is abandoned: the receive is cancelled and
  // the sends left to complete on their own, so unwinding never blocks on a partner.
  ~MpiShuffleChannel() override;
  MpiShuffleChannel(const MpiShuffleChannel&) = delete;
  MpiShuffleChannel& operator=(const MpiShuffleChannel&) = delete;
  void start(int64_t step, int to, int from, std::vector<uint8_t> payload) override;
  std::vector<uint8_t> finish(int64_t step) override;

 private:
  mpi::Comm comm_;
  std::vector<uint8_t> out_;
  int64_t out_size_ = 0, in_size_ = 0;
  int from_ = 0, tag_ = 0;
  bool in_flight_ = false;
  mpi::Request send_size_, send_data_, recv_size_;
};

}  // namespace gg::gossip
