// .npy: a magic string, a version, a Python dict literal header ({'descr': '<f4',
// 'fortran_order': False, 'shape': (2, 3), }) padded to 64 bytes, then the raw C-order data.
// .npz: a zip archive of .npy members. Everything is read through bounded, checked reads so a
// malformed file ends in an NpyError naming the file and the problem, never in a crash or an
// allocation sized by a corrupt header.
#include "kernels/npz.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string_view>

namespace gg::kernels {

static_assert(std::endian::native == std::endian::little,
              "npy data are read and written in the host's byte order, assumed little-endian");

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMax16 = 0xFFFF;
constexpr uint64_t kMax32 = 0xFFFFFFFF;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50;
constexpr uint32_t kLocator64Sig = 0x07064b50;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01: reproducible archives
// Deflate cannot expand data by more than about 1032:1; a larger claimed ratio is corruption.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t le64(const unsigned char* p) { return le32(p) | uint64_t{le32(p + 4)} << 32; }

uint32_t crc_update(uint32_t crc, const void* data, uint64_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, uint64_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

// Random access reads from one file; every failure names the file.
class InFile {
 public:
  explicit InFile(const std::string& path) : path_(path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) throw NpyError(path + ": no such file");
    if (fs::is_directory(st)) throw NpyError(path + ": is a folder, not a file");
    in_.open(path, std::ios::binary);
    if (!in_) throw NpyError(path + ": cannot be opened for reading");
    size_ = fs::file_size(path, ec);
    if (ec) throw NpyError(path + ": cannot read its size (" + ec.message() + ")");
  }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  void read_at(uint64_t offset, void* dst, uint64_t n, const std::string& what) {
    if (offset > size_ || n > size_ - offset)
      throw NpyError(what + " lies beyond the end of the file (truncated?)");
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_ || static_cast<uint64_t>(in_.gcount()) != n)
      throw NpyError(what + ": read error at offset " + std::to_string(offset));
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

// The bytes of one .npy stream, read front to back: a whole file, a stored zip member or an
// inflated one. Keeps the CRC-32 of what it handed out.
class Source {
 public:
  explicit Source(std::string where) : where_(std::move(where)) {}
  virtual ~Source() = default;
  const std::string& where() const { return where_; }
  uint64_t remaining() const { return size_ - done_; }
  uint32_t crc() const { return crc_; }

  // Exactly n bytes, or an NpyError.
  void read(void* dst, uint64_t n) {
    if (n > remaining())
      throw NpyError(where_ + ": truncated (needs " + std::to_string(n) + " more bytes, holds " +
                     std::to_string(remaining()) + ")");
    fill(dst, n);
    crc_ = crc_update(crc_, dst, n);
    done_ += n;
  }

 protected:
  virtual void fill(void* dst, uint64_t n) = 0;
  std::string where_;
  uint64_t size_ = 0;  // bytes of the (uncompressed) stream
  uint64_t done_ = 0;

 private:
  uint32_t crc_ = 0;
};

class RangeSource : public Source {
 public:
  RangeSource(InFile& f, uint64_t offset, uint64_t length, std::string where)
      : Source(std::move(where)), f_(f), offset_(offset) {
    size_ = length;
  }

 private:
  void fill(void* dst, uint64_t n) override { f_.read_at(offset_ + done_, dst, n, where_); }
  InFile& f_;
  uint64_t offset_;
};

class InflateSource : public Source {
 public:
  InflateSource(InFile& f, uint64_t offset, uint64_t compressed, uint64_t size, std::string where)
      : Source(std::move(where)), f_(f), offset_(offset), compressed_(compressed), in_(1 << 16) {
    size_ = size;
    if (inflateInit2(&z_, -MAX_WBITS) != Z_OK)
      throw NpyError(where_ + ": zlib cannot start inflating");
  }
  ~InflateSource() override { inflateEnd(&z_); }
  InflateSource(const InflateSource&) = delete;
  InflateSource& operator=(const InflateSource&) = delete;

  // After the last byte: the deflate stream must end here, with no data left over.
  void expect_end() {
    unsigned char extra = 0;
    if (!ended_) {
      z_.next_out = &extra;
      z_.avail_out = 1;
      while (!ended_ && z_.avail_out == 1) step();
      if (z_.avail_out == 0)
        throw NpyError(where_ + ": inflates to more bytes than its recorded size " +
                       std::to_string(size_));
    }
  }

 private:
  void fill(void* dst, uint64_t n) override {
    auto* out = static_cast<unsigned char*>(dst);
    while (n > 0) {
      const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, uint64_t{1} << 30));
      z_.next_out = out;
      z_.avail_out = chunk;
      while (z_.avail_out > 0) {
        if (ended_)
          throw NpyError(where_ + ": deflate data ends before the recorded size " +
                         std::to_string(size_));
        step();
      }
      out += chunk;
      n -= chunk;
    }
  }

