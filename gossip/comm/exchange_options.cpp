#include "gossip/comm/exchange_options.hpp"

#include <stdexcept>

namespace gg::gossip {

Threading parse_threading(const std::string& name) {
  return parse_name<Threading>(name, "threading");
}

TransportKind parse_transport(const std::string& name) {
  return parse_name<TransportKind>(name, "transport");
}

}  // namespace gg::gossip
