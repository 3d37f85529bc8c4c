// Fixed-choice values and the names users write. Each enum has one table of {value, name}
// pairs, declared next to the enum and reached by `enum_names(E{})` (argument-dependent lookup:
// partners::Kind, kernels::Backend, shuffle::ShuffleMode, Wire, ...). These templates read any
// such table; the option registry (gossip/config/options.hpp) builds an option's choices, its
// parsing and its errors from the same table.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace gg::gossip {

template <typename E>
concept NamedEnum = std::is_enum_v<E> && requires {
  enum_names(E{});
};

template <NamedEnum E>
std::string_view name_of(E e) {
  for (const auto& [v, n] : enum_names(E{}))
    if (v == e) return n;
  return "?";
}

template <NamedEnum E>
std::optional<E> find_name(std::string_view name) {
  for (const auto& [v, n] : enum_names(E{}))
    if (n == name) return v;
  return std::nullopt;
}

template <NamedEnum E>
std::string text_of(E e) {
  return std::string(name_of(e));
}

// "a, b, c", or with last = " or ": "a, b or c".
template <NamedEnum E>
std::string names_text(std::string_view last = ", ") {
  const auto table = enum_names(E{});
  std::string s;
  for (size_t i = 0; i < table.size(); ++i)
    s.append(i == 0 ? "" : i + 1 == table.size() ? last : ", ").append(table[i].second);
  return s;
}

// The value named `name`; std::invalid_argument "unknown WHAT 'NAME' (expected a, b or c)".
template <NamedEnum E>
E parse_name(const std::string& name, const std::string& what) {
  if (const std::optional<E> e = find_name<E>(name)) return *e;
  throw std::invalid_argument("unknown " + what + " '" + name + "' (expected " +
                              names_text<E>(" or ") + ")");
}

}  // namespace gg::gossip

// In JSON (metrics, summaries, manifests) a named enum is its name, never its number.
template <gg::gossip::NamedEnum E>
struct nlohmann::adl_serializer<E> {
  template <typename Json>
  static void to_json(Json& j, E e) {
    j = std::string(gg::gossip::name_of(e));
  }
  template <typename Json>
  static void from_json(const Json& j, E& e) {
    e = gg::gossip::parse_name<E>(j.template get<std::string>(), "value");
  }
};
