#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <variant>

#include "gossip/config/config.hpp"
#include "gossip/config/options.hpp"
#include "gossip/train/preflight.hpp"
#include "kernels/models.hpp"

using gg::gossip::Config;
using gg::gossip::PruneCriterion;
using gg::gossip::PruneLayers;
using gg::gossip::WeightLayout;
namespace kernels = gg::kernels;
using gg::gossip::parse_train_args;
using gg::gossip::UsageError;
namespace fs = std::filesystem;

namespace {
std::string write_ini(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}
// What `gossipgrad train` checks before any rank starts: the config, then this machine.
Config train_args(const std::vector<std::string>& args) {
  const Config c = parse_train_args(args);
  gg::gossip::check_this_machine(c);
  gg::gossip::check_run_files(c);
  return c;
}
std::string error_of(const std::vector<std::string>& args) {
  try {
    train_args(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("INI keys set options and the command line overrides the file") {
  const auto ini =
      write_ini("gg_cfg_a.ini", "[train]\nbatch = 8\nepochs = 3\n[model]\nwidth = 4\n");
  const Config c = parse_train_args({"--config", ini, "--train.epochs", "2"});
  CHECK(c.train.batch == 8);
  CHECK(c.train.epochs == 2);
  CHECK(c.model.width == 4);
  CHECK(c.train.lr == Approx(Config{}.train.lr));  // untouched keys keep their defaults
}

TEST_CASE("dotted options parse with and without '=' and negative values reach validation") {
  CHECK(parse_train_args({"--train.batch=16"}).train.batch == 16);
  CHECK(parse_train_args({"--train.lr", "0.05"}).train.lr == Approx(0.05));
  CHECK(error_of({"--train.batch", "-3"}).find("train.batch = -3 is out of range") !=
        std::string::npos);
}

TEST_CASE("booleans accept true/false in files and on the command line") {
  const auto ini = write_ini("gg_cfg_b.ini", "[data]\naugment = false\n");
  CHECK_FALSE(parse_train_args({"--config", ini}).data.augment);
  CHECK(parse_train_args({"--config", ini, "--data.augment", "true"}).data.augment);
}

TEST_CASE("usage errors name the option and the problem in one line") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--train.batch", "0"}, "train.batch"},
      {{"--train.epochs", "0"}, "train.epochs"},
      {{"--train.lr", "-1"}, "train.lr"},
      {{"--train.momentum", "1"}, "train.momentum"},
      {{"--train.threads", "-1"}, "train.threads"},
      {{"--train.batch", "many"}, "train.batch"},
      {{"--train.backend", "gpu9"}, "train.backend"},
      {{"--model.name", "vgg"}, "model.name"},
      {{"--gossip.mode", "magic"}, "gossip.mode"},
      {{"--data.prefetch", "0"}, "data.prefetch"},
      {{"--log.interval", "0"}, "log.interval"},
      {{"--no.such", "1"}, "no.such"},
      {{"--config", "/nonexistent/x.ini"}, "/nonexistent/x.ini"},
      {{"--data.dir", "/nonexistent"}, "data.dir"},
  };
  for (const auto& [args, needle] : cases) {
    const std::string e = error_of(args);
    INFO(args[0] << " -> " << e);
    CHECK(e.find(needle) != std::string::npos);
    CHECK(e.find('\n') == std::string::npos);
  }
}

TEST_CASE("unknown keys and wrong types inside the INI file are errors") {
  CHECK(error_of({"--config", write_ini("gg_cfg_c.ini", "[train]\nbogus = 1\n")}).find("bogus") !=
        std::string::npos);
  CHECK(error_of({"--config", write_ini("gg_cfg_d.ini", "[train]\nbatch = x\n")}).find("batch") !=
        std::string::npos);
}

TEST_CASE("a bad value or line holding boost's own placeholders is one line, not a hang") {
  // Boost's messages replace %value% / %invalid_line% with the text, in a loop that never ended
  // when the text held the placeholder (found by fuzz_config).
  CHECK(error_of({"--config", write_ini("gg_cfg_p1.ini", "[train]\nmax_steps = %value%x\n")}) ==
        "config file " + (std::filesystem::temp_directory_path() / "gg_cfg_p1.ini").string() +
            ": the argument ('%value%x') for option 'train.max_steps' is invalid");
  CHECK(error_of({"--train.max_steps", "%value%"}) ==
        "the argument ('%value%') for option '--train.max_steps' is invalid");
  CHECK(error_of({"--config", write_ini("gg_cfg_p2.ini", "[train]\nmax_steps %invalid_line%\n")})
            .find("invalid line 'max_steps %invalid_line%'") != std::string::npos);
}

TEST_CASE("an existing metrics file is refused unless overwrite is set") {
  const auto path = write_ini("gg_cfg_metrics.jsonl", "{}\n");
  CHECK(error_of({"--log.metrics", path}).find("already exists") != std::string::npos);
  CHECK(train_args({"--log.metrics", path, "--log.overwrite", "true"}).log.overwrite);
}

TEST_CASE("to_ini round-trips every setting") {
  Config c = parse_train_args({"--train.batch", "12", "--model.width", "6", "--train.nesterov",
                               "true", "--log.metrics", "x/y.jsonl"});
  const auto ini = write_ini("gg_cfg_rt.ini", gg::gossip::to_ini(c));
  const Config back = parse_train_args({"--config", ini});
  CHECK(gg::gossip::to_ini(back) == gg::gossip::to_ini(c));
  CHECK(back.train.batch == 12);
  CHECK(back.train.nesterov);
}

TEST_CASE("the shipped laptop config parses and is complete") {
  const Config c = parse_train_args({"--config", GG_SOURCE_DIR "/configs/laptop.ini"});
  CHECK(c.gossip.mode == "both");
  CHECK(c.model.name == "resnet8");
  const std::string ini = gg::gossip::to_ini(c);
  std::ifstream f(GG_SOURCE_DIR "/configs/laptop.ini");
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  // Every key the program knows appears in the shipped file.
  std::istringstream lines(ini);
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find(" = ");
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq);
    INFO(key);
    CHECK(text.find("\n" + key + " =") != std::string::npos);
  }
}

