#include "gossip/config/config.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

#include "gossip/config/options.hpp"
#include "partners/schedule.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace gg::gossip {
namespace {

// What --help says after an option's text: its choices (from the enum's name table, or the
// algorithms' registry) or its range, as parsing and the checks enforce them.
std::string help_of(const Option& o) {
  std::string help(o.help);
  if (const auto* e = std::get_if<EnumField>(&o.field))
    help.append(" {").append(e->choices()).append("}");
  if (const auto* c = std::get_if<Choices>(&o.rule)) {
    std::string list;
    for (std::string_view v : c->values) list.append(list.empty() ? "" : ", ").append(v);
    help.append(" {").append(list).append("}");
  }
  if (const auto* r = std::get_if<Range>(&o.rule)) {
    const std::string range = range_text(*r);
    if (range.rfind("in ", 0) == 0)
      help.append(" ").append(range, 3);
    else
      help.append(" (").append(range).append(")");
  }
  return help;
}

// The registry as Boost.Program_options options storing into c, one group per INI section.
po::options_description describe(Config& c) {
  const Config defaults;
  po::options_description all("train options (INI key = option name; [section] key = value)");
  std::vector<po::options_description> groups;
  std::string_view section;
  for (const Option& o : options()) {
    if (o.section() != section) {
      section = o.section();
      groups.emplace_back(std::string("[").append(section).append("]"));
    }
    const std::string key(o.key);
    std::visit(
        [&](auto get) {
          if constexpr (std::is_same_v<decltype(get), EnumField>) {
            // Stored by name: one of the enum's table, else the one line of an unknown choice.
            auto* value =
                po::value<std::string>()
                    ->default_value(std::string(get.get(defaults)))
                    ->notifier([&c, get, key](const std::string& v) {
                      if (!get.set(c, v))
                        throw UsageError(key + " = " + v + " is unknown: use " + get.choices());
                    });
            groups.back().add_options()(key.c_str(), value, help_of(o).c_str());
          } else {
            auto& field = get(c);
            auto* value = po::value(&field)->default_value(field, value_text(o, defaults));
            groups.back().add_options()(key.c_str(), value, help_of(o).c_str());
          }
        },
        o.field);
  }
  for (const auto& g : groups) all.add(g);
  return all;
}

// Emulated compute trains nothing: what needs a model that learns is refused with it.
void check_emulated(const Config& c) {
  if (!emulated(c)) {
    if (c.emulate.update_ms > 0 || c.emulate.jitter_p99 > 1 || !c.emulate.slow.empty())
      throw UsageError(
          "emulate.update_ms, jitter_p99 and slow need emulate.forward_ms or backward_ms > 0");
    return;
  }
  const std::pair<bool, const char*> refused[] = {
      {!c.checkpoint.dir.empty(), "checkpoint.dir"},
      {!c.train.init_from.empty(), "train.init_from"},
      {c.apoptosis.enable, "apoptosis.enable"},
      {!c.fault.inject.empty() || c.fault.mtbf_steps > 0, "fault.inject / fault.mtbf_steps"},
      {c.fault.nan >= 0, "fault.nan"},
      {c.fault.nan_stats >= 0, "fault.nan_stats"},
      {c.train.backend == kernels::Backend::Cuda, "train.backend = cuda"}};
  for (const auto& [set, what] : refused)
    if (set)
      throw UsageError(std::string(what) +
                       " cannot be used with emulated compute (emulate.forward_ms or backward_ms "
                       "> 0): an emulated run trains no model");
}

// gossip.choco: the weights' exchange with public copies, where it changes what a run does.
void check_choco(const Config& c) {
  if (!c.gossip.choco) return;
  const Algorithm& a = mixing_of(c);
  if (!a.weights)
    throw UsageError("gossip.choco sends the weights' difference to public copies; gossip.mode = " +
                     c.gossip.mode + " exchanges no weights: use " +
                     modes_that(&Algorithm::weights));
  if (!lossy(c.gossip.model_wire))
    throw UsageError(
        "gossip.choco with gossip.model_wire = fp32 sends the difference exactly (the pair "
        "average, with two model copies per partner): set gossip.model_wire = int8, int4 or bf16");
  if (c.gossip.rotate || c.gossip.schedule == partners::Kind::Random)
    throw UsageError(
        "gossip.choco keeps a pair of public copies per partner and needs the same few partners "
        "again and again: set gossip.rotate = false and a fixed schedule (dissemination, "
        "hypercube or ring); with " +
        std::string(c.gossip.rotate ? "gossip.rotate" : "the random schedule") +
        " a rank meets up to p - 1 partners, each too seldom for its copy to follow");
  if (c.gossip.staleness != 0)
    throw UsageError(
        "gossip.choco needs gossip.staleness = 0: both ends of a pair must add every difference, "
        "in order, to their public copies");
  if (c.gossip.error_feedback && !(a.grads && lossy(c.gossip.wire)))
    throw UsageError(
        "gossip.error_feedback with gossip.choco has nothing to do: the public copies carry what "
        "rounding takes off the weights (and no gradients travel on a lossy wire); leave it out");
}

// gossip.low_rank: PowerGossip's projections of the weights' difference, where they can run.
void check_low_rank(const Config& c) {
  if (c.gossip.low_rank == 0) return;
  const Algorithm& a = mixing_of(c);
  const std::string what = "gossip.low_rank = " + std::to_string(c.gossip.low_rank);
  if (!a.weights)
    throw UsageError(what + " mixes the weights' difference; gossip.mode = " + c.gossip.mode +
                     " exchanges no weights: use " + modes_that(&Algorithm::weights));
  if (c.gossip.choco)
    throw UsageError(what +
                     " and gossip.choco are two ways to compress the weights' exchange: "
                     "choose one");
  if (c.gossip.schedule != partners::Kind::Hypercube || c.gossip.rotate)
    throw UsageError(what +
                     " needs pairs that meet again and again (each keeps a factor per "
                     "partner, and both ends of a pair mix the same difference): set "
                     "gossip.schedule = hypercube and gossip.rotate = false");
  if (c.gossip.staleness != 0)
    throw UsageError(what +
                     " needs gossip.staleness = 0: both ends of a pair must mix every "
                     "projection, in order");
  if (c.gossip.consensus_bound > 0)
    throw UsageError(what +
                     " sends a projection of the difference, from which the ranks' "
                     "distance cannot be estimated: leave gossip.consensus_bound out (or "
                     "use gossip.global_every)");
  if (c.gossip.error_feedback && !(a.grads && lossy(c.gossip.wire)))
    throw UsageError(
        "gossip.error_feedback with " + what +
        " has nothing to do: the factors carry what a projection leaves out to the next "
        "meeting (and no gradients travel on a lossy wire); leave it out");
}

// gossip.rounding = stochastic: only where an int8 or int4 wire carries something.
void check_rounding(const Config& c) {
  if (c.gossip.rounding != Rounding::Stochastic) return;
  const Algorithm& a = mixing_of(c);
  if (!(a.grads && quantized(c.gossip.wire)) && !(a.weights && quantized(c.gossip.model_wire)))
    throw UsageError(
        "gossip.rounding = stochastic rounds the int8 and int4 wires, and this run sends none: "
        "set gossip.wire or gossip.model_wire = int8 or int4 (where gossip.mode sends it)");
}

// gossip.pipeline_weights against what it contradicts.
void check_pipeline(const Config& c, bool weights) {
  if (c.gossip.pipeline_weights && weights && c.gossip.overlap_model)
    throw UsageError(
        "gossip.pipeline_weights = true waits for the weights layer by layer in the next forward; "
        "gossip.overlap_model = true already exchanges them behind the whole next step: set "
        "gossip.overlap_model = false (or leave gossip.pipeline_weights = false)");
  if (c.gossip.pipeline_weights && weights && c.gossip.staleness != 0)
    throw UsageError(
        "gossip.pipeline_weights = true waits for the partner's weights before the layers read "
        "them; gossip.staleness = 1 never waits: set one of them back");
}

// Options that ask for a mechanism this mode lacks (as gossip.model_every without weights): the
// user expects their effect, so they are refused (inert_settings warns about the harmless).
void check_honoured(const Config& c, bool weights, bool allreduce) {
  const std::string& mode = c.gossip.mode;
  if (c.gossip.pipeline_weights && !weights)
    throw UsageError(
        "gossip.pipeline_weights = true waits for the weights' buckets in the next forward; "
        "gossip.mode = " +
        mode + " exchanges no weights: leave it false (or use " + modes_that(&Algorithm::weights) +
        ")");
  if (c.gossip.global_every != 0 && allreduce)
    throw UsageError("gossip.global_every = " + std::to_string(c.gossip.global_every) +
                     " averages the gossiping ranks' weights every so many steps; gossip.mode = "
                     "allreduce keeps them equal at every step: leave it at 0 (or use a gossip "
                     "mode)");
}

// A schedule with several peers a step (partners::links): what carries and mixes them. The
// engine's and the transports' preconditions (exchange.cpp, transport.cpp) say the same.
void check_links(const Config& c, bool weights) {
  const int k = partners::links(c.gossip.schedule);
  if (k == 1) return;
  const std::string what = "gossip.schedule = " + text_of(c.gossip.schedule) + " gives each rank " +
                           std::to_string(k) + " peers a step; ";
  if (c.gossip.transport == TransportKind::Shm || c.gossip.transport == TransportKind::Rma)
    throw UsageError(what + "gossip.transport = " + text_of(c.gossip.transport) +
                     " carries one: set gossip.transport = p2p (or auto, which then is p2p)");
  if (c.gossip.hierarchy == Hierarchy::Node)
    throw UsageError(what +
                     "gossip.hierarchy = node gossips with one partner node: set "
                     "gossip.hierarchy = none or a one-peer schedule");
  if (c.gossip.staleness != 0)
    throw UsageError(what + "they are mixed at gossip.staleness = 0: set it");
  if (weights && c.gossip.overlap_model)
    throw UsageError(what +
                     "the overlapped weight exchange corrects with one partner's weights: set "
                     "gossip.overlap_model = false");
  if (c.gossip.choco)
    throw UsageError(what +
                     "gossip.choco keeps its public copies for one partner a step: leave "
                     "it out or use a one-peer schedule");
  if (c.gossip.consensus_bound > 0)
    throw UsageError(what +
                     "gossip.consensus_bound measures the distance to one partner: leave it out "
                     "(or use gossip.global_every)");
}

// gossip.rule other than average: the plain exchange only (its variants, the lossy wires
// included, are the average's).
void check_rule(const Config& c, bool grads, bool weights) {
  if (c.gossip.rule == RuleKind::Average) return;
  const std::string what = "gossip.rule = " + text_of(c.gossip.rule) + " mixes by itself";
  if (c.gossip.staleness != 0) throw UsageError(what + ", at gossip.staleness = 0: set it");
  if (weights && c.gossip.overlap_model)
    throw UsageError(what + ", not as the overlapped correction: set gossip.overlap_model = false");
  if (c.gossip.choco || c.gossip.low_rank > 0)
    throw UsageError(what + ", not through gossip.choco or gossip.low_rank: leave them out");
  if (c.gossip.consensus_bound > 0)
    throw UsageError(what +
                     ", without a distance measure: leave gossip.consensus_bound out (or "
                     "use gossip.global_every)");
  if (c.gossip.hierarchy == Hierarchy::Node)
    throw UsageError(what + ", not inside nodes: set gossip.hierarchy = none");
  // The lossy wires (and their error feedback) are the average's variants.
  if ((grads && lossy(c.gossip.wire)) || (weights && lossy(c.gossip.model_wire)))
    throw UsageError(what + ", on the fp32 wire: set gossip.wire and gossip.model_wire = fp32");
}

// Which exchanges run and how: an option that would change what the exchange does, given where
// it does nothing, is refused (the user expects its effect); see inert_settings for the harmless.
void check_exchange(const Config& c) {
  const std::string& mode = c.gossip.mode;
  const Algorithm& a = mixing_of(c);
  const bool allreduce = a.allreduce, grads = a.grads, weights = a.weights;
  if (lossy(c.gossip.wire) && !grads && !allreduce)
    throw UsageError("gossip.wire = " + text_of(c.gossip.wire) +
                     " is the gradients' wire; gossip.mode = " + mode +
                     " exchanges no gradients: set gossip.model_wire = " + text_of(c.gossip.wire) +
                     " for the weights");
  if (lossy(c.gossip.model_wire) && !weights && !allreduce)
    throw UsageError("gossip.model_wire = " + text_of(c.gossip.model_wire) +
                     " is the weights' wire; gossip.mode = " + mode +
                     " exchanges no weights: set gossip.wire = " + text_of(c.gossip.model_wire) +
                     " for the gradients");
  if (c.gossip.staleness != 0 && allreduce)
    throw UsageError(
        "gossip.staleness = 1 is for gossip (every mode but allreduce): allreduce always waits "
        "for every rank's gradients");
  if (c.gossip.staleness != 0 && weights && c.gossip.overlap_model)
    throw UsageError(
        "gossip.staleness = 1 with gossip.mode = " + mode +
        " and gossip.overlap_model = true: the overlapped weight exchange already runs behind "
        "the next step and must complete; set gossip.overlap_model = false (weights mixed one "
        "step stale) or gossip.staleness = 0");
  check_pipeline(c, weights);
  check_honoured(c, weights, allreduce);
  if (c.gossip.late == Late::Skip && c.gossip.staleness != 1)
    throw UsageError(
        "gossip.late = skip is for buckets that have not arrived without waiting: set "
        "gossip.staleness = 1 (or leave gossip.late = previous)");
  if (c.gossip.model_every != 1 && !weights)
    throw UsageError(
        "gossip.model_every spaces out the weight exchanges of gossip.mode = " +
        modes_that(&Algorithm::weights) + "; mode " + mode +
        " exchanges no weights (use gossip.global_every for an average of the weights)");
  if (c.gossip.consensus_bound > 0 && !weights)
    throw UsageError(
        "gossip.consensus_bound estimates the ranks' distance from the partner's "
        "weights; gossip.mode = " +
        mode + " exchanges none: use " + modes_that(&Algorithm::weights) +
        " (or gossip.global_every for a fixed period)");
  if (!allreduce) {
    check_links(c, weights);
    check_rule(c, grads, weights);
  }
  check_choco(c);
  check_low_rank(c);
  check_rounding(c);
  if (c.gossip.hierarchy == Hierarchy::Node) {
    if (!grads || weights)
      throw UsageError(
          "gossip.hierarchy = node mixes gradients only: set gossip.mode = grad (not " + mode +
          ")");
    if (lossy(c.gossip.wire) || c.gossip.staleness != 0)
      throw UsageError(
          "gossip.hierarchy = node sends fp32 and waits for the partner node: set gossip.wire = "
          "fp32 and gossip.staleness = 0");
  }
}

// Rules that involve several options; each option's own range or grammar is checked first.
void check_combinations(const Config& c) {
  if (c.train.precision == kernels::Precision::Bf16 &&
      c.train.backend == kernels::Backend::Reference)
    throw UsageError("train.precision = bf16 needs train.backend = onednn or cuda");
  if (c.data.source == "fashion-mnist" && c.data.dir.empty())
    throw UsageError("data.source = fashion-mnist needs data.dir");
  for (const auto& [v, key] : {std::pair{c.checkpoint.every, "checkpoint.every"},
                               {c.train.stop_at, "train.stop_at"},
                               {c.checkpoint.every_epochs, "checkpoint.every_epochs"}})
    if (v > 0 && c.checkpoint.dir.empty())
      throw UsageError(std::string(key) + " = " + std::to_string(v) + " needs checkpoint.dir");
  if (c.train.stop_at > 0 && c.train.max_steps > 0 && c.train.stop_at >= c.train.max_steps)
    throw UsageError("train.stop_at = " + std::to_string(c.train.stop_at) +
                     " is not before train.max_steps = " + std::to_string(c.train.max_steps) +
                     ": it would never stop the run; set it lower or leave it at 0");
  if (c.checkpoint.every_minutes > 0 && c.checkpoint.dir.empty())
    throw UsageError("checkpoint.every_minutes needs checkpoint.dir");
  if (c.checkpoint.resume == "auto" && c.checkpoint.dir.empty())
    throw UsageError("checkpoint.resume = auto needs checkpoint.dir");
  check_emulated(c);
  if (c.train.resident) {
    if (c.train.backend != kernels::Backend::Cuda)
      throw UsageError(
          "train.resident keeps the training state on the GPU: it needs train.backend = cuda");
    check_resident(c, "train.resident");
  }
  if (mixing_of(c).allreduce && (lossy(c.gossip.wire) || lossy(c.gossip.model_wire)))
    throw UsageError(
        "gossip.wire and gossip.model_wire other than fp32 need a gossip mode (allreduce sums "
        "fp32)");
  if (c.gossip.error_feedback && !lossy(c.gossip.wire) && !lossy(c.gossip.model_wire))
    throw UsageError(
        "gossip.error_feedback needs a lossy wire: gossip.wire or gossip.model_wire = bf16, int8 "
        "or int4");
  check_exchange(c);
  const Config d;
  if (c.data.val_labels != d.data.val_labels && c.data.source.rfind("imagenet:", 0) != 0)
    throw UsageError("data.val_labels = " + c.data.val_labels +
                     " labels a flat val/ folder of data.source = imagenet:DIR; " + c.data.source +
                     " carries its own labels: leave it out");
  if (!small_model(c) &&
      (c.model.width != d.model.width || c.model.batch_norm != d.model.batch_norm))
    throw UsageError("model.width and model.batch_norm shape the small nets (resnet8, cnn); " +
                     c.model.name + " is torchvision's and has neither: leave them out");
  if (c.data.shuffle != shuffle::ShuffleMode::Off && c.data.shuffle_per_step > c.train.batch)
    throw UsageError("data.shuffle_per_step = " + std::to_string(c.data.shuffle_per_step) +
                     " is out of range: must be in [0, train.batch] (train.batch = " +
                     std::to_string(c.train.batch) +
                     ") with data.shuffle = " + text_of(c.data.shuffle));
  if ((!c.fault.inject.empty() || c.fault.mtbf_steps > 0) && c.apoptosis.enable)
    throw UsageError("fault.inject / fault.mtbf_steps cannot be combined with apoptosis.enable");
}

std::string rank_out_of_range(const std::string& key, const std::string& value, int rank,
                              int ranks) {
  return key + " = " + value + ": rank " + std::to_string(rank) + " is out of range: the job has " +
         std::to_string(ranks) + " rank" + (ranks == 1 ? "" : "s") + " (0 to " +
         std::to_string(ranks - 1) + ")";
}

}  // namespace