  // One inflate call, refilling the input first when it ran dry.
  void step() {
    if (z_.avail_in == 0 && read_ < compressed_) {
      const uint64_t n = std::min<uint64_t>(in_.size(), compressed_ - read_);
      f_.read_at(offset_ + read_, in_.data(), n, where_);
      read_ += n;
      z_.next_in = in_.data();
      z_.avail_in = static_cast<uInt>(n);
    }
    const int rc = inflate(&z_, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      ended_ = true;
    } else if (rc == Z_BUF_ERROR && z_.avail_in == 0 && read_ == compressed_) {
      throw NpyError(where_ + ": compressed data truncated");
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      throw NpyError(where_ + ": corrupt deflate data (zlib: " +
                     std::string(z_.msg ? z_.msg : "error " + std::to_string(rc)) + ")");
    }
  }

  InFile& f_;
  uint64_t offset_, compressed_, read_ = 0;
  std::vector<unsigned char> in_;
  z_stream z_{};
  bool ended_ = false;
};

// ---- .npy header ----

struct NpyHeader {
  NpyType type = NpyType::Float32;
  Dims shape;
};

// The header is a Python literal: {'key': value, ...} with string, bool and int-tuple values.
class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& where) : s_(s), where_(where) {}

  NpyHeader parse() {
    std::string descr;
    bool fortran = false;
    NpyHeader h;
    std::set<std::string> seen;
    ws();
    expect('{');
    while (true) {
      ws();
      if (peek() == '}') break;
      const std::string key = string();
      if (!seen.insert(key).second) fail("key '" + key + "' appears twice");
      ws();
      expect(':');
      ws();
      if (key == "descr")
        descr = string();
      else if (key == "fortran_order")
        fortran = boolean();
      else if (key == "shape")
        h.shape = tuple();
      else
        fail("unexpected key '" + key + "'");
      ws();
      if (peek() == ',')
        ++i_;
      else if (peek() != '}')
        fail("expected ',' or '}' at offset " + std::to_string(i_));
    }
    expect('}');
    ws();
    if (i_ != s_.size()) fail("unexpected text after the dictionary");
    for (const char* k : {"descr", "fortran_order", "shape"})
      if (!seen.count(k)) fail(std::string("lacks the key '") + k + "'");
    if (fortran)
      fail(
          "fortran_order True is not supported (save a C-ordered array, e.g. "
          "np.ascontiguousarray)");
    if (descr == "<f4")
      h.type = NpyType::Float32;
    else if (descr == "<f8")
      h.type = NpyType::Float64;
    else if (descr == "<i8")
      h.type = NpyType::Int64;
    else
      fail("dtype '" + descr +
           "' is not supported (use float32 '<f4', float64 '<f8' or int64 '<i8')");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw NpyError(where_ + ": .npy header: " + what);
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "' at offset " + std::to_string(i_));
    ++i_;
  }
  std::string string() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string at offset " + std::to_string(i_));
    const size_t end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False at offset " + std::to_string(i_));
  }
  Dims tuple() {
    Dims d;
    expect('(');
    while (true) {
      ws();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("shape must be a tuple of non-negative integers");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (int64_t{1} << 50)) fail("shape dimension too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 longs
      d.push_back(v);
      ws();
      if (peek() == ',')
        ++i_;
      else if (peek() != ')')
        fail("expected ',' or ')' in the shape");
    }
    expect(')');
    if (d.size() > 32) fail("shape has more than 32 dimensions");
    return d;
  }

  std::string_view s_;
  const std::string& where_;
  size_t i_ = 0;
};

