// What a mixing rule (rules.hpp) or a wire codec (wire.hpp) keeps from step to step beside the
// buffer it mixes, saved in a rank's state (gossip/resilience/rank_state.hpp) as bytes that only
// its owner reads. The rank state, the trainer and the exchange engine carry parts without knowing
// what is in them: an algorithm with a state of its own adds a part kind, not a field.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace gg::gossip {

struct StatePart {
  std::string exchange;  // which of the rank's exchanges it belongs to (the trainer names them)
  std::string kind;      // its owner's format: a rule or a codec reads back only its own kind
  uint32_t version = 1;  // of that format
  std::vector<uint8_t> bytes;
};

// How a part's values leave the buffer's layout for the plain one that files, other ranks and
// other CPUs read (the trainer's: kernels::Net::plain), and come back. Unset: the identity.
struct StateLayout {
  std::function<std::vector<float>(const float*, int64_t)> to_plain;
  std::function<std::vector<float>(const std::vector<float>&)> from_plain;
  std::vector<float> plain(const std::vector<float>& v) const {
    return to_plain ? to_plain(v.data(), static_cast<int64_t>(v.size())) : v;
  }
  std::vector<float> own(const std::vector<float>& v) const {
    return from_plain ? from_plain(v) : v;
  }
};

// The part of `kind` among `parts` (nullptr: none). Throws std::runtime_error naming it when it
// was written in a format newer than `newest` (by a later gossipgrad).
const StatePart* find_part(std::span<const StatePart> parts, std::string_view kind,
                           uint32_t newest);

// A part that is one array of floats, and back (std::runtime_error naming it: malformed).
StatePart floats_part(std::string kind, uint32_t version, const std::vector<float>& values);
std::vector<float> read_floats(const StatePart& p);

// A part's bytes: little-endian, the host's float format.
class PartWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
  }
  template <typename T>
  void array(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    bytes_.insert(bytes_.end(), p, p + v.size() * sizeof(T));
  }
  StatePart part(std::string kind, uint32_t version) {
    return {{}, std::move(kind), version, std::move(bytes_)};
  }

 private:
  std::vector<uint8_t> bytes_;
};

// Bounds-checked reading of such bytes: fail() (which throws, naming what is read) for anything
// truncated, malformed or left over (end()).
class ByteReader {
 public:
  ByteReader(const uint8_t* at, size_t size) : at_(at), left_(size) {}
  virtual ~ByteReader() = default;
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  template <typename T>
  std::vector<T> get_array() {
    const auto n = get<uint64_t>();
    if (n > left_ / sizeof(T)) fail();
    std::vector<T> v(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v.data(), take(static_cast<size_t>(n) * sizeof(T)), n * sizeof(T));
    return v;
  }
  // The next n bytes, passed over.
  const uint8_t* take(size_t n) {
    if (n > left_) fail();
    const uint8_t* p = at_;
    at_ += n;
    left_ -= n;
    return p;
  }
  size_t left() const { return left_; }
  void end() const {
    if (left_ != 0) fail();
  }
  [[noreturn]] virtual void fail() const = 0;

 private:
  const uint8_t* at_;
  size_t left_;
};

// A part's bytes; fail() names the part.
class PartReader : public ByteReader {
 public:
  explicit PartReader(const StatePart& p) : ByteReader(p.bytes.data(), p.bytes.size()), p_(p) {}
  [[noreturn]] void fail() const override;

 private:
  const StatePart& p_;
};

}  // namespace gg::gossip
