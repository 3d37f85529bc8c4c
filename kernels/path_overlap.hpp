// Whether writing one path can change another: the check every command runs before it writes an
// output, against each of its inputs and each of its other outputs (issue 31: outputs written over
// inputs). One helper, so that symlinks, hard links and folders are handled alike everywhere.
#pragma once

#include <string>

namespace gg::kernels {

// A path as the user named it: `name` is the option or key ("--input", "train.init_from").
struct NamedPath {
  std::string name;
  std::string path;
};

// "--input x.npy" for options, "train.init_from = x.npz" for config keys.
std::string shown(const NamedPath& p);

// Empty when writing `output` leaves `other` as it was; else one line saying why not: the two
// name one file or folder (also through symlinks and hard links, for paths that exist; by their
// resolved names otherwise), or `output` lies inside the folder `other`.
std::string output_overlap(const NamedPath& output, const NamedPath& other);

// Whether `path` lies inside the folder `folder` (resolved through symlinks; not the folder
// itself).
bool lies_inside(const std::string& path, const std::string& folder);

}  // namespace gg::kernels