uint64_t item_size(NpyType t) { return t == NpyType::Float32 ? 4 : 8; }

NpyArray read_array(Source& src) {
  const std::string& where = src.where();
  if (src.remaining() < 10)
    throw NpyError(where + ": too short to be a .npy array (" + std::to_string(src.remaining()) +
                   " bytes)");
  unsigned char pre[8];
  src.read(pre, 8);
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0)
    throw NpyError(where + ": not a .npy array (the magic string \\x93NUMPY is missing)");
  const int major = pre[6], minor = pre[7];
  if (major < 1 || major > 3)
    throw NpyError(where + ": .npy format version " + std::to_string(major) + "." +
                   std::to_string(minor) + " is not supported (1.0, 2.0 and 3.0 are)");
  unsigned char len[4] = {0, 0, 0, 0};
  src.read(len, major == 1 ? 2 : 4);
  const uint64_t header_len = major == 1 ? le16(len) : le32(len);
  if (header_len > kMaxHeaderBytes)
    throw NpyError(where + ": .npy header claims " + std::to_string(header_len) +
                   " bytes (corrupt)");
  std::string text(header_len, '\0');
  src.read(text.data(), header_len);
  const NpyHeader h = HeaderParser(text, where).parse();

  uint64_t count = 1;
  for (int64_t d : h.shape)
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count) || count > (1ull << 60))
      throw NpyError(where + ": shape " + to_string(h.shape) + " is too large");
  const uint64_t bytes = count * item_size(h.type);
  if (src.remaining() != bytes)
    throw NpyError(where + ": shape " + to_string(h.shape) + " of " + npy_type_name(h.type) +
                   " needs " + std::to_string(bytes) + " data bytes, " +
                   (src.remaining() < bytes ? "only " : "but ") + std::to_string(src.remaining()) +
                   " follow the header" + (src.remaining() < bytes ? " (truncated)" : ""));
  NpyArray a;
  a.shape = h.shape;
  a.type = h.type;
  if (h.type == NpyType::Float32) {
    a.f.resize(count);
    src.read(a.f.data(), bytes);
  } else if (h.type == NpyType::Int64) {
    a.i.resize(count);
    src.read(a.i.data(), bytes);
  } else {
    a.f.resize(count);
    std::vector<double> chunk(std::min<uint64_t>(count, 1 << 16));
    for (uint64_t at = 0; at < count; at += chunk.size()) {
      const uint64_t n = std::min<uint64_t>(chunk.size(), count - at);
      src.read(chunk.data(), n * 8);
      for (uint64_t k = 0; k < n; ++k) a.f[at + k] = static_cast<float>(chunk[k]);
    }
  }
  return a;
}

// ---- zip ----

struct Member {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0;
  uint64_t size = 0;
  uint64_t local_offset = 0;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t end = 0;  // where the central directory must end: the first end record
};

