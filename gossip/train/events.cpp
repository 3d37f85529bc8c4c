#include "gossip/train/events.hpp"

namespace gg::gossip {

nlohmann::json count_or_null(int64_t n) { return n >= 0 ? nlohmann::json(n) : nlohmann::json(); }
nlohmann::json measure_or_null(double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(); }

nlohmann::json start_event(const Config& c, const StartFields& f) {
  return {{"event", "start"},
          {"ranks", f.ranks},
          {"threads", f.threads},
          {"model", c.model.name},
          {"params", f.params},
          {"global_batch", f.global_batch},
          {"steps", f.steps},
          {"epochs_planned", f.epochs_planned},
          {"first_step", f.first_step},
          {"mode", c.gossip.mode},
          {"backend", c.train.backend},
          {"faults_planned", f.faults_planned},
          {"fault_strategy", f.fault_strategy}};
}

namespace {
nlohmann::json step_fields(const StepFields& f, const StepStats& s) {
  return {{"event", "step"},
          {"step", f.step},
          {"epoch", f.epoch},
          {"loss", f.has_loss && s.has_loss ? nlohmann::json(s.loss) : nlohmann::json()},
          {"lr", s.lr},
          {"images_per_s", static_cast<double>(f.global_batch) / f.seconds},
          {"step_s", f.seconds},
          {"comm_s", s.comm_seconds},
          {"sent_bytes", count_or_null(s.sent_bytes)},
          {"late_buckets", count_or_null(s.late_buckets)},
          {"unmixed_buckets", count_or_null(s.unmixed_buckets)},
          {"consensus_estimate", measure_or_null(s.consensus_estimate)},
          {"consensus_average", s.consensus_average},
          {"data_wait_s", f.data_wait_s},
          {"shuffle_s", f.shuffle_s},
          {"skipped", f.skipped}};
}
}  // namespace

nlohmann::json step_event(const StepFields& f, const StepStats& s) {
  nlohmann::json e = step_fields(f, s);
  if (s.loss_step >= 0) e["loss_step"] = s.loss_step;  // a device state's: the step before
  return e;
}

nlohmann::json consensus_event(int64_t step, double consensus) {
  return {{"event", "consensus"}, {"step", step + 1}, {"consensus", consensus}};
}

nlohmann::json eval_event(int64_t epoch, int64_t step, const EvalStats& e, int ranks,
                          double wall_s) {
  return {{"event", "eval"},          {"epoch", epoch}, {"step", step},
          {"top1", e.top1},           {"top5", e.top5}, {"loss", e.loss},
          {"consensus", e.consensus}, {"ranks", ranks}, {"wall_s", wall_s}};
}

nlohmann::json stopped_event(const char* signal, int64_t step) {
  return {{"event", "stopped"}, {"signal", signal}, {"step", step}};
}

nlohmann::json summary_event(const SummaryFields& f) {
  const bool evaluated = f.eval_step >= 0;
  return {{"event", "summary"},
          {"steps", f.steps},
          {"epochs", static_cast<double>(f.steps) / static_cast<double>(f.per_epoch)},
          {"epochs_planned", f.epochs_planned},
          {"top1", evaluated ? nlohmann::json(f.top1) : nlohmann::json()},
          {"top5", evaluated ? nlohmann::json(f.top5) : nlohmann::json()},
          {"eval_step", count_or_null(f.eval_step)},
          {"wall_s", f.wall_s},
          {"images_per_s", f.images_per_s},
          {"comm_s", f.comm_s},
          {"exposed_comm_share", f.train_s > 0 ? f.comm_s / f.train_s : 0.0},
          {"data_wait_s", f.data_wait_s},
          {"params", f.params},
          {"skipped", f.skipped},
          {"shuffled_samples", f.shuffled},
          {"ranks", f.ranks},
          {"consensus_averages", f.consensus_averages},
          {"faults", f.faults}};
}

}  // namespace gg::gossip
