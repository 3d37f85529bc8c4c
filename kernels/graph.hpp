// A network as a graph of layers, independent of any backend: shapes, parameter names and the
// layout of the one flat parameter buffer. Backends compile a Graph into an Executor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gg::kernels {

// Per-sample dimensions: {C, H, W} for images, {F} for feature vectors. The batch is added when
// a graph is compiled.
using Dims = std::vector<int64_t>;

int64_t numel(const Dims& d);
std::string to_string(const Dims& d);

// A per-sample tensor seen as {C, H, W}; feature vectors {F} are F channels of 1x1, which is how
// batch norm and the per-channel layers treat them.
struct Chw {
  int64_t c = 1, h = 1, w = 1;
  int64_t plane() const { return h * w; }
  int64_t size() const { return c * h * w; }
};
// Throws std::invalid_argument "<who>: unsupported dims [...]" for more than three dimensions.
Chw chw(const Dims& d, const char* who);

enum class Op {
  Input,
  Conv,
  BatchNorm,
  Relu,
  MaxPool,
  AvgPool,
  GlobalAvgPool,
  FullyConnected,
  Add,
  Concat,   // along channels
  Dropout,  // inverted dropout in training, identity in eval
  Lrn       // local response normalisation across channels
};
const char* op_name(Op op);

struct ConvAttr {
  int64_t out_channels = 0;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t pad = 1;
  bool bias = false;
};

struct PoolAttr {
  int64_t kernel = 2;
  int64_t stride = 2;
  int64_t pad = 0;
  // PyTorch's ceil_mode: the output size rounds up, but the last window must start inside the
  // input or its left padding. Max pool only.
  bool ceil_mode = false;
};

struct BatchNormAttr {
  float eps = 1e-5f;
  float momentum = 0.1f;  // running = (1 - momentum) * running + momentum * batch (PyTorch)
};

struct FcAttr {
  int64_t out_features = 0;
  bool bias = true;
};

struct DropoutAttr {
  float p = 0.5f;     // probability of zeroing an element in training, in [0, 1)
  uint64_t seed = 0;  // the masks are a pure function of (seed, node, training step, element)
};

// PyTorch's nn.LocalResponseNorm across channels, for odd sizes (where oneDNN's window is
// PyTorch's): y_c = x_c * (k + alpha / size * sum_{|c' - c| <= size/2} x_c'^2)^-beta, with
// channels outside [0, C) counting as zero.
struct LrnAttr {
  int64_t size = 5;
  float alpha = 1e-4f;
  float beta = 0.75f;
  float k = 1.f;
};

// Inverted dropout's multiplier for one element in the `step`-th training forward of an
// executor (counting from 0): 0 with probability p, else 1 / (1 - p). `index` runs over the batch
// in plain NCHW order. Every backend draws its masks from here, so they agree bit for bit.
float dropout_multiplier(const DropoutAttr& a, int node, uint64_t step, int64_t index);

// How a model initialises its conv and fully connected weights; torchvision differs per model.
enum class WeightInit {
  // Conv: Kaiming normal (fan_out, ReLU gain); linear: PyTorch's default uniform (ResNet).
  KaimingFanOut,
  // Conv and linear weights: N(0, 0.01) truncated to [-2, 2]; linear bias: PyTorch's default
  // (GoogLeNet).
  TruncatedNormal,
};

// One node produces one tensor; a node's id is the id of the tensor it produces.
struct Node {
  Op op = Op::Input;
  std::string name;
  std::vector<int> inputs;
  Dims out;  // per-sample output dims
  ConvAttr conv;
  PoolAttr pool;
  BatchNormAttr bn;
  FcAttr fc;
  DropoutAttr dropout;
  LrnAttr lrn;
  // Indices into Graph::params() / Graph::buffers() owned by this node, in declaration order:
  // conv {weight[, bias]}, batch norm {weight, bias} + buffers {running_mean, running_var},
  // fully connected {weight[, bias]}.
  std::vector<int> params;
  std::vector<int> buffers;
};

