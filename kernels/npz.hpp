// NumPy .npy and .npz files: how weights (with torchvision's state_dict names), inference inputs
// and logits travel between gossipgrad and PyTorch. Reads what numpy.save, savez and
// savez_compressed write; writes files numpy.load reads.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/graph.hpp"

namespace gg::kernels {

// A file that cannot be read, is not a valid .npy/.npz, or cannot be written: the one-line message
// names the file (and the archive member) and the problem.
struct NpyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Element types as stored in a file: '<f4', '<f8' and '<i8'.
enum class NpyType { Float32, Float64, Int64 };
const char* npy_type_name(NpyType t);  // "float32", "float64", "int64"

// One array in C order. Float32 and float64 elements are held as float (float64 is converted
// on reading), int64 elements as int64; `type` records what the file held.
struct NpyArray {
  Dims shape;  // {} for a scalar
  NpyType type = NpyType::Float32;
  std::vector<float> f;    // Float32, Float64
  std::vector<int64_t> i;  // Int64

  static NpyArray floats(Dims shape, std::vector<float> data);
  static NpyArray int64s(Dims shape, std::vector<int64_t> data);
  bool is_float() const { return type != NpyType::Int64; }
  int64_t size() const { return numel(shape); }
};

// Named arrays of an .npz file in archive order; names carry no ".npy" suffix.
using NpzEntries = std::vector<std::pair<std::string, NpyArray>>;

// Reads a .npy file of format version 1, 2 or 3 (C order only).
NpyArray read_npy(const std::string& path);

// Reads an .npz file: a zip archive of .npy members, stored or deflated (or in any other method
// libarchive reads), with ZIP64 records where the archive needs them. Member CRC-32s are checked.
NpzEntries read_npz(const std::string& path);

// Writes a .npy file (float arrays as '<f4', int64 arrays as '<i8'). The file appears under
// `path` only once it is complete (write_file_durably).
void write_npy(const std::string& path, const NpyArray& a);

// Writes an .npz file with stored members, in the order given, built in memory and then written
// durably like write_npy.
// ZIP64 records are written where sizes or offsets need them, or always with `force_zip64`.
void write_npz(const std::string& path, const NpzEntries& arrays, bool force_zip64 = false);

// The array called `name`, or nullptr.
const NpyArray* find_array(const NpzEntries& arrays, const std::string& name);

}  // namespace gg::kernels
