// Trainer, a GPU-resident state's exchanges (train.resident): device to device over CUDA IPC
// where every rank shares this node and the exchange is the plain pair average
// (gossip/comm/cuda_ipc_exchange.hpp), else host-staged around the step, and why.

#include <string>
#include <utility>

#include "gossip/comm/cuda_ipc_exchange.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

std::string Trainer::ipc_refusal(bool weights) const {
  const Config& c = c_;
  const Config d;
  if (!cuda_ipc_built()) return "this build has no CUDA IPC";
  if (algorithm_.allreduce) return "allreduce sums through MPI on the host";
  if (!(weights ? algorithm_.weights : algorithm_.grads)) return "";  // nothing to exchange
  if (world_.size() < 2) return "one rank has no partner";
  if (!one_node_) return "the ranks span several nodes (MPI sends host memory between them)";
  const Wire wire = weights ? c.gossip.model_wire : c.gossip.wire;
  const std::pair<bool, std::string> refused[] = {
      {weights && c.gossip.overlap_model,
       "gossip.overlap_model is on (set it false to mix on the GPU)"},
      {weights && c.gossip.pipeline_weights, "gossip.pipeline_weights"},
      {weights && c.gossip.choco, "gossip.choco"},
      {weights && c.gossip.low_rank > 0, "gossip.low_rank"},
      {weights && c.gossip.consensus_bound > 0,
       "gossip.consensus_bound (the distance is measured on the host)"},
      {wire != Wire::Fp32, (weights ? "gossip.model_wire = " : "gossip.wire = ") + text_of(wire)},
      {c.gossip.hierarchy != d.gossip.hierarchy, "gossip.hierarchy"},
      {c.gossip.transport != d.gossip.transport,
       "gossip.transport = " + text_of(c.gossip.transport)},
      {c.gossip.rule != d.gossip.rule, "gossip.rule = " + text_of(c.gossip.rule)},
      {c.gossip.staleness != 0, "gossip.staleness"},
      {partners::links(c.gossip.schedule) != 1,
       "gossip.schedule = " + text_of(c.gossip.schedule) + " (several peers a step)"}};
  for (const auto& [set, what] : refused)
    if (set) return what;
  return "";
}

void Trainer::make_device_exchanges() {
  const partners::Schedule schedule = gossip_schedule(c_, world_.size());
  const auto over = [&](unsigned part) {
    return make_cuda_ipc_exchange(world_, state_->device_data(part), net_.buckets(), schedule,
                                  state_->device_stream());
  };
  if (algorithm_.grads && device_grads()) exchange_ = over(kernels::kGrads);
  if (algorithm_.weights && device_weights()) model_exchange_ = over(kernels::kParams);
  if (algorithm_.momentum && device_weights()) momentum_exchange_ = over(kernels::kVelocity);
  for (BucketExchange* e : exchanges()) e->set_timeline(timeline_);
}

std::string Trainer::exchange_path() const {
  if (!c_.train.resident) return "";
  std::string path;
  const auto say = [&](bool exchanged, bool device, const char* what, const std::string& why) {
    if (!exchanged) return;
    if (!path.empty()) path += "; ";
    path += what;
    path += device ? " device to device over CUDA IPC" : " host-staged (" + why + ")";
  };
  say(exchange_ != nullptr, device_grads(), "gradients", ipc_why_[0]);
  say(model_exchange_ != nullptr, device_weights(), "weights", ipc_why_[1]);
  return path.empty() ? "no exchange" : path;
}

}  // namespace gg::gossip
