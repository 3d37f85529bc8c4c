#include "gossip/resilience/checkpoint.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "gossip/config/config.hpp"
#include "kernels/durable_file.hpp"
#include "kernels/weights.hpp"

namespace gg::gossip {
namespace {

namespace fs = std::filesystem;

}  // namespace

bool holds_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kCheckpointModel, ec) ||
      fs::exists(fs::path(dir) / kCheckpointMeta, ec))
    return true;
  for (const auto& entry : fs::directory_iterator(dir, ec))  // full checkpoints (ckpt-<step>)
    if (entry.path().filename().string().rfind("ckpt-", 0) == 0) return true;
  return false;
}

void write_checkpoint(const std::string& dir, const CheckpointMeta& meta, const kernels::Graph& g,
                      const std::vector<float>& params, const std::vector<float>& buffers) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("cannot create the checkpoint folder " + dir + ": " + ec.message());
  // torchvision's num_batches_tracked counts training forwards: one per optimizer step.
  kernels::save_weights((fs::path(dir) / kCheckpointModel).string(), g, params, buffers, meta.step);
  const kernels::ModelSpec& m = meta.model;
  nlohmann::json j = {{"format", "gossipgrad-checkpoint"},
                      {"version", 1},
                      {"model", m.name},
                      {"input", m.input},
                      {"classes", m.classes},
                      {"width", m.width},
                      {"batch_norm", m.batch_norm},
                      {"epoch", meta.epoch},
                      {"step", meta.step},
                      {"ranks", meta.ranks},
                      {"normalize", {{"mean", meta.input_mean}, {"std", meta.input_std}}},
                      {"weights", kCheckpointModel}};
  if (meta.top1) j["top1"] = *meta.top1;
  if (!meta.widths.empty()) j["widths"] = meta.widths;
  kernels::write_file_durably((fs::path(dir) / kCheckpointMeta).string(), j.dump(2) + "\n");
}

CheckpointMeta read_checkpoint_meta(const std::string& dir) {
  const fs::path path = fs::path(dir) / kCheckpointMeta;
  if (!fs::is_directory(dir)) throw UsageError("checkpoint folder " + dir + " does not exist");
  if (!fs::exists(path))
    throw UsageError(dir + " holds no checkpoint (" + kCheckpointMeta + " is missing)");
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path.string() + ": cannot be read");
  CheckpointMeta meta;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (j.value("format", "") != "gossipgrad-checkpoint")
      throw std::runtime_error(
          "not a gossipgrad checkpoint (no \"format\": \"gossipgrad-checkpoint\")");
    if (j.at("version").get<int>() != 1)
      throw std::runtime_error("checkpoint version " + j.at("version").dump() +
                               " is not supported (1 is)");
    meta.model.name = j.at("model").get<std::string>();
    meta.model.input = j.at("input").get<kernels::Dims>();
    meta.model.classes = j.at("classes").get<int64_t>();
    meta.model.width = j.at("width").get<int64_t>();
    meta.model.batch_norm = j.at("batch_norm").get<bool>();
    meta.epoch = j.at("epoch").get<int64_t>();
    meta.step = j.at("step").get<int64_t>();
    meta.ranks = j.at("ranks").get<int>();
    if (j.contains("widths")) meta.widths = j.at("widths").get<std::map<std::string, int64_t>>();
    if (j.contains("top1")) meta.top1 = j.at("top1").get<double>();
    if (j.contains("normalize")) {
      meta.input_mean = j.at("normalize").at("mean").get<double>();
      meta.input_std = j.at("normalize").at("std").get<double>();
    }
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    for (char& ch : what)
      if (ch == '\n') ch = ' ';
    throw std::runtime_error(path.string() + ": " + what);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
  return meta;
}

}  // namespace gg::gossip