void check_resident(const Config& c, const std::string& what) {
  const bool weights = mixing_of(c).weights;  // what the two overlaps apply to
  const std::pair<bool, const char*> refused[] = {
      {weights && c.gossip.pipeline_weights, "gossip.pipeline_weights"},
      {emulated(c), "emulated compute"},
      {c.train.virtual_ranks > 0, "train.virtual_ranks"}};
  for (const auto& [set, option] : refused)
    if (set)
      throw UsageError(what +
                       " keeps the state apart from the host, and its exchanges run "
                       "host-staged around the steps: " +
                       option + " is not supported with it; leave it out");
}

namespace {
// train.virtual_ranks: what virtual ranks do not model (yet) is refused, not ignored.
void check_virtual(const Config& c, int ranks) {
  const std::string v = "train.virtual_ranks = " + std::to_string(c.train.virtual_ranks);
  if (ranks != 1)
    throw UsageError(v +
                     " runs that many logical ranks in ONE process: launch it without mpirun "
                     "(or with -n 1), not on " +
                     std::to_string(ranks) + " ranks");
  const Config d;
  const auto refuse = [&](bool set, const std::string& what) {
    if (set) throw UsageError(v + ": " + what);
  };
  refuse(emulated(c),
         "[emulate] replaces the arithmetic by waiting; virtual ranks compute it "
         "(leave [emulate] out, or run emulated compute on real ranks)");
  refuse(c.train.backend == kernels::Backend::Cuda,
         "virtual ranks run on the CPU backends (onednn, reference)");
  // How bytes move between processes: virtual ranks move none, so what these choose is not run.
  refuse(c.gossip.transport != d.gossip.transport,
         "gossip.transport = " + text_of(c.gossip.transport) +
             " moves buckets between processes; virtual ranks share one process and move "
             "none: leave it at " +
             text_of(d.gossip.transport) + " (or run real ranks under mpirun)");
  refuse(c.gossip.threading != d.gossip.threading,
         "gossip.threading = " + text_of(c.gossip.threading) +
             " chooses the threads that talk to MPI; virtual ranks do not talk to MPI: leave it "
             "at " +
             text_of(d.gossip.threading) + " (or run real ranks under mpirun)");
  refuse(c.gossip.pipeline_weights,
         "gossip.pipeline_weights = true waits for each bucket of the weights in the next "
         "forward; virtual ranks mix the weights after the update and wait for nothing: leave "
         "it false (the numbers are the same)");
  if (c.gossip.hierarchy == Hierarchy::Node) {  // logical nodes of network.ranks_per_node ranks
    const int k = c.network.ranks_per_node;
    refuse(c.train.virtual_ranks % k != 0,
           "gossip.hierarchy = node: network.ranks_per_node = " + std::to_string(k) +
               " (the logical node) must divide the virtual ranks");
    try {
      schedule_of(c, c.train.virtual_ranks / k);
    } catch (const std::invalid_argument& e) {
      throw UsageError(v + ", gossip.hierarchy = node: the schedule over " +
                       std::to_string(c.train.virtual_ranks / k) + " nodes: " + e.what());
    }
  }
  refuse(c.data.shuffle != shuffle::ShuffleMode::Off,
         "data.shuffle = " + text_of(c.data.shuffle) +
             " is not modelled by virtual ranks yet: use data.shuffle off");
  refuse(!c.checkpoint.dir.empty() || !c.checkpoint.resume.empty() || c.train.stop_at > 0,
         "checkpoints (checkpoint.dir, checkpoint.resume, train.stop_at) are not written by "
         "virtual ranks yet: leave them out");
  refuse(!c.fault.kill.empty() || !c.fault.stall.empty() || !c.fault.inject.empty() ||
             c.fault.mtbf_steps > 0 || c.fault.nan >= 0 || c.fault.nan_stats >= 0,
         "[fault] hooks need real ranks: leave them out");
  refuse(c.apoptosis.enable, "apoptosis.enable is not modelled by virtual ranks yet");
  refuse(!c.log.timeline.empty(), "log.timeline records real ranks' threads: leave it out");
  refuse(!c.log.samples.empty(), "log.samples is written by real ranks only (log.losses works)");
}
}  // namespace

