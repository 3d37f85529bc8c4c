// The metrics events (metrics.jsonl) of a run, built in one place for real ranks (loop.cpp,
// step_hooks.cpp) and virtual ones (virtual.cpp): the same fields, the same nulls (a count or a
// measure the run does not keep is null, never 0), so that tools and the virtual-against-real
// test read one schema. A virtual run adds fields of its own beside these (loss_mean, rank_top1,
// memory, "virtual": true).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "gossip/config/config.hpp"
#include "gossip/train/trainer.hpp"

namespace gg::gossip {

// n < 0: a count this run does not keep (allreduce's bytes, staleness 0's lateness).
nlohmann::json count_or_null(int64_t n);
// v < 0: none measured.
nlohmann::json measure_or_null(double v);

struct StartFields {
  int ranks = 1, threads = 1;
  int64_t params = 0, global_batch = 0, steps = 0, first_step = 0;
  double epochs_planned = 0;
  int64_t faults_planned = 0;
  FaultStrategy fault_strategy = FaultStrategy::Forward;
};
nlohmann::json start_event(const Config& c, const StartFields& f);

struct StepFields {
  int64_t step = 0, epoch = 0;
  bool has_loss = true;  // emulated compute computes none
  double seconds = 0;    // the step's wall time
  int64_t global_batch = 0;
  double data_wait_s = 0, shuffle_s = 0;
  int64_t skipped = 0;
};
nlohmann::json step_event(const StepFields& f, const StepStats& s);
// The consensus distance measured after step `step` (gossip.consensus_every).
nlohmann::json consensus_event(int64_t step, double consensus);
nlohmann::json eval_event(int64_t epoch, int64_t step, const EvalStats& e, int ranks,
                          double wall_s);
nlohmann::json stopped_event(const char* signal, int64_t step);

struct SummaryFields {
  int64_t steps = 0, per_epoch = 1, eval_step = -1;  // eval_step < 0: not evaluated
  double epochs_planned = 0, top1 = 0, top5 = 0;
  double wall_s = 0, images_per_s = 0, comm_s = 0, train_s = 0, data_wait_s = 0;
  int64_t params = 0, skipped = 0, shuffled = 0, consensus_averages = 0, faults = 0;
  int ranks = 1;
};
nlohmann::json summary_event(const SummaryFields& f);

}  // namespace gg::gossip
