#include "kernels/weights.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <utility>

#include "kernels/tensor.hpp"

namespace gg::kernels {
namespace {

constexpr const char* kTracked = ".num_batches_tracked";

struct Slot {
  const TensorSpec* spec;
  float* flat;
};

}  // namespace

NpzEntries export_weights(const Graph& g, const std::vector<float>& params,
                          const std::vector<float>& buffers, int64_t batches_tracked) {
  if (static_cast<int64_t>(params.size()) != g.param_count() ||
      static_cast<int64_t>(buffers.size()) != g.buffer_count())
    throw std::invalid_argument("export_weights: buffers do not match the graph");
  NpzEntries out;
  const auto slice = [](const TensorSpec& t, const std::vector<float>& flat) {
    return NpyArray::floats(
        t.dims, std::vector<float>(flat.begin() + t.offset, flat.begin() + t.offset + t.size()));
  };
  for (const Node& n : g.nodes()) {
    for (int p : n.params) out.emplace_back(g.params()[p].name, slice(g.params()[p], params));
    for (int b : n.buffers) out.emplace_back(g.buffers()[b].name, slice(g.buffers()[b], buffers));
    if (n.op == Op::BatchNorm)
      out.emplace_back(n.name + kTracked, NpyArray::int64s({}, {batches_tracked}));
  }
  return out;
}

NpzEntries export_weights(const Graph& g, const ParamStore& s, int64_t batches_tracked) {
  return export_weights(g, s.params, s.buffers, batches_tracked);
}

void import_weights(const Graph& g, ParamStore& s, const NpzEntries& arrays,
                    const std::string& source) {
  std::vector<Slot> expected;  // in state_dict order, so "first" means what a user expects
  for (const Node& n : g.nodes()) {
    for (int p : n.params) expected.push_back({&g.params()[p], s.params.data()});
    for (int b : n.buffers) expected.push_back({&g.buffers()[b], s.buffers.data()});
  }

  // Check everything first, so that a failed import leaves the store as it was.
  std::vector<std::pair<const Slot*, const NpyArray*>> copies;
  std::set<std::string> known;
  int64_t missing = 0;
  std::string first_missing;
  for (const Slot& slot : expected) {
    const std::string& name = slot.spec->name;
    known.insert(name);
    const NpyArray* a = find_array(arrays, name);
    if (!a) {
      if (missing++ == 0) first_missing = name;
      continue;
    }
    if (a->shape != slot.spec->dims)
      throw std::invalid_argument(source + ": '" + name + "' has shape " + to_string(a->shape) +
                                  ", the model expects " + to_string(slot.spec->dims));
    if (!a->is_float())
      throw std::invalid_argument(source + ": '" + name + "' has dtype " + npy_type_name(a->type) +
                                  ", the model expects float32");
    copies.emplace_back(&slot, a);
  }
  if (missing > 0)
    throw std::invalid_argument(
        source + ": '" + first_missing + "' is missing" +
        (missing > 1 ? " (and " + std::to_string(missing - 1) + " more names the model expects)"
                     : "") +
        "; is it the right model and width?");
  for (const auto& [name, a] : arrays)
    if (!known.count(name) && !name.ends_with(kTracked))
      throw std::invalid_argument(source + ": '" + name + "' is not a tensor of this model");
  for (const auto& [slot, a] : copies)
    std::copy(a->f.begin(), a->f.end(), slot->flat + slot->spec->offset);
}

void save_weights(const std::string& path, const Graph& g, const std::vector<float>& params,
                  const std::vector<float>& buffers, int64_t batches_tracked) {
  for (const auto& [specs, flat] : {std::pair{&g.params(), &params}, {&g.buffers(), &buffers}})
    for (const TensorSpec& t : *specs) {
      if (!all_finite(flat->data() + t.offset, t.size()))
        throw std::runtime_error(path + ": not written: " + t.name +
                                 " holds NaN or inf (the model diverged)");
    }
  write_npz(path, export_weights(g, params, buffers, batches_tracked));
}

void load_weights(const std::string& path, const Graph& g, ParamStore& s) {
  import_weights(g, s, read_npz(path), path);
}

}  // namespace gg::kernels
