// `gossipgrad pack`: an image folder (class folders, or an ImageNet root) -> WebDataset tar
// shards for data.source = shards:DIR, with a progress line on stderr.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gossip/cli/args.hpp"
#include "gossip/cli/commands.hpp"
#include "gossip/config/config.hpp"
#include "gossip/train/stop_signals.hpp"
#include "shuffle/tar.hpp"

namespace gg::gossip {
namespace {

// The pack options the command line names, checked, or nothing after printing --help.
std::optional<shuffle::PackOptions> parse_pack_args(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  shuffle::PackOptions o;
  double shard_mb = 256;
  std::string shuffle_seed = "0";
  o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  po::options_description d("pack options");
  // clang-format off
  d.add_options()
    ("help", "this help")
    ("input", po::value(&o.input)->required(),
     "class folders <wnid>/*.JPEG, or an ImageNet root with train/ (and val/)")
    ("output", po::value(&o.output)->required(),
     "folder for shard-NNNNNN.tar (+ classes.txt); train/ and val/ for an ImageNet root")
    ("shard-size", po::value(&shard_mb)->default_value(shard_mb), "MB per shard (0.001 - 65536)")
    ("threads", po::value(&o.threads)->default_value(o.threads), "shards written in parallel")
    ("shuffle", po::value(&shuffle_seed)->default_value(shuffle_seed),
     "seed of a random sample order across shards (0: sorted, the folder reader's ids)");
  // clang-format on
  po::variables_map vm;
  if (!parse_options(args, d,
                     "usage: gossipgrad pack --input DIR --output DIR [--shard-size MB] "
                     "[--threads N] [--shuffle SEED]",
                     vm, Prefixes::kTaken))
    return std::nullopt;
  if (!(shard_mb >= 0.001 && shard_mb <= 65536))
    throw UsageError("--shard-size " + std::to_string(shard_mb) + " must be in [0.001, 65536] MB");
  if (o.threads < 1 || o.threads > 256)
    throw UsageError("--threads " + std::to_string(o.threads) + " must be in [1, 256]");
  o.shard_bytes = static_cast<int64_t>(shard_mb * 1e6);
  o.shuffle_seed = parse_unsigned(shuffle_seed, "--shuffle");
  // The output folder is made where missing, under a folder: a file on the way is a usage error,
  // not a filesystem_error.
  std::filesystem::path above = std::filesystem::absolute(o.output);
  std::error_code ec;
  while (!std::filesystem::exists(above, ec) && above.has_parent_path() &&
         above != above.parent_path())
    above = above.parent_path();
  if (!std::filesystem::is_directory(above, ec))
    throw UsageError("--output " + o.output + ": " + above.string() +
                     " is a file, not a folder: choose a folder for the shards");
  // Shards inside the image folder would be read back as a class folder of no images.
  require_distinct_output({"--output", o.output}, {{"--input", o.input}});
  // An ImageNet root is packed into OUTPUT/train and OUTPUT/val, which may be links elsewhere.
  if (std::error_code ec;
      std::filesystem::is_directory(std::filesystem::path(o.input) / "train", ec))
    for (const char* split : {"train", "val"})
      require_distinct_output({"--output", (std::filesystem::path(o.output) / split).string()},
                              {{"--input", o.input}});
  return o;
}

// shuffle::pack with a progress line on stderr, redrawn at most every 250 ms and once at the end.
shuffle::PackResult pack_with_progress(const shuffle::PackOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last = t0;
  const auto line = [&](const shuffle::PackProgress& p) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "\rpack: %lld/%lld images, %d/%d shards, %.1f MB, %.1f MB/s   ",
                 static_cast<long long>(p.images), static_cast<long long>(p.total_images),
                 p.shards_done, p.shards, p.bytes / 1e6, s > 0 ? p.bytes / 1e6 / s : 0.0);
  };
  shuffle::PackProgress final_state;
  shuffle::PackResult r;
  try {
    r = shuffle::pack(o, [&](const shuffle::PackProgress& p) {
      final_state = p;
      const auto now = Clock::now();
      if (now - last >= std::chrono::milliseconds(250)) {
        last = now;
        line(p);
      }
    });
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  line(final_state);
  std::fprintf(stderr, "\n");
  return r;
}

}  // namespace

int cmd_pack(const std::vector<std::string>& args) {
  std::optional<shuffle::PackOptions> o = parse_pack_args(args);
  if (!o) return 0;
  // SIGTERM, Ctrl-C: the shard being written is removed, the finished ones kept, one line.
  StopSignals stop_signals(60);
  o->stop = [] { return StopSignals::requested() != 0; };
  shuffle::PackResult r;
  try {
    r = pack_with_progress(*o);
  } catch (const shuffle::PackStopped& e) {
    const int sig = StopSignals::requested();
    stop_signals.taken_up();
    std::fprintf(stderr,
                 "\ngossipgrad: pack stopped by %s: %s under %s, the rest not: remove the folder "
                 "and run pack again\n",
                 signal_name(sig), e.what(), o->output.c_str());
    return 128 + sig;
  }
  std::printf("pack: wrote %lld images (%.1f MB) into %d shards under %s\n",
              static_cast<long long>(r.images), r.bytes / 1e6, r.shards, o->output.c_str());
  return 0;
}

}  // namespace gg::gossip
