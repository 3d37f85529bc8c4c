#include "kernels/path_overlap.hpp"

#include <filesystem>

namespace gg::kernels {

namespace fs = std::filesystem;

namespace {

// The absolute path with every symlink of its existing part resolved, without a trailing '/'.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal();
  fs::path r = fs::weakly_canonical(p, ec);
  if (ec) r = p.lexically_normal();
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

// One file or folder: the same inode for paths that exist (hard links, symlinks, bind mounts),
// the same resolved name otherwise.
bool same_entry(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) {
    const bool same = fs::equivalent(a, b, ec);
    if (!ec) return same;
  }
  return resolved(a) == resolved(b);
}

}  // namespace

std::string shown(const NamedPath& p) {
  return p.name.starts_with("--") ? p.name + " " + p.path : p.name + " = " + p.path;
}

bool lies_inside(const std::string& path, const std::string& folder) {
  std::error_code ec;
  const bool folder_exists = fs::is_directory(folder, ec);
  const fs::path target = resolved(folder);
  fs::path p = resolved(path);
  while (p.has_parent_path() && p.parent_path() != p) {
    p = p.parent_path();
    if (p == target) return true;
    if (folder_exists && fs::exists(p, ec) && fs::equivalent(p, folder, ec) && !ec) return true;
  }
  return false;
}

std::string output_overlap(const NamedPath& output, const NamedPath& other) {
  if (output.path.empty() || other.path.empty()) return {};
  std::error_code ec;
  if (same_entry(output.path, other.path)) {
    const bool folder = fs::is_directory(other.path, ec);
    return shown(output) + " is the same " + (folder ? "folder" : "file") + " as " + shown(other) +
           ", which it would " + (folder ? "change" : "overwrite") + ": choose another path for " +
           output.name;
  }
  if (lies_inside(output.path, other.path))
    return shown(output) + " lies inside " + shown(other) +
           ", which it would change: choose a path outside it for " + output.name;
  return {};
}

}  // namespace gg::kernels
