// The option registry: every setting of Config declared once, with its dotted key (also its INI
// `[section] key`), its field, the values it accepts and its help. The command-line and INI
// parser, the per-option checks, `--help` and `to_ini` are all generated from this one table;
// the defaults are Config's initialisers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "gossip/comm/names.hpp"
#include "gossip/config/config.hpp"

namespace gg::gossip {

// One end of a numeric range: a number, or the value of another option (data.resize >=
// data.crop); `open` excludes the end itself.
struct Bound {
  double value = 0;
  const char* key = nullptr;
  bool open = false;
};
// Numbers in [lo, hi]; a double must also be finite. An infinite hi means no upper end.
struct Range {
  Bound lo, hi;
};
// Strings: exactly one of these.
struct Choices {
  std::vector<std::string_view> values;
};
// Strings with a grammar: `check` throws UsageError naming `key` for a malformed value.
struct Grammar {
  void (*check)(const std::string& key, const std::string& value);
};
using Rule = std::variant<std::monostate, Range, Choices, Grammar>;

template <typename T>
using Field = T& (*)(Config&);
// A fixed-choice option's field, whatever its enum: read and written by the names of the enum's
// table (gossip/comm/names.hpp), which are also its choices.
struct EnumField {
  std::string_view (*get)(const Config&);
  bool (*set)(Config&, std::string_view);  // false: not one of the names
  std::string (*choices)();                // "a, b, c"
};
using AnyField = std::variant<Field<bool>, Field<int>, Field<int64_t>, Field<uint64_t>,
                              Field<double>, Field<std::string>, EnumField>;

struct Option {
  template <typename Get>
  Option(std::string_view key, Get get, Rule rule, std::string_view help)
      : key(key), field(field_of(get)), rule(std::move(rule)), help(help) {}
  std::string_view key;  // "section.name"
  AnyField field;
  Rule rule;
  std::string_view help;  // without the range, which --help adds from `rule`

  std::string_view section() const { return key.substr(0, key.find('.')); }
  std::string_view name() const { return key.substr(key.find('.') + 1); }

 private:
  template <typename Get>
  static AnyField field_of(Get get) {
    using T = std::remove_reference_t<decltype(get(std::declval<Config&>()))>;
    if constexpr (NamedEnum<T>) {
      return EnumField{[](const Config& c) { return name_of(Get{}(const_cast<Config&>(c))); },
                       [](Config& c, std::string_view v) {
                         const std::optional<T> e = find_name<T>(v);
                         if (e) Get{}(c) = *e;
                         return e.has_value();
                       },
                       [] { return names_text<T>(); }};
    } else {
      return +get;
    }
  }
};

// Every option, grouped by section, in the order of --help and of to_ini.
const std::vector<Option>& options();

// The option's value in c as INI text (booleans as true/false).
std::string value_text(const Option& o, const Config& c);

// What a Range allows, as errors and --help say it: "in [1, 64]", "in (0, 1]", ">= 0".
std::string range_text(const Range& r);

// Throws UsageError ("KEY = VALUE is out of range: must be in [1, 64]", "KEY = VALUE is
// unknown: use a, b, c", or the grammar's message) when c's value breaks the option's rule.
// Bounds named by another option are checked only with `cross`, so that every option's own
// range is reported before a rule that involves two of them.
void check_option(const Option& o, const Config& c, bool cross);

}  // namespace gg::gossip
