#include "gossip/comm/exchange_options.hpp"

#include <stdexcept>

namespace gg::gossip {

Threading parse_threading(const std::string& name) {
  if (name == "funneled") return Threading::Funneled;
  if (name == "concurrent") return Threading::Concurrent;
  if (name == "chained") return Threading::Chained;
  throw std::invalid_argument("unknown threading '" + name +
                              "' (expected funneled, concurrent or chained)");
}

}  // namespace gg::gossip