// A named slice of a flat buffer. Names follow torchvision's state_dict ("layer1.0.conv1.weight").
struct TensorSpec {
  std::string name;
  Dims dims;           // full dims, e.g. conv weight {O, I, kH, kW}, in PyTorch's (plain) layout
  int64_t offset = 0;  // in elements, into the flat buffer
  int node = -1;
  int64_t size() const { return numel(dims); }
};

class Graph {
 public:
  explicit Graph(Dims input);

  int input() const { return 0; }
  int conv(const std::string& name, int x, ConvAttr a);
  int batch_norm(const std::string& name, int x, BatchNormAttr a = {});
  // Layers without parameters take an optional name (for `gossipgrad info`); by default they are
  // named after their op and id.
  int relu(int x);
  int max_pool(int x, PoolAttr a, const std::string& name = {});
  int avg_pool(int x, PoolAttr a, const std::string& name = {});  // counts padding in the divisor
  int global_avg_pool(int x, const std::string& name = {});
  int fully_connected(const std::string& name, int x, FcAttr a);  // flattens {C,H,W} inputs
  int add(int a, int b);
  int concat(const std::vector<int>& xs, const std::string& name = {});  // {C,H,W}, same H, W
  int dropout(int x, DropoutAttr a, const std::string& name = {});
  int lrn(int x, LrnAttr a, const std::string& name = {});  // {C,H,W} inputs, odd sizes
  void set_output(int x);
  void set_weight_init(WeightInit w) { weight_init_ = w; }

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int id) const { return nodes_.at(id); }
  int output() const { return output_; }
  const Dims& input_dims() const { return nodes_.front().out; }
  int64_t classes() const;  // numel of the output tensor

  // Learnable parameters, laid out in node (forward) order in one flat buffer.
  const std::vector<TensorSpec>& params() const { return params_; }
  int64_t param_count() const { return param_count_; }
  // Non-learnable state (batch norm running statistics), in a second flat buffer.
  const std::vector<TensorSpec>& buffers() const { return buffers_; }
  int64_t buffer_count() const { return buffer_count_; }

  WeightInit weight_init() const { return weight_init_; }

  // The counts below are exact; one that exceeds 2^63 throws std::overflow_error (as adding a
  // parameter tensor or shaping a tensor of more than 2^63 elements does), never wraps.
  // Forward multiply-accumulates per sample of convolutions and FC layers.
  int64_t forward_macs() const;
  // The same without the taps that fall on a convolution's zero padding: the multiply-adds a
  // kernel that skips padding cannot avoid, the work a bound on step time must count.
  int64_t forward_useful_macs() const;
  // A training step's useful multiply-adds per sample: forward, backward-weights and
  // backward-data of every convolution and FC layer, but no backward-data where the layer reads
  // the graph's input (nothing needs that gradient).
  int64_t training_useful_macs() const;
  // Forward FLOPs per sample of one node, as inference runs it; a multiply-add counts as 2.
  // conv / fully connected: 2 * fan-in per output (+1 with bias); batch norm: 2 per element (scale
  // and shift, statistics folded); relu, add: 1 per element; max/avg pool: kernel^2 per output;
  // global avg pool: H*W per output; LRN: 2 * size + 3 per element; input, concat, dropout: 0.
  int64_t flops(int id) const;
  int64_t forward_flops() const;  // sum over the nodes

 private:
  int push(Node n);
  int add_param(int node, const std::string& name, Dims dims);
  int add_buffer(int node, const std::string& name, Dims dims);
  const Node& checked(int x) const;
  int64_t useful_macs(const Node& n) const;  // forward, padding taps left out

  std::vector<Node> nodes_;
  std::vector<TensorSpec> params_;
  std::vector<TensorSpec> buffers_;
  int64_t param_count_ = 0;
  int64_t buffer_count_ = 0;
  int output_ = -1;
  WeightInit weight_init_ = WeightInit::KaimingFanOut;
};

// A contiguous range [begin, end) of the flat gradient buffer. Buckets are numbered in the order
// backward completes them: bucket 0 holds the last layers' gradients.
struct Bucket {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Groups parameters into buckets of at least `bucket_elements` (a parameter is never split),
// walking backward from the output. Every parameter lands in exactly one bucket.
std::vector<Bucket> make_buckets(const Graph& g, int64_t bucket_elements);

}  // namespace gg::kernels