Directory find_directory(InFile& f) {
  const std::string& path = f.path();
  const std::string not_zip = path + ": not a zip archive (no end-of-central-directory record)";
  if (f.size() < 22) throw NpyError(not_zip);
  const uint64_t tail_len = std::min<uint64_t>(f.size(), 22 + kMax16);
  std::vector<unsigned char> tail(tail_len);
  f.read_at(f.size() - tail_len, tail.data(), tail_len, path + ": end of the archive");
  int64_t at = -1;
  for (int64_t i = static_cast<int64_t>(tail_len) - 22; i >= 0; --i)
    if (le32(&tail[i]) == kEndSig &&
        i + 22 + le16(&tail[i + 20]) <= static_cast<int64_t>(tail_len)) {
      at = i;
      break;
    }
  if (at < 0) throw NpyError(not_zip);
  const unsigned char* e = &tail[at];
  Directory d;
  uint64_t disk = le16(e + 4), cd_disk = le16(e + 6);
  d.entries = le16(e + 10);
  d.size = le32(e + 12);
  d.offset = le32(e + 16);
  d.end = f.size() - tail_len + at;
  if (d.end >= 20) {
    unsigned char loc[20];
    f.read_at(d.end - 20, loc, 20, path + ": ZIP64 locator");
    if (le32(loc) == kLocator64Sig) {
      const uint64_t rec_at = le64(loc + 8);
      if (rec_at > d.end - 20 || d.end - 20 - rec_at < 56)
        throw NpyError(path + ": corrupt zip archive (ZIP64 end record offset " +
                       std::to_string(rec_at) + " out of range)");
      unsigned char rec[56];
      f.read_at(rec_at, rec, 56, path + ": ZIP64 end record");
      if (le32(rec) != kEnd64Sig)
        throw NpyError(path + ": corrupt zip archive (no ZIP64 end record where the locator says)");
      disk = le32(rec + 16);
      cd_disk = le32(rec + 20);
      d.entries = le64(rec + 32);
      d.size = le64(rec + 40);
      d.offset = le64(rec + 48);
      d.end = rec_at;
    }
  }
  if (disk != 0 || cd_disk != 0)
    throw NpyError(path + ": multi-volume zip archives are not supported");
  if (d.offset > d.end || d.size > d.end - d.offset)
    throw NpyError(path + ": corrupt or truncated zip archive (central directory at " +
                   std::to_string(d.offset) + "+" + std::to_string(d.size) +
                   " lies outside the file)");
  if (d.entries > d.size / 46)
    throw NpyError(path + ": corrupt zip archive (" + std::to_string(d.entries) +
                   " entries cannot fit in a central directory of " + std::to_string(d.size) +
                   " bytes)");
  return d;
}

std::vector<Member> read_directory(InFile& f, const Directory& d) {
  const std::string& path = f.path();
  std::vector<unsigned char> cd(d.size);
  f.read_at(d.offset, cd.data(), d.size, path + ": central directory");
  std::vector<Member> members;
  uint64_t pos = 0;
  for (uint64_t k = 0; k < d.entries; ++k) {
    const std::string bad =
        path + ": corrupt zip central directory (entry " + std::to_string(k) + ")";
    if (d.size - pos < 46 || le32(&cd[pos]) != kCentralSig) throw NpyError(bad);
    const unsigned char* p = &cd[pos];
    Member m;
    m.flags = le16(p + 8);
    m.method = le16(p + 10);
    m.crc = le32(p + 16);
    m.compressed = le32(p + 20);
    m.size = le32(p + 24);
    const uint64_t name_len = le16(p + 28), extra_len = le16(p + 30), comment_len = le16(p + 32);
    const uint64_t disk = le16(p + 34);
    m.local_offset = le32(p + 42);
    if (d.size - pos - 46 < name_len + extra_len + comment_len) throw NpyError(bad);
    m.name.assign(reinterpret_cast<const char*>(p + 46), name_len);
    // ZIP64 extended information: the 8-byte values of the fields saturated above, in order.
    const unsigned char* x = p + 46 + name_len;
    for (uint64_t xi = 0; xi + 4 <= extra_len;) {
      const uint16_t id = le16(x + xi), len = le16(x + xi + 2);
      if (xi + 4 + len > extra_len) throw NpyError(bad + ": extra field overruns the entry");
      if (id == 1) {
        const unsigned char* v = x + xi + 4;
        uint64_t used = 0;
        for (uint64_t* field : {&m.size, &m.compressed, &m.local_offset}) {
          if (*field != kMax32) continue;
          if (used + 8 > len) throw NpyError(bad + ": short ZIP64 extra field");
          *field = le64(v + used);
          used += 8;
        }
      }
      xi += 4 + len;
    }
    if (disk != 0 && disk != kMax16)
      throw NpyError(path + ": multi-volume zip archives are not supported");
    members.push_back(std::move(m));
    pos += 46 + name_len + extra_len + comment_len;
  }
  return members;
}