void check_forward_survivors(const Config& c, int ranks, int ranks_on_node,
                             const std::vector<FaultEvent>& plan) {
  if (plan.empty() || c.fault.strategy != FaultStrategy::Forward) return;
  const std::string what =
      c.fault.inject.empty() ? std::string("fault.mtbf_steps") : "fault.inject = " + c.fault.inject;
  const std::string instead = "use fault.strategy restart or rollback";
  std::vector<FaultEvent> sorted = plan;
  std::sort(sorted.begin(), sorted.end(),
            [](const FaultEvent& a, const FaultEvent& b) { return a.step < b.step; });
  int left = ranks;
  for (size_t i = 0; i < sorted.size(); ++i) {
    --left;
    if (left < 1 || (i + 1 < sorted.size() && sorted[i + 1].step == sorted[i].step)) continue;
    const std::string after = what + " with fault.strategy forward leaves " + std::to_string(left) +
                              " rank" + (left == 1 ? "" : "s") + " from step " +
                              std::to_string(sorted[i].step);
    if (c.gossip.hierarchy == Hierarchy::Node && ranks_on_node > 1)
      throw UsageError(after +
                       ", and gossip.hierarchy = node needs the same number of ranks on "
                       "every node (a failed rank's node holds one fewer): " +
                       instead);
    if (mixing_of(c).allreduce) continue;
    try {
      schedule_of(c, left);
    } catch (const std::invalid_argument& e) {
      const std::string why = e.what();  // "...; use another schedule": said below instead
      throw UsageError(after + ", and gossip.schedule " + why.substr(0, why.find(';')) + ": " +
                       instead +
                       (c.gossip.low_rank > 0 ? "" : ", or gossip.schedule = dissemination"));
    }
  }
}

