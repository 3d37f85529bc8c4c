// What the commands share in reading their arguments: option parsing with --help, and the checks
// of input and output paths, each throwing UsageError with one line naming the option.
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace gg::gossip {

// Whether an unambiguous prefix may stand for an option (`--ran 4` for `--ranks 4`): info,
// partners and pack have always taken them, export and infer refuse them.
enum class Prefixes { kTaken, kRefused };

// Parses a command's options into `vm`. Returns false after printing `usage`, a blank line and
// the options for --help.
bool parse_options(const std::vector<std::string>& args,
                   const boost::program_options::options_description& d, const std::string& usage,
                   boost::program_options::variables_map& vm,
                   Prefixes prefixes = Prefixes::kRefused);

// `path` names an existing file, not a folder.
void require_input_file(const std::string& path, const std::string& option);

// `path` names a file that may be written: not a folder, in an existing folder, and new unless
// `overwrite`.
void require_output_file(const std::string& path, bool overwrite, const std::string& option);

}  // namespace gg::gossip
