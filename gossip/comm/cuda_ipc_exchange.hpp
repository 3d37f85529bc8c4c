// The exchanges of a GPU-resident state between the ranks of one node, the gradients' and the
// weights': the GPU form of the shm transport. Device memory and event handles are exchanged once
// (CUDA IPC). Each step, as bucket b becomes final on the compute stream, a side stream copies it
// into an outbox of this rank's own and records bucket b's interprocess event; a one-word message
// tells the reader (the step's send_to) that every record is enqueued; the reader's side stream
// waits on each bucket's event, copies it device to device and mixes it in with the device pair
// average (kernels/cuda/cuda_kernels.hpp mix_pair, the host's bits), and its compute stream waits
// for the mixing before the update (gradients) or the next forward (weights). Nothing goes
// through the host, and the host never waits for the model: it only rendezvouses with its
// partners once a step. An outbox is not written again before its reader has said (the next
// step) that its copy is done.
//
// Serves the plain pair average of one link a step (dissemination, hypercube, ring, random) on
// the fp32 wire, not overlapped; everything else runs host-staged (the trainer decides, and says
// so in one line: Trainer::ipc_refusal).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gossip/comm/exchange.hpp"
#include "gossip/comm/mpi.hpp"
#include "partners/schedule.hpp"

namespace gg::gossip {

// Whether this build has it (the CUDA backend).
bool cuda_ipc_built();

// Over `device_buffer` (the floats `buckets` cover, in device memory, mixed in place) on `stream`
// (a cudaStream_t: the state's compute stream), every rank of `world` on this node (a collective:
// the handles are exchanged here). As a gradient exchange, on_bucket_ready(b) is called once
// bucket b's last kernel is enqueued, and finish_step makes the compute stream wait for the
// mixing; as a weight exchange, exchange_all does all three for every bucket. std::invalid_argument
// in a build without CUDA; std::runtime_error (one line) where CUDA refuses the handles.
std::unique_ptr<WeightExchange> make_cuda_ipc_exchange(const mpi::Comm& world, float* device_buffer,
                                                       std::vector<kernels::Bucket> buckets,
                                                       const partners::Schedule& schedule,
                                                       void* stream);

}  // namespace gg::gossip