void check_ranks(const Config& c, int ranks, bool supervised_restart) {
  if (c.train.virtual_late > 0 && (c.train.virtual_ranks == 0 || c.gossip.staleness != 1))
    throw UsageError(
        "train.virtual_late models late partners of virtual ranks with gossip.staleness 1: set "
        "train.virtual_ranks and gossip.staleness 1, or leave it at 0");
  if (c.train.virtual_ranks > 0) {
    check_virtual(c, ranks);
    ranks = c.train.virtual_ranks;
  }
  if (!mixing_of(c).allreduce && c.gossip.hierarchy == Hierarchy::None) {
    try {
      schedule_of(c, ranks);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("gossip.schedule: ") + e.what());
    }
  }
  for (const auto& [spec, key] :
       {std::pair{c.fault.kill, "fault.kill"}, {c.fault.stall, "fault.stall"}})
    if (!spec.empty() && !supervised_restart) {
      const int r = parse_fault_kill(spec, key).first;
      if (r >= ranks) throw UsageError(rank_out_of_range(key, spec, r, ranks));
    }
  if (!c.fault.inject.empty())
    for (const FaultEvent& e : parse_fault_inject(c.fault.inject))
      if (e.rank >= ranks)
        throw UsageError(rank_out_of_range("fault.inject", c.fault.inject, e.rank, ranks));
  if (c.fault.mtbf_steps > 0 && ranks < 2)
    throw UsageError(
        "fault.mtbf_steps needs at least 2 ranks: one rank has no one to recover from");
  // The survivors of fault.inject (those of fault.mtbf_steps are drawn when the run knows its
  // length: gossip/train/loop.cpp); the node layout is the launcher's, checked there too.
  if (!c.fault.inject.empty() && !supervised_restart)
    check_forward_survivors(c, ranks, 0, parse_fault_inject(c.fault.inject));
  for (const auto& [r, factor] : parse_emulate_slow(c.emulate.slow))
    if (r >= ranks) throw UsageError(rank_out_of_range("emulate.slow", c.emulate.slow, r, ranks));
}