// ---- writing ----

class Bytes {
 public:
  void u16(uint64_t v) { put(v, 2); }
  void u32(uint64_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void str(const std::string& s) { b_ += s; }
  const std::string& data() const { return b_; }

 private:
  void put(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) b_ += static_cast<char>((v >> (8 * k)) & 0xFF);
  }
  std::string b_;
};

// A file that appears under its name only when complete: written to a temporary name in the
// same folder, flushed to disk, then renamed over the target.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path)
      : path_(path), tmp_(path + ".tmp-" + std::to_string(::getpid())) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw NpyError("cannot write " + path + ": it is a folder");
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) fail("cannot create it");
  }
  ~AtomicFile() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  uint64_t pos() const { return pos_; }
  void write(const void* p, uint64_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) fail("write failed");
    pos_ += n;
  }
  void write(const std::string& s) { write(s.data(), s.size()); }

  void commit() {
    if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0) fail("flush failed");
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) {
      std::remove(tmp_.c_str());
      fail("close failed");
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      std::remove(tmp_.c_str());
      throw NpyError("cannot write " + path_ + ": rename failed (" + std::strerror(err) + ")");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    const int err = errno;
    throw NpyError("cannot write " + path_ + ": " + what + " (" + std::strerror(err) + ")");
  }
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint64_t pos_ = 0;
};

void check_array(const NpyArray& a, const std::string& what) {
  const uint64_t held = a.is_float() ? a.f.size() : a.i.size();
  for (int64_t d : a.shape)
    if (d < 0) throw std::invalid_argument(what + ": negative dimension in " + to_string(a.shape));
  if (held != static_cast<uint64_t>(a.size()))
    throw std::invalid_argument(what + ": shape " + to_string(a.shape) + " needs " +
                                std::to_string(a.size()) + " elements, the array holds " +
                                std::to_string(held));
}

// The .npy header as numpy writes it: version 1.0, padded with spaces to a multiple of 64 bytes.
std::string npy_header(const NpyArray& a) {
  std::string dict = std::string("{'descr': '") + (a.is_float() ? "<f4" : "<i8") +
                     "', 'fortran_order': False, 'shape': (";
  for (size_t k = 0; k < a.shape.size(); ++k) dict += (k ? ", " : "") + std::to_string(a.shape[k]);
  dict += a.shape.size() == 1 ? ",), }" : "), }";
  const size_t unpadded = 10 + dict.size() + 1;
  dict += std::string((64 - unpadded % 64) % 64, ' ') + '\n';
  if (dict.size() > kMax16)
    throw std::invalid_argument("npy header too long: shape has too many dimensions");
  Bytes b;
  b.str(std::string("\x93NUMPY\x01\x00", 8));
  b.u16(dict.size());
  b.str(dict);
  return b.data();
}

std::pair<const void*, uint64_t> payload(const NpyArray& a) {
  if (a.is_float()) return {a.f.data(), a.f.size() * sizeof(float)};
  return {a.i.data(), a.i.size() * sizeof(int64_t)};
}

}  // namespace

const char* npy_type_name(NpyType t) {
  switch (t) {
    case NpyType::Float32:
      return "float32";
    case NpyType::Float64:
      return "float64";
    case NpyType::Int64:
      return "int64";
  }
  return "?";
}

NpyArray NpyArray::floats(Dims shape, std::vector<float> data) {
  NpyArray a;
  a.shape = std::move(shape);
  a.type = NpyType::Float32;
  a.f = std::move(data);
  return a;
}

