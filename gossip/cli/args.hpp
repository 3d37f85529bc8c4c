// What the commands share in reading their arguments: option parsing with --help, and the checks
// of input and output paths, each throwing UsageError with one line naming the option.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/path_overlap.hpp"

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

// A non-negative integer of at most 2^64 - 1 (Boost reads "-1" into an unsigned option as
// 2^64 - 1): throws UsageError "OPTION 'TEXT' must be a non-negative integer".
uint64_t parse_unsigned(const std::string& text, const std::string& option);

// `path` names an existing file, not a folder.
void require_input_file(const std::string& path, const std::string& option);

// `path` names a file that may be written: not a folder, in an existing folder, and new unless
// `overwrite`.
void require_output_file(const std::string& path, bool overwrite, const std::string& option);

// Writing `output` changes none of `inputs`: it is none of them (by inode: also through symlinks
// and hard links) and lies inside none of their folders. Checked before --overwrite is looked
// at, which never applies to an input.
void require_distinct_output(const kernels::NamedPath& output,
                             const std::vector<kernels::NamedPath>& inputs);

}  // namespace gg::gossip