const Algorithm& mixing_of(const Config& c) { return find_algorithm(c.gossip.mode); }

partners::Schedule schedule_of(const Config& c, int p) {
  const partners::Schedule s{c.gossip.schedule, p, c.gossip.rotate,
                             static_cast<uint64_t>(c.train.seed)};
  partners::validate(s);
  return s;
}

GossipOptions exchange_options(const Config& c, Mixed what) {
  const bool after_update = what != Mixed::Grads;
  GossipOptions o;
  // Only p2p carries several peers a step: auto picks it then.
  o.transport = c.gossip.transport == TransportKind::Auto && partners::links(c.gossip.schedule) > 1
                    ? TransportKind::P2p
                    : c.gossip.transport;
  o.threading = c.gossip.threading;
  o.rule = c.gossip.rule;
  o.comm_threads = c.gossip.comm_threads;
  o.staleness = c.gossip.staleness;
  o.skip_late = c.gossip.late == Late::Skip;
  o.timeout_s = c.gossip.timeout_s;
  o.wire = after_update ? c.gossip.model_wire : c.gossip.wire;
  o.public_copies = after_update && c.gossip.choco;
  o.low_rank = after_update ? c.gossip.low_rank : 0;
  o.stochastic = c.gossip.rounding == Rounding::Stochastic && quantized(o.wire);
  o.stream = static_cast<int>(what);  // the weights' and the momentum's draws differ
  o.error_feedback =
      lossy(o.wire) && c.gossip.error_feedback && !o.public_copies && o.low_rank == 0;
  o.delayed = after_update && c.gossip.overlap_model;
  o.pipelined = after_update && c.gossip.pipeline_weights;
  o.measure_distance = what == Mixed::Weights && c.gossip.consensus_bound > 0;
  return o;
}

