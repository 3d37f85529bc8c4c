// The one durable atomic write for every file the project keeps (weights, checkpoints, manifests,
// timelines): after a crash the file holds either its old bytes or all of the new ones.
#pragma once

#include <cstddef>
#include <string>

namespace gg::kernels {

// Writes the bytes to `path` + ".tmp-" + pid in the same folder, fsyncs that file, renames it over
// `path` and fsyncs the folder. On failure the temporary is removed, `path` keeps what it held,
// and a std::runtime_error "cannot write PATH: REASON" is thrown. (Only a failing fsync of the
// folder, after the rename, throws with the new bytes already in place.)
void write_file_durably(const std::string& path, const void* data, size_t size);
void write_file_durably(const std::string& path, const std::string& bytes);

}  // namespace gg::kernels