NpyArray NpyArray::int64s(Dims shape, std::vector<int64_t> data) {
  NpyArray a;
  a.shape = std::move(shape);
  a.type = NpyType::Int64;
  a.i = std::move(data);
  return a;
}

const NpyArray* find_array(const NpzEntries& arrays, const std::string& name) {
  for (const auto& [n, a] : arrays)
    if (n == name) return &a;
  return nullptr;
}

NpyArray read_npy(const std::string& path) {
  InFile f(path);
  RangeSource src(f, 0, f.size(), path);
  return read_array(src);
}

NpzEntries read_npz(const std::string& path) {
  InFile f(path);
  const Directory d = find_directory(f);
  const std::vector<Member> members = read_directory(f, d);
  NpzEntries out;
  std::set<std::string> names;
  for (const Member& m : members) {
    const std::string where = path + ": member '" + m.name + "'";
    if (m.name.size() <= 4 || !m.name.ends_with(".npy"))
      throw NpyError(where + " is not a .npy array (an .npz holds only NAME.npy members)");
    const std::string key = m.name.substr(0, m.name.size() - 4);
    if (!names.insert(key).second) throw NpyError(where + " appears twice");
    if (m.flags & 0x41) throw NpyError(where + " is encrypted");
    unsigned char local[30];
    if (m.local_offset > d.offset || d.offset - m.local_offset < 30)
      throw NpyError(where + ": local header offset " + std::to_string(m.local_offset) +
                     " lies outside the archive's data (corrupt archive)");
    f.read_at(m.local_offset, local, 30, where + ": local header");
    if (le32(local) != kLocalSig)
      throw NpyError(where + ": no local header at offset " + std::to_string(m.local_offset) +
                     " (corrupt archive)");
    const uint64_t local_name_len = le16(local + 26);
    std::string local_name(local_name_len, '\0');
    f.read_at(m.local_offset + 30, local_name.data(), local_name_len, where + ": local header");
    if (local_name != m.name)
      throw NpyError(where + ": its local header names it '" + local_name + "' (corrupt archive)");
    const uint64_t data_at = m.local_offset + 30 + local_name_len + le16(local + 28);
    if (data_at > d.offset || m.compressed > d.offset - data_at)
      throw NpyError(where + ": its " + std::to_string(m.compressed) +
                     " bytes of data overrun the archive (truncated or corrupt)");
    NpyArray a;
    uint32_t crc = 0;
    if (m.method == 0) {
      if (m.compressed != m.size)
        throw NpyError(where + ": stored member with compressed size " +
                       std::to_string(m.compressed) + " != size " + std::to_string(m.size));
      RangeSource src(f, data_at, m.size, where);
      a = read_array(src);
      crc = src.crc();
    } else if (m.method == 8) {
      if (m.size / kMaxDeflateRatio > m.compressed + 1)
        throw NpyError(where + ": claims " + std::to_string(m.size) + " bytes from " +
                       std::to_string(m.compressed) + " compressed bytes (corrupt)");
      InflateSource src(f, data_at, m.compressed, m.size, where);
      a = read_array(src);
      src.expect_end();
      crc = src.crc();
    } else {
      throw NpyError(where + " uses zip compression method " + std::to_string(m.method) +
                     " (only stored and deflate are supported)");
    }
    if (crc != m.crc) throw NpyError(where + ": CRC-32 mismatch (corrupt data)");
    out.emplace_back(key, std::move(a));
  }
  return out;
}

void write_npy(const std::string& path, const NpyArray& a) {
  check_array(a, path);
  AtomicFile out(path);
  out.write(npy_header(a));
  const auto [data, bytes] = payload(a);
  out.write(data, bytes);
  out.commit();
}