bool small_model(const Config& c) { return c.model.name == "resnet8" || c.model.name == "cnn"; }
Cadence cadence_of(const Config& c) {
  return {c.gossip.model_every, c.gossip.global_every, mixing_of(c).allreduce};
}

shuffle::SourceSpec data_source(const Config& c) {
  return shuffle::parse_source(c.data.source, c.data.dir);
}
bool fashion_mnist(const Config& c) { return c.data.source == "fashion-mnist"; }
std::string val_labels_file(const Config& c) {
  return c.data.val_labels == "auto" ? "" : c.data.val_labels;
}
bool resume_auto(const Config& c) { return c.checkpoint.resume == "auto"; }
bool apoptosis_relative(const Config& c) {
  return c.apoptosis.criterion == PruneCriterion::RelativeNorm;
}
bool apoptosis_prunes_conv(const Config& c) { return c.apoptosis.layers != PruneLayers::Fc; }
bool apoptosis_prunes_fc(const Config& c) { return c.apoptosis.layers != PruneLayers::Conv; }

namespace {
bool apoptosis_changed(const Config& c, const Config& d) {
  return c.apoptosis.criterion != d.apoptosis.criterion ||
         c.apoptosis.threshold != d.apoptosis.threshold ||
         c.apoptosis.interval != d.apoptosis.interval ||
         c.apoptosis.max_share != d.apoptosis.max_share ||
         c.apoptosis.layers != d.apoptosis.layers || c.apoptosis.min_keep != d.apoptosis.min_keep ||
         c.apoptosis.until != d.apoptosis.until;
}
}  // namespace

