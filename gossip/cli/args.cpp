#include "gossip/cli/args.hpp"

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "gossip/config/config.hpp"

namespace gg::gossip {

namespace fs = std::filesystem;
namespace po = boost::program_options;

bool parse_options(const std::vector<std::string>& args, const po::options_description& d,
                   const std::string& usage, po::variables_map& vm, Prefixes prefixes) {
  int style = po::command_line_style::unix_style;
  if (prefixes == Prefixes::kRefused) style &= ~po::command_line_style::allow_guessing;
  try {
    po::store(po::command_line_parser(args).options(d).style(style).run(), vm);
    if (vm.count("help")) {
      std::cout << usage << "\n\n" << d;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(e.what());
  }
  return true;
}

uint64_t parse_unsigned(const std::string& text, const std::string& option) {
  try {
    size_t used = 0;
    if (text.empty() || text[0] < '0' || text[0] > '9') throw std::invalid_argument(text);
    const uint64_t v = std::stoull(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    throw UsageError(option + " '" + text + "' must be a non-negative integer below 2^64");
  }
}

void require_input_file(const std::string& path, const std::string& option) {
  if (!fs::exists(path)) throw UsageError(option + " " + path + " does not exist");
  if (fs::is_directory(path)) throw UsageError(option + " " + path + " is a folder, not a file");
}

void require_output_file(const std::string& path, bool overwrite, const std::string& option) {
  if (path.empty()) throw UsageError(option + " must name a file");
  if (fs::is_directory(path)) throw UsageError(option + " " + path + " is a folder");
  if (fs::exists(path) && !overwrite)
    throw UsageError(option + " " + path +
                     " already exists: choose a new path or pass --overwrite");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent))
    throw UsageError(option + " " + path + ": the folder " + parent.string() + " does not exist");
}

void require_distinct_output(const kernels::NamedPath& output,
                             const std::vector<kernels::NamedPath>& inputs) {
  for (const kernels::NamedPath& in : inputs)
    if (const std::string why = kernels::output_overlap(output, in); !why.empty())
      throw UsageError(why);
}

}  // namespace gg::gossip