void write_npz(const std::string& path, const NpzEntries& arrays, bool force_zip64) {
  std::set<std::string> names;
  for (const auto& [name, a] : arrays) {
    if (name.empty() || name.size() > 60000)
      throw std::invalid_argument(path + ": array names must have 1 to 60000 characters");
    if (!names.insert(name).second)
      throw std::invalid_argument(path + ": the name '" + name + "' appears twice");
    check_array(a, path + ": '" + name + "'");
  }
  struct Written {
    std::string name;
    uint32_t crc;
    uint64_t size, offset;
  };
  std::vector<Written> written;
  AtomicFile out(path);
  for (const auto& [key, a] : arrays) {
    const std::string name = key + ".npy";
    const std::string header = npy_header(a);
    const auto [data, bytes] = payload(a);
    const uint32_t crc = crc_update(crc_update(0, header.data(), header.size()), data, bytes);
    const uint64_t size = header.size() + bytes, offset = out.pos();
    const bool zip64 = force_zip64 || size >= kMax32;
    Bytes h;
    h.u32(kLocalSig);
    h.u16(zip64 ? 45 : 20);  // version needed to extract
    h.u16(0);                // flags
    h.u16(0);                // stored
    h.u16(0);                // time
    h.u16(kDosDate);
    h.u32(crc);
    h.u32(zip64 ? kMax32 : size);
    h.u32(zip64 ? kMax32 : size);
    h.u16(name.size());
    h.u16(zip64 ? 20 : 0);
    h.str(name);
    if (zip64) {
      h.u16(1);
      h.u16(16);
      h.u64(size);
      h.u64(size);
    }
    out.write(h.data());
    out.write(header);
    out.write(data, bytes);
    written.push_back({name, crc, size, offset});
  }
  const uint64_t cd_offset = out.pos();
  Bytes cd;
  for (const Written& w : written) {
    const bool big = force_zip64 || w.size >= kMax32;
    const bool far = force_zip64 || w.offset >= kMax32;
    Bytes extra;
    if (big || far) {
      extra.u16(1);
      extra.u16((big ? 16 : 0) + (far ? 8 : 0));
      if (big) {
        extra.u64(w.size);
        extra.u64(w.size);
      }
      if (far) extra.u64(w.offset);
    }
    const uint64_t version = big || far ? 45 : 20;
    cd.u32(kCentralSig);
    cd.u16((3 << 8) | version);  // made by: Unix
    cd.u16(version);
    cd.u16(0);
    cd.u16(0);
    cd.u16(0);
    cd.u16(kDosDate);
    cd.u32(w.crc);
    cd.u32(big ? kMax32 : w.size);
    cd.u32(big ? kMax32 : w.size);
    cd.u16(w.name.size());
    cd.u16(extra.data().size());
    cd.u16(0);                        // comment
    cd.u16(0);                        // disk
    cd.u16(0);                        // internal attributes
    cd.u32(uint64_t{0100644} << 16);  // a regular file, rw-r--r--
    cd.u32(far ? kMax32 : w.offset);
    cd.str(w.name);
    cd.str(extra.data());
  }
  out.write(cd.data());
  const uint64_t entries = written.size(), cd_size = cd.data().size();
  const bool zip64_end =
      force_zip64 || entries >= kMax16 || cd_offset >= kMax32 || cd_size >= kMax32;
  Bytes end;
  if (zip64_end) {
    const uint64_t record_at = out.pos();
    end.u32(kEnd64Sig);
    end.u64(44);  // size of the rest of this record
    end.u16((3 << 8) | 45);
    end.u16(45);
    end.u32(0);
    end.u32(0);
    end.u64(entries);
    end.u64(entries);
    end.u64(cd_size);
    end.u64(cd_offset);
    end.u32(kLocator64Sig);
    end.u32(0);
    end.u64(record_at);
    end.u32(1);
  }
  end.u32(kEndSig);
  end.u16(0);
  end.u16(0);
  end.u16(zip64_end ? kMax16 : entries);
  end.u16(zip64_end ? kMax16 : entries);
  end.u32(zip64_end ? kMax32 : cd_size);
  end.u32(zip64_end ? kMax32 : cd_offset);
  end.u16(0);
  out.write(end.data());
  out.commit();
}

}  // namespace gg::kernels