std::vector<std::string> inert_settings(const Config& c) {
  const Config d;  // the defaults
  const std::string& mode = c.gossip.mode;
  const bool gossip = !mixing_of(c).allreduce;
  const bool weights = mixing_of(c).weights;
  std::vector<std::string> out;
  auto note = [&](bool set, bool inert, const std::string& what) {
    if (set && inert) out.push_back(what);
  };
  const std::string allreduce = " does nothing with gossip.mode = allreduce (no partners)";
  const bool guard_set = c.guard.nan_retries != d.guard.nan_retries ||
                         c.guard.snapshot_every != d.guard.snapshot_every ||
                         c.guard.lr_factor != d.guard.lr_factor || c.guard.lag != d.guard.lag;
  note(guard_set, c.train.virtual_ranks > 0,
       "[guard] does nothing with train.virtual_ranks: a NaN or inf loss stops the virtual run");
  // Transport, threading and pipeline_weights are refused with virtual ranks (check_virtual).
  note(c.gossip.timeout_s != d.gossip.timeout_s, c.train.virtual_ranks > 0,
       "gossip.timeout_s does nothing with train.virtual_ranks: no rank waits on another");
  note(c.train.rank_eval_samples != d.train.rank_eval_samples, c.train.virtual_ranks == 0,
       "train.rank_eval_samples does nothing without train.virtual_ranks (real ranks evaluate "
       "their average model only)");
  note(c.gossip.schedule != d.gossip.schedule, !gossip, "gossip.schedule" + allreduce);
  note(c.gossip.rotate != d.gossip.rotate, !gossip, "gossip.rotate" + allreduce);
  note(c.gossip.rule != d.gossip.rule, !gossip, "gossip.rule" + allreduce);
  note(c.gossip.transport != d.gossip.transport, !gossip,
       "gossip.transport" + allreduce + ": MPI_Allreduce moves the bytes");
  note(c.gossip.threading != d.gossip.threading, !gossip, "gossip.threading" + allreduce);
  note(c.gossip.comm_threads != d.gossip.comm_threads,
       !gossip || c.gossip.threading != Threading::Concurrent,
       "gossip.comm_threads does nothing unless gossip.threading = concurrent");
  note(c.gossip.overlap_model != d.gossip.overlap_model, !weights,
       "gossip.overlap_model does nothing with gossip.mode = " + mode + " (no weight exchange)");
  // pipeline_weights = true without a weight exchange and global_every with allreduce ask for
  // what the run cannot do: refused (check_exchange). overlap_model = false asks for less.
  note(c.data.shuffle_per_step != d.data.shuffle_per_step,
       c.data.shuffle == shuffle::ShuffleMode::Off,
       "data.shuffle_per_step does nothing with data.shuffle = off");
  note(c.fault.strategy != d.fault.strategy, c.fault.inject.empty() && c.fault.mtbf_steps <= 0,
       "fault.strategy does nothing without fault.inject or fault.mtbf_steps");
  note(c.fault.nan_stats >= 0, !c.model.batch_norm,
       "fault.nan_stats does nothing with model.batch_norm = false (no running statistics)");
  note(c.log.timeline_steps != d.log.timeline_steps, c.log.timeline.empty(),
       "log.timeline_steps does nothing without log.timeline");
  note(c.train.nesterov != d.train.nesterov, c.train.momentum == 0,
       "train.nesterov does nothing with train.momentum = 0");
  note(c.train.weight_layout != d.train.weight_layout, backend_of(c) != kernels::Backend::OneDnn,
       "train.weight_layout does nothing with train.backend = " + text_of(c.train.backend) +
           " (it chooses oneDNN's weight layout)");
  note(apoptosis_changed(c, d), !c.apoptosis.enable,
       "apoptosis.* does nothing without apoptosis.enable");
  return out;
}

