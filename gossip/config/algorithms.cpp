#include "gossip/config/algorithms.hpp"

#include <stdexcept>

namespace gg::gossip {

const std::vector<Algorithm>& algorithms() {
  // clang-format off
  static const std::vector<Algorithm> all = {
    //  name   help                                                 allreduce grads weights momentum
    {"grad", "average gradients with this step's partner",           false, true,  false, false},
    {"model", "average weights with it after the update",            false, false, true,  false},
    {"both", "the two",                                              false, true,  true,  false},
    {"gossipgrad", "weights and SGD momentum averaged with it after the update, as the "
                   "GossipGraD authors' code does (w and v both mixed)", false, false, true, true},
    {"allreduce", "exact average of the gradients over all ranks (the baseline)",
                                                                     true,  false, false, false},
  };
  // clang-format on
  return all;
}

const Algorithm& find_algorithm(const std::string& name) {
  std::string names;
  for (const Algorithm& a : algorithms()) {
    if (a.name == name) return a;
    names += (names.empty() ? "" : ", ") + std::string(a.name);
  }
  throw std::invalid_argument("unknown gossip algorithm '" + name + "' (expected " + names + ")");
}

std::string modes_that(bool Algorithm::*what) {
  std::vector<std::string_view> names;
  for (const Algorithm& a : algorithms())
    if (a.*what) names.push_back(a.name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s.append(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ").append(names[i]);
  return s;
}

double buffers_per_step(const Algorithm& a, int64_t model_every) {
  const double after_update = (a.weights ? 1.0 : 0.0) + (a.momentum ? 1.0 : 0.0);
  return (a.grads ? 1.0 : 0.0) + after_update / static_cast<double>(model_every);
}

}  // namespace gg::gossip
