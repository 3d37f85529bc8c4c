// `gossipgrad export`: a checkpoint's model (shrunk or not by apoptosis) -> .npz with torchvision
// state_dict names, which PyTorch loads with load_state_dict.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "gossip/cli/args.hpp"
#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/checkpoint.hpp"
#include "kernels/apoptosis.hpp"
#include "kernels/executor.hpp"
#include "kernels/models.hpp"
#include "kernels/weights.hpp"

namespace gg::gossip {

namespace fs = std::filesystem;
namespace po = boost::program_options;

int cmd_export(const std::vector<std::string>& args) {
  std::string dir, output;
  bool overwrite = false;
  po::options_description d("export options");
  d.add_options()("help", "this help")("checkpoint", po::value(&dir)->required(),
                                       "checkpoint folder written by gossipgrad train")(
      "output", po::value(&output)->required(),
      ".npz to write, with torchvision state_dict names (loads into PyTorch with "
      "load_state_dict)")("overwrite", po::bool_switch(&overwrite),
                          "replace an existing output file");
  po::variables_map vm;
  if (!parse_options(args, d,
                     "usage: gossipgrad export --checkpoint DIR --output W.npz [--overwrite]", vm))
    return 0;
  const std::string weights = (fs::path(dir) / kCheckpointModel).string();
  const std::string meta_path = (fs::path(dir) / kCheckpointMeta).string();
  // The checkpoint's files may be symlinks to elsewhere: each is checked, not only the folder.
  require_distinct_output(
      {"--output", output},
      {{"--checkpoint", dir}, {"--checkpoint", weights}, {"--checkpoint", meta_path}});
  require_output_file(output, overwrite, "--output");
  const CheckpointMeta meta = read_checkpoint_meta(dir);
  require_input_file(weights, "--checkpoint " + dir + ":");
  gg::kernels::Graph g = [&] {
    try {
      // A model shrunk by apoptosis: the base model at the widths meta.json records.
      return gg::kernels::apply_widths(gg::kernels::build_model(meta.model), meta.widths);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(meta_path + ": " + e.what());
    }
  }();
  gg::kernels::ParamStore store(g);
  try {
    gg::kernels::load_weights(weights, g, store);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string(e.what()) + " (it does not match " + meta_path + ")");
  }
  gg::kernels::save_weights(output, g, store.params, store.buffers, meta.step);
  std::printf("exported %s (epoch %lld, step %lld, %lld parameters) from %s to %s\n",
              meta.model.name.c_str(), static_cast<long long>(meta.epoch),
              static_cast<long long>(meta.step), static_cast<long long>(g.param_count()),
              dir.c_str(), output.c_str());
  return 0;
}

}  // namespace gg::gossip