namespace {

void validate(const Config& c) {
  for (const Option& o : options()) check_option(o, c, /*cross=*/false);
  for (const Option& o : options()) check_option(o, c, /*cross=*/true);
  check_combinations(c);
}

// "--key value" -> "--key=value", so that values starting with '-' (e.g. -3) reach the
// range check instead of being taken for options.
std::vector<std::string> join_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool long_opt = a.rfind("--", 0) == 0 && a.size() > 2 && a.find('=') == std::string::npos;
    const bool has_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
    // An empty value ("--log.timeline ''") stays a token of its own: "--key=" is an error.
    if (long_opt && a != "--help" && has_value && !args[i + 1].empty()) {
      out.push_back(a + "=" + args[i + 1]);
      ++i;
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// The config file's text. Only a regular file of at most 1 MiB: a FIFO, a device (/dev/zero) or
// a huge file would hang or exhaust memory instead of failing.
std::string read_config_file(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status) || fs::is_directory(status))
    throw UsageError("config file " + path + " cannot be read (missing or unreadable)");
  if (!fs::is_regular_file(status))
    throw UsageError("config file " + path +
                     " is not a regular file (a pipe or a device): pass an INI file");
  constexpr std::uintmax_t kMaxBytes = 1 << 20;
  if (fs::file_size(path, ec) > kMaxBytes)
    throw UsageError("config file " + path + " is larger than 1 MiB: pass an INI file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("config file " + path + " cannot be read (missing or unreadable)");
  std::string text(kMaxBytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  return text;
}

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n') ch = ' ';
  return s;
}

// Boost's error messages fill placeholders such as %value% with the offending text, and loop
// forever when that text holds the placeholder itself (a value "%value%"). So the message comes
// from the same parse of the text with every '%' replaced (the error is the same: its structure
// is), and the '%'s are put back in the message. `parse` throws a po::error for its input.
constexpr char kPercentStandIn = '\x01';
std::string without_percent(std::string s) {
  std::replace(s.begin(), s.end(), '%', kPercentStandIn);
  return s;
}
std::string po_message(const std::function<void()>& parse_without_percent) {
  try {
    parse_without_percent();
  } catch (const po::error& e) {
    std::string m = one_line(e.what());
    std::replace(m.begin(), m.end(), kPercentStandIn, '%');
    return m;
  } catch (...) {
  }
  return "an option or its value is not valid (see gossipgrad train --help)";
}

}  // namespace

Config parse_train_args(const std::vector<std::string>& args) {
  Config c;
  po::options_description opts = describe(c);
  po::options_description top;
  top.add_options()("config", po::value(&c.config_path), "INI file with the run's settings");
  top.add(opts);
  po::variables_map vm;
  const auto parse_command_line = [&](const std::vector<std::string>& a) {
    return po::command_line_parser(join_values(a))
        .options(top)
        .style(po::command_line_style::unix_style & ~po::command_line_style::allow_guessing)
        .run();
  };
  try {
    const auto parsed = parse_command_line(args);
    for (const auto& o : parsed.options)
      if (o.unregistered || o.string_key.empty())
        throw UsageError("unknown argument '" +
                         (o.original_tokens.empty() ? o.string_key : o.original_tokens[0]) +
                         "' (see gossipgrad train --help)");
    po::store(parsed, vm);
    // The command line is stored first, so it wins over the file for every key it sets.
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      const std::string text = read_config_file(path);
      std::istringstream f(text);
      try {
        po::store(po::parse_config_file(f, opts, /*allow_unregistered=*/false), vm);
      } catch (const po::unknown_option& e) {
        throw UsageError("config file " + path + ": unknown key '" + e.get_option_name() +
                         "' (see gossipgrad train --help for the valid keys)");
      } catch (const po::error&) {
        throw UsageError("config file " + path + ": " + po_message([&] {
                           std::istringstream g(without_percent(text));
                           po::variables_map v;
                           po::store(po::parse_config_file(g, opts, false), v);
                         }));
      }
    }
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    const std::string name = e.get_option_name();
    throw UsageError("unknown option '" + name.substr(0, name.find('=')) +
                     "' (see gossipgrad train --help for the valid keys)");
  } catch (const po::error&) {
    throw UsageError(po_message([&] {
      std::vector<std::string> a;
      for (const std::string& x : args) a.push_back(without_percent(x));
      po::variables_map v;
      po::store(parse_command_line(a), v);
      po::notify(v);
    }));
  }
  validate(c);
  return c;
}

std::string train_help() {
  Config c;
  std::ostringstream s;
  s << "usage: mpirun -n P gossipgrad train [--config FILE] [--section.key value ...]\n"
       "       [mpirun -n P] gossipgrad train --config FILE --dry-run\n"
       "           validate as a real run of P ranks would (1 without mpirun), print the resolved\n"
       "           settings; another machine's missing data or files only warn\n\n"
    << describe(c);
  return s.str();
}

std::string to_ini(const Config& c) {
  std::ostringstream s;
  std::string_view section;
  for (const Option& o : options()) {
    if (o.section() != section) {
      s << (section.empty() ? "" : "\n") << "[" << o.section() << "]\n";
      section = o.section();
    }
    s << o.name() << " = " << value_text(o, c) << "\n";
  }
  return s.str();
}

}  // namespace gg::gossip