TEST_CASE("a checkpoint folder that already holds a checkpoint is refused unless overwrite") {
  const fs::path dir = fs::temp_directory_path() / "gg_cfg_ckpt";
  fs::remove_all(dir);
  fs::create_directories(dir);
  CHECK(train_args({"--checkpoint.dir", dir.string()}).checkpoint.dir == dir.string());
  std::ofstream(dir / "meta.json") << "{}";
  CHECK(error_of({"--checkpoint.dir", dir.string()}).find("already holds a checkpoint") !=
        std::string::npos);
  CHECK(train_args({"--checkpoint.dir", dir.string(), "--log.overwrite", "true"}).log.overwrite);
  CHECK(error_of({"--checkpoint.every_epochs", "2"}).find("needs checkpoint.dir") !=
        std::string::npos);
  CHECK(error_of({"--checkpoint.dir", dir.string(), "--checkpoint.every_epochs", "-1"})
            .find("checkpoint.every_epochs = -1 is out of range") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("apoptosis keys are validated with one line naming the key") {
  const Config d = parse_train_args({});
  CHECK_FALSE(d.apoptosis.enable);
  CHECK(d.apoptosis.criterion == PruneCriterion::RelativeNorm);
  const Config c = parse_train_args({"--apoptosis.enable", "true", "--apoptosis.layers", "fc",
                                     "--apoptosis.criterion", "norm", "--apoptosis.threshold",
                                     "0.01", "--apoptosis.interval", "50", "--apoptosis.max_share",
                                     "0.5", "--apoptosis.min_keep", "8"});
  CHECK(c.apoptosis.enable);
  CHECK(c.apoptosis.layers == PruneLayers::Fc);
  CHECK(c.apoptosis.criterion == PruneCriterion::Norm);
  CHECK(c.apoptosis.threshold == 0.01);
  CHECK(c.apoptosis.interval == 50);
  CHECK(c.apoptosis.max_share == 0.5);
  CHECK(c.apoptosis.min_keep == 8);
  CHECK(error_of({"--apoptosis.layers", "attention"}) ==
        "apoptosis.layers = attention is unknown: use fc, conv, both");
  CHECK(error_of({"--apoptosis.criterion", "activation"}) ==
        "apoptosis.criterion = activation is unknown: use relative_norm, norm");
  CHECK(error_of({"--apoptosis.max_share", "0"}).find("apoptosis.max_share = 0 is out of range") ==
        0);
  CHECK(error_of({"--apoptosis.max_share", "1.5"}).find("out of range") != std::string::npos);
  CHECK(error_of({"--apoptosis.interval", "0"}).find("apoptosis.interval = 0") == 0);
  CHECK(error_of({"--apoptosis.min_keep", "0"}).find("apoptosis.min_keep = 0") == 0);
  CHECK(error_of({"--apoptosis.threshold", "-1"}).find("apoptosis.threshold = -1") == 0);
  CHECK(error_of({"--apoptosis.until", "0"}).find("apoptosis.until = 0 is out of range") == 0);
  CHECK(parse_train_args({"--apoptosis.until", "0.5"}).apoptosis.until == 0.5);
}

TEST_CASE("train.init_from must name an existing file") {
  CHECK(error_of({"--train.init_from", "/nonexistent/w.npz"}) ==
        "train.init_from = /nonexistent/w.npz is not a file");
  CHECK(parse_train_args({}).train.init_from.empty());
}

TEST_CASE("parse_train_args reads no file but the config: this machine is the preflight's") {
  CHECK(parse_train_args({"--data.dir", "/nonexistent", "--train.init_from", "/nonexistent/w.npz",
                          "--checkpoint.resume", "/nonexistent"})
            .data.dir == "/nonexistent");
  CHECK(error_of({"--data.dir", "/nonexistent"}).find("data.dir = /nonexistent is not a folder") ==
        0);
  CHECK(error_of({"--checkpoint.resume", "/nonexistent"}) ==
        "checkpoint.resume = /nonexistent is not a folder");
  // Rules that need no file stay with the config, whoever parses it.
  CHECK_THROWS_WITH(parse_train_args({"--checkpoint.every_epochs", "2"}),
                    "checkpoint.every_epochs = 2 needs checkpoint.dir");
  CHECK_THROWS_WITH(parse_train_args({"--config", write_ini("gg_cfg_e.ini", "[log]\nmetrics =\n")}),
                    "log.metrics must name a file");
  CHECK_THROWS_WITH(parse_train_args({"--config", write_ini("gg_cfg_f.ini", "[data]\ndir =\n")}),
                    "data.source = fashion-mnist needs data.dir");
}

TEST_CASE("ranges that name another option are checked after every option's own range") {
  // train.batch 4 would also break data.shuffle_per_step's [0, train.batch] where the shuffle
  // runs: batch's own range wins when it is broken, the cross bound otherwise.
  CHECK(error_of({"--train.batch", "0", "--data.shuffle", "ids"}) ==
        "train.batch = 0 is out of range: must be in [1, 65536]");
  CHECK(error_of({"--train.batch", "4", "--data.shuffle", "ids"}) ==
        "data.shuffle_per_step = 8 is out of range: must be in [0, train.batch] (train.batch = "
        "4) with data.shuffle = ids");
  // Without the shuffle, data.shuffle_per_step does nothing and bounds nothing (issue 31).
  CHECK_NOTHROW(parse_train_args({"--train.batch", "4"}));
  CHECK(error_of({"--data.crop", "300"}) ==
        "data.resize = 256 is out of range: must be in [data.crop, 4096]");
  CHECK(error_of({"--train.epochs", "1", "--train.warmup_epochs", "2"}) ==
        "train.warmup_epochs = 2 is out of range: must be in [0, train.epochs]");
  CHECK(error_of({"--train.lr", "nan"}) == "train.lr = nan is out of range: must be in (0, 100]");
}

TEST_CASE("the registry: every option once, keys are section.name, help names every choice") {
  std::set<std::string> keys;
  for (const gg::gossip::Option& o : gg::gossip::options()) {
    const std::string key(o.key);
    INFO(key);
    CHECK(keys.insert(key).second);
    CHECK(key == std::string(o.section()) + "." + std::string(o.name()));
    CHECK_FALSE(o.help.empty());
    if (const auto* choices = std::get_if<gg::gossip::Choices>(&o.rule))
      for (std::string_view v : choices->values) CHECK(o.help.find(v) != std::string_view::npos);
    // A fixed-choice option: its prose names every value of its enum's table, and the table
    // sets what parses (one value each way).
    if (const auto* e = std::get_if<gg::gossip::EnumField>(&o.field)) {
      std::string list = e->choices(), first;
      for (size_t at = 0; at != std::string::npos;) {
        const size_t end = list.find(", ", at);
        const std::string v = list.substr(at, end == std::string::npos ? end : end - at);
        if (first.empty()) first = v;
        CHECK(o.help.find(v) != std::string_view::npos);
        at = end == std::string::npos ? end : end + 2;
      }
      gg::gossip::Config c;
      CHECK(e->set(c, first));
      CHECK(e->get(c) == first);
      CHECK_FALSE(e->set(c, "no-such-choice"));
    }
  }
  const std::string help = gg::gossip::train_help();
  for (const std::string& model : gg::kernels::model_names())
    CHECK(help.find(model) != std::string::npos);
  for (const std::string& key : keys) CHECK(help.find("--" + key + " ") != std::string::npos);
}

TEST_CASE("train help says what transport auto and rma are") {
  std::string help;  // the registry's text, before --help wraps it
  for (const gg::gossip::Option& o : gg::gossip::options())
    if (o.key == "gossip.transport") help = o.help;
  CHECK(help.find("auto (shm between ranks on the same node, p2p between nodes)") !=
        std::string::npos);
  CHECK(help.find("passive-target") != std::string::npos);
  const std::string all = gg::gossip::train_help();
  CHECK(all.find("experimental") == std::string::npos);
  CHECK(all.find("PSCW") == std::string::npos);
}

TEST_CASE("the lossy wires are refused where they cannot apply, in one line") {
  for (const char* w : {"bf16", "int8", "int4"}) {
    CAPTURE(w);
    CHECK(error_of({"--gossip.mode", "allreduce", "--gossip.wire", w}) ==
          "gossip.wire and gossip.model_wire other than fp32 need a gossip mode (allreduce sums "
          "fp32)");
    CHECK(error_of({"--gossip.model_wire", w, "--gossip.error_feedback", "true"}).empty());
    CHECK(error_of({"--gossip.mode", "grad", "--gossip.wire", w}).empty());
  }
  CHECK(error_of({"--gossip.error_feedback", "true"}) ==
        "gossip.error_feedback needs a lossy wire: gossip.wire or gossip.model_wire = bf16, int8 "
        "or int4");
  CHECK(error_of({"--gossip.wire", "fp16"}) ==
        "gossip.wire = fp16 is unknown: use fp32, bf16, int8, int4");
}

TEST_CASE("gossip.choco: public copies where they change what a run does, else one line") {
  const std::vector<std::string> int4 = {"--gossip.model_wire", "int4", "--gossip.choco", "true",
                                         "--gossip.rotate",     "false"};
  const auto with = [&int4](std::vector<std::string> more) {
    more.insert(more.begin(), int4.begin(), int4.end());
    return error_of(more);
  };
  for (const char* m : {"model", "both", "gossipgrad"}) CHECK(with({"--gossip.mode", m}).empty());
  CHECK(with({"--gossip.mode", "both", "--gossip.wire", "int8", "--gossip.error_feedback", "true"})
            .empty());  // the gradients' wire keeps its error feedback
  CHECK(with({"--gossip.mode", "grad"}).rfind("gossip.model_wire = int4 is the weights' wire", 0) ==
        0);
  CHECK(error_of({"--gossip.mode", "grad", "--gossip.choco", "true"}) ==
        "gossip.choco sends the weights' difference to public copies; gossip.mode = grad exchanges "
        "no weights: use model, both or gossipgrad");
  CHECK(error_of({"--gossip.choco", "true"}) ==
        "gossip.choco with gossip.model_wire = fp32 sends the difference exactly (the pair "
        "average, with two model copies per partner): set gossip.model_wire = int8, int4 or bf16");
  CHECK(error_of({"--gossip.model_wire", "int8", "--gossip.choco", "true"}) ==
        "gossip.choco keeps a pair of public copies per partner and needs the same few partners "
        "again and again: set gossip.rotate = false and a fixed schedule (dissemination, "
        "hypercube or ring); with gossip.rotate a rank meets up to p - 1 partners, each too "
        "seldom for its copy to follow");
  CHECK(with({"--gossip.schedule", "random"}).find("with the random schedule") !=
        std::string::npos);
  for (const char* s : {"hypercube", "ring"}) CHECK(with({"--gossip.schedule", s}).empty());
  CHECK(with({"--gossip.staleness", "1", "--gossip.overlap_model", "false"}) ==
        "gossip.choco needs gossip.staleness = 0: both ends of a pair must add every difference, "
        "in order, to their public copies");
  CHECK(with({"--gossip.error_feedback", "true"}) ==
        "gossip.error_feedback with gossip.choco has nothing to do: the public copies carry what "
        "rounding takes off the weights (and no gradients travel on a lossy wire); leave it out");
}

TEST_CASE("a schedule with two peers a step: what carries and mixes one partner is refused") {
  const std::vector<std::string> exp2 = {"--gossip.schedule", "exponential2",
                                         "--gossip.overlap_model", "false"};
  const auto with = [&exp2](std::vector<std::string> more) {
    more.insert(more.begin(), exp2.begin(), exp2.end());
    return error_of(more);
  };
  const std::string what = "gossip.schedule = exponential2 gives each rank 2 peers a step; ";
  for (const char* m : {"grad", "model", "both", "gossipgrad"})
    CHECK(with({"--gossip.mode", m}).empty());
  CHECK(with({"--gossip.transport", "p2p"}).empty());
  CHECK(with({"--gossip.transport", "shm"}) ==
        what +
            "gossip.transport = shm carries one: set gossip.transport = p2p (or auto, which "
            "then is p2p)");
  CHECK(with({"--gossip.transport", "rma"}).rfind(what + "gossip.transport = rma", 0) == 0);
  CHECK(error_of({"--gossip.schedule", "exponential2"}) ==
        what +
            "the overlapped weight exchange corrects with one partner's weights: set "
            "gossip.overlap_model = false");
  CHECK(with({"--gossip.staleness", "1"}) ==
        what + "they are mixed at gossip.staleness = 0: set it");
  CHECK(with({"--gossip.model_wire", "int4", "--gossip.choco", "true", "--gossip.rotate",
              "false"}) == what +
                               "gossip.choco keeps its public copies for one partner a step: "
                               "leave it out or use a one-peer schedule");
  CHECK(with({"--gossip.consensus_bound", "1e-3"}).rfind(what + "gossip.consensus_bound", 0) == 0);
  CHECK(with({"--gossip.mode", "grad", "--gossip.hierarchy", "node"})
            .rfind(what + "gossip.hierarchy = node", 0) == 0);
  // Auto carries two peers over p2p; the transport given is kept otherwise.
  Config c = train_args(exp2);
  CHECK(gg::gossip::exchange_options(c, gg::gossip::Mixed::Weights).transport ==
        gg::gossip::TransportKind::P2p);
  c.gossip.schedule = gg::partners::Kind::Dissemination;
  CHECK(gg::gossip::exchange_options(c, gg::gossip::Mixed::Weights).transport ==
        gg::gossip::TransportKind::Auto);
  CHECK(error_of({"--gossip.mode", "allreduce", "--gossip.schedule", "exponential2"}).empty());
}

TEST_CASE("gossip.rule other than average runs alone, else one line") {
  const std::vector<std::string> ps = {"--gossip.rule", "push-sum", "--gossip.overlap_model",
                                       "false"};
  const auto with = [&ps](std::vector<std::string> more) {
    more.insert(more.begin(), ps.begin(), ps.end());
    return error_of(more);
  };
  for (const char* m : {"grad", "model", "both", "gossipgrad"})
    CHECK(with({"--gossip.mode", m}).empty());
  CHECK(with({"--gossip.schedule", "exponential2"}).empty());
  CHECK(error_of({"--gossip.rule", "push-sum"}) ==
        "gossip.rule = push-sum mixes by itself, not as the overlapped correction: set "
        "gossip.overlap_model = false");
  CHECK(with({"--gossip.staleness", "1"}) ==
        "gossip.rule = push-sum mixes by itself, at gossip.staleness = 0: set it");
  CHECK(
      with({"--gossip.model_wire", "int4", "--gossip.choco", "true", "--gossip.rotate", "false"}) ==
      "gossip.rule = push-sum mixes by itself, not through gossip.choco or gossip.low_rank: "
      "leave them out");
  CHECK(with({"--gossip.consensus_bound", "1e-3"}).rfind("gossip.rule = push-sum mixes", 0) == 0);
  CHECK(with({"--gossip.mode", "model", "--gossip.model_wire", "bf16", "--gossip.error_feedback",
              "true"}) ==
        "gossip.rule = push-sum mixes by itself, on the fp32 wire: set gossip.wire and "
        "gossip.model_wire = fp32");
  CHECK(with({"--gossip.mode", "model", "--gossip.wire", "int8"}).rfind("gossip.wire = int8", 0) ==
        0);  // a wire the mode does not send: the wires' own line
  CHECK(error_of({"--gossip.rule", "sum"}) ==
        "gossip.rule = sum is unknown: use average, push-sum");
}

TEST_CASE("gossip.rounding = stochastic only where an int8 or int4 wire carries something") {
  const std::string refused =
      "gossip.rounding = stochastic rounds the int8 and int4 wires, and this run sends none: set "
      "gossip.wire or gossip.model_wire = int8 or int4 (where gossip.mode sends it)";
  CHECK(error_of({"--gossip.rounding", "stochastic"}) == refused);
  CHECK(error_of({"--gossip.rounding", "stochastic", "--gossip.mode", "both", "--gossip.wire",
                  "bf16"}) == refused);
  CHECK(error_of(
            {"--gossip.rounding", "stochastic", "--gossip.mode", "both", "--gossip.wire", "int4"})
            .empty());
  CHECK(error_of({"--gossip.rounding", "stochastic", "--gossip.mode", "model",
                  "--gossip.model_wire", "int8", "--gossip.error_feedback", "true"})
            .empty());
  CHECK(error_of({"--gossip.rounding", "up"}).find("gossip.rounding") != std::string::npos);
  // Each buffer rounds with its own draws: gossipgrad's weights and momentum of one step, and the
  // gradients and weights of `both`, would otherwise share them value for value.
  const Config c = parse_train_args({"--gossip.rounding", "stochastic", "--gossip.mode", "both",
                                     "--gossip.wire", "int4", "--gossip.model_wire", "int4"});
  using gg::gossip::Mixed;
  std::set<int> streams;
  for (Mixed m : {Mixed::Grads, Mixed::Weights, Mixed::Momentum}) {
    const gg::gossip::GossipOptions o = gg::gossip::exchange_options(c, m);
    CHECK(o.stochastic);
    streams.insert(o.stream);
  }
  CHECK(streams.size() == 3);
}

TEST_CASE("gossip.low_rank: PowerGossip where pairs meet again, else one line") {
  const std::vector<std::string> pairs = {
      "--gossip.low_rank", "2", "--gossip.schedule", "hypercube", "--gossip.rotate", "false"};
  const auto with = [&pairs](std::vector<std::string> more) {
    more.insert(more.begin(), pairs.begin(), pairs.end());
    return error_of(more);
  };
  for (const char* m : {"model", "both", "gossipgrad"}) CHECK(with({"--gossip.mode", m}).empty());
  CHECK(with({"--gossip.model_wire", "bf16"}).empty());
  CHECK(with({"--gossip.mode", "grad"}) ==
        "gossip.low_rank = 2 mixes the weights' difference; gossip.mode = grad exchanges no "
        "weights: use model, both or gossipgrad");
  CHECK(with({"--gossip.model_wire", "int4", "--gossip.choco", "true"}) ==
        "gossip.low_rank = 2 and gossip.choco are two ways to compress the weights' exchange: "
        "choose one");
  CHECK(error_of({"--gossip.low_rank", "1"}) ==
        "gossip.low_rank = 1 needs pairs that meet again and again (each keeps a factor per "
        "partner, and both ends of a pair mix the same difference): set gossip.schedule = "
        "hypercube and gossip.rotate = false");
  CHECK(
      error_of({"--gossip.low_rank", "2", "--gossip.schedule", "ring", "--gossip.rotate", "false"})
          .rfind("gossip.low_rank = 2 needs pairs", 0) == 0);
  CHECK(error_of({"--gossip.low_rank", "2", "--gossip.schedule", "hypercube"})
            .rfind("gossip.low_rank = 2 needs pairs", 0) == 0);
  CHECK(with({"--gossip.staleness", "1", "--gossip.overlap_model", "false"}) ==
        "gossip.low_rank = 2 needs gossip.staleness = 0: both ends of a pair must mix every "
        "projection, in order");
  CHECK(with({"--gossip.consensus_bound", "0.1"})
            .rfind("gossip.low_rank = 2 sends a projection of the difference", 0) == 0);
  CHECK(with({"--gossip.model_wire", "bf16", "--gossip.error_feedback", "true"}) ==
        "gossip.error_feedback with gossip.low_rank = 2 has nothing to do: the factors carry what "
        "a projection leaves out to the next meeting (and no gradients travel on a lossy wire); "
        "leave it out");
  CHECK(error_of({"--gossip.low_rank", "65"}).find("gossip.low_rank") != std::string::npos);
}

TEST_CASE("train.weight_layout set for a backend other than onednn is reported as doing nothing") {
  Config c;
  c.train.weight_layout = WeightLayout::Plain;
  auto warned = [&c] {
    for (const std::string& w : inert_settings(c))
      if (w.find("train.weight_layout does nothing") != std::string::npos) return true;
    return false;
  };
  CHECK_FALSE(warned());  // onednn: plain is a real choice
  c.train.backend = kernels::Backend::Reference;
  CHECK(warned());
  c.train.weight_layout = WeightLayout::Native;  // the default: nothing set, nothing said
  CHECK_FALSE(warned());
}

TEST_CASE("an option the run cannot honour is refused, not ignored (issue 52 row 7)") {
  for (const char* mode : {"grad", "allreduce"}) {
    CAPTURE(mode);
    CHECK(error_of({"--gossip.mode", mode, "--gossip.overlap_model", "false",
                    "--gossip.pipeline_weights", "true"})
              .starts_with("gossip.pipeline_weights = true waits for the weights' buckets"));
    // Asking for less than the default (no overlap) where nothing overlaps is harmless: a warning.
    Config c = parse_train_args({"--gossip.mode", mode, "--gossip.overlap_model", "false"});
    CHECK(inert_settings(c).size() == 1);
  }
  CHECK(error_of({"--gossip.mode", "allreduce", "--gossip.global_every", "5"})
            .starts_with("gossip.global_every = 5 averages the gossiping ranks' weights"));
  CHECK(error_of({"--gossip.mode", "grad", "--gossip.global_every", "5"}).empty());

  const auto virtual_error = [](std::vector<std::string> args) {
    args.insert(args.end(), {"--train.virtual_ranks", "4", "--data.shuffle", "off"});
    try {
      gg::gossip::check_ranks(parse_train_args(args), 1, false);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(virtual_error({}).empty());
  CHECK(virtual_error({"--gossip.transport", "rma"})
            .starts_with("train.virtual_ranks = 4: gossip.transport = rma moves buckets"));
  CHECK(virtual_error({"--gossip.threading", "concurrent"})
            .starts_with("train.virtual_ranks = 4: gossip.threading = concurrent"));
  CHECK(virtual_error({"--gossip.mode", "model", "--gossip.overlap_model", "false",
                       "--gossip.pipeline_weights", "true"})
            .starts_with("train.virtual_ranks = 4: gossip.pipeline_weights = true"));
  // A bound on waiting where no rank waits: harmless, a warning.
  CHECK(virtual_error({"--gossip.timeout_s", "5"}).empty());
}
