// .npy: a magic string, a version, a Python dict literal header ({'descr': '<f4',
// 'fortran_order': False, 'shape': (2, 3), }) padded to 64 bytes, then the raw C-order data.
// .npz: a zip archive of .npy members, read and written by libarchive. Everything is read through
// bounded, checked reads so a malformed file ends in an NpyError naming the file and the problem,
// never in a crash or an allocation sized by a corrupt header.
#include "kernels/npz.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <locale.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <set>
#include <string_view>

#include "kernels/durable_file.hpp"

namespace gg::kernels {

static_assert(std::endian::native == std::endian::little,
              "npy data are read and written in the host's byte order, assumed little-endian");

namespace {

namespace fs = std::filesystem;

// Deflate cannot expand data by more than about 1032:1: a member claiming more bytes than that
// many times the whole archive is corrupt, and nothing is allocated for it.
constexpr uint64_t kMaxDeflateRatio = 1032;
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;
// A zip archive with no members is its end record alone, 22 bytes.
constexpr uint64_t kEmptyZipBytes = 22;
// libarchive hands the length of each block it checksums to zlib as 32 bits: blocks of 1 GiB.
constexpr uint64_t kMaxChunk = uint64_t{1} << 30;

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// The size of a readable regular file, or an NpyError saying why it is not one.
uint64_t readable_size(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw NpyError(path + ": no such file");
  if (fs::is_directory(st)) throw NpyError(path + ": is a folder, not a file");
  if (!std::ifstream(path, std::ios::binary))
    throw NpyError(path + ": cannot be opened for reading");
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw NpyError(path + ": cannot read its size (" + ec.message() + ")");
  return size;
}

// libarchive's last error on one line (some of its messages end in a newline).
std::string libarchive_error(archive* a) {
  const char* s = archive_error_string(a);
  std::string m = s ? s : "unknown error";
  std::replace(m.begin(), m.end(), '\n', ' ');
  while (!m.empty() && m.back() == ' ') m.pop_back();
  return m;
}

// The bytes of one .npy stream, read front to back: a whole file or a zip member.
class Source {
 public:
  Source(std::string where, uint64_t size) : where_(std::move(where)), size_(size) {}
  virtual ~Source() = default;
  const std::string& where() const { return where_; }
  uint64_t remaining() const { return size_ - done_; }

  // Exactly n bytes, or an NpyError.
  void read(void* dst, uint64_t n) {
    if (n > remaining())
      throw NpyError(where_ + ": truncated (needs " + std::to_string(n) + " more bytes, holds " +
                     std::to_string(remaining()) + ")");
    fill(dst, n);
    done_ += n;
  }

 protected:
  virtual void fill(void* dst, uint64_t n) = 0;
  std::string where_;

 private:
  uint64_t size_;  // bytes of the (uncompressed) stream
  uint64_t done_ = 0;
};

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path)
      : Source(path, readable_size(path)), in_(path, std::ios::binary) {
    if (!in_) throw NpyError(path + ": cannot be opened for reading");
  }

 private:
  void fill(void* dst, uint64_t n) override {
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_ || static_cast<uint64_t>(in_.gcount()) != n)
      throw NpyError(where_ + ": read error (the file changed while being read?)");
  }
  std::ifstream in_;
};

// The member an archive reader stands at. libarchive inflates it and, once the member has been
// read to its end, checks its size and CRC-32.
class MemberSource : public Source {
 public:
  MemberSource(archive* a, uint64_t size, std::string where)
      : Source(std::move(where), size), a_(a) {}

  // After the last byte: the member must end here.
  void expect_end() {
    char extra = 0;
    const la_ssize_t got = archive_read_data(a_, &extra, 1);
    if (got < 0) fail();
    if (got > 0) throw NpyError(where_ + ": holds more bytes than its recorded size (corrupt)");
  }

 private:
  void fill(void* dst, uint64_t n) override {
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      const la_ssize_t got = archive_read_data(a_, out, std::min(n, kMaxChunk));
      if (got < 0) fail();
      if (got == 0) throw NpyError(where_ + ": its data end before its recorded size (corrupt)");
      out += got;
      n -= static_cast<uint64_t>(got);
    }
  }

  [[noreturn]] void fail() const {
    const std::string why = libarchive_error(a_);
    if (why.find("bad CRC") != std::string::npos)
      throw NpyError(where_ + ": CRC-32 mismatch (corrupt data)");
    throw NpyError(where_ + ": corrupt or truncated data (libarchive: " + why + ")");
  }

  archive* a_;
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
  if (dict.size() > 0xFFFF)
    throw std::invalid_argument("npy header too long: shape has too many dimensions");
  const char len[2] = {static_cast<char>(dict.size() & 0xFF), static_cast<char>(dict.size() >> 8)};
  return std::string("\x93NUMPY\x01\x00", 8) + std::string(len, 2) + dict;
}

std::pair<const void*, uint64_t> payload(const NpyArray& a) {
  if (a.is_float()) return {a.f.data(), a.f.size() * sizeof(float)};
  return {a.i.data(), a.i.size() * sizeof(int64_t)};
}

// ---- zip, through libarchive ----

using ReadArchive = std::unique_ptr<archive, decltype(&archive_read_free)>;
using WriteArchive = std::unique_ptr<archive, decltype(&archive_write_free)>;
using Entry = std::unique_ptr<archive_entry, decltype(&archive_entry_free)>;

// libarchive converts member names between UTF-8 (how zip archives flag non-ASCII names) and the
// thread's locale, and in the "C" locale every such name fails. A UTF-8 character type for the
// thread while an archive is read or written keeps names as they are.
class Utf8Names {
 public:
  Utf8Names() : utf8_(::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0))) {
    if (utf8_) old_ = ::uselocale(utf8_);
  }
  ~Utf8Names() {
    if (!utf8_) return;
    ::uselocale(old_);
    ::freelocale(utf8_);
  }
  Utf8Names(const Utf8Names&) = delete;
  Utf8Names& operator=(const Utf8Names&) = delete;

 private:
  locale_t utf8_;
  locale_t old_ = LC_GLOBAL_LOCALE;
};

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
// Member names are UTF-8 text: numpy writes them so, and libarchive cannot write back any other.
bool is_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xe  ? 3
                     : (c >> 3) == 0x1e ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto t = static_cast<unsigned char>(s[i + k]);
      if ((t >> 6) != 0x2) return false;
      cp = (cp << 6) | (t & 0x3f);
    }
    static constexpr uint32_t kLeast[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

// A zip reader on `path`: the seeking one takes every member's place and size from the central
// directory; the streaming one walks the local headers. Null when libarchive does not recognise
// the file as a zip archive (the caller has checked that the file can be read).
ReadArchive open_zip(const std::string& path, bool seeking) {
  ReadArchive a(archive_read_new(), archive_read_free);
  if (!a) throw std::bad_alloc();
  if (seeking)
    archive_read_support_format_zip_seekable(a.get());
  else
    archive_read_support_format_zip_streamable(a.get());
  // Members under __MACOSX/ are members like any other, not resource forks to hide.
  if (seeking && archive_read_set_format_option(a.get(), "zip", "mac-ext", nullptr) != ARCHIVE_OK)
    throw std::logic_error("libarchive: " + libarchive_error(a.get()));
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK)
    return {nullptr, archive_read_free};
  return a;
}

// libarchive's seeking reader looks for the end record after the first byte only, so it misses an
// archive that is nothing but that record; the streaming reader sees that it holds no members.
bool is_empty_zip(const std::string& path, uint64_t size) {
  if (size != kEmptyZipBytes) return false;
  ReadArchive a = open_zip(path, /*seeking=*/false);
  archive_entry* e = nullptr;
  return a && archive_read_next_header(a.get(), &e) == ARCHIVE_EOF;
}

la_ssize_t append_to_string(archive*, void* out, const void* data, size_t n) {
  static_cast<std::string*>(out)->append(static_cast<const char*>(data), n);
  return static_cast<la_ssize_t>(n);
}

// The .npz file's bytes: stored members, each written by libarchive with its size known up
// front, so ZIP64 records appear where sizes or offsets need them (or everywhere when forced).
std::string zip_in_memory(const std::string& path, const NpzEntries& arrays, bool force_zip64,
                          uint64_t reserve) {
  std::string out;
  out.reserve(reserve);
  const Utf8Names names;
  WriteArchive a(archive_write_new(), archive_write_free);
  if (!a) throw std::bad_alloc();
  const auto check = [&](int rc) {
    if (rc != ARCHIVE_OK)
      throw NpyError("cannot write " + path + ": libarchive: " + libarchive_error(a.get()));
  };
  check(archive_write_set_format_zip(a.get()));
  check(archive_write_set_format_option(a.get(), "zip", "compression", "store"));
  if (force_zip64) check(archive_write_set_format_option(a.get(), "zip", "zip64", "1"));
  check(archive_write_set_bytes_per_block(a.get(), 0));  // no padding after the end record
  check(archive_write_open(a.get(), &out, nullptr, append_to_string, nullptr));
  const auto write = [&](const void* data, uint64_t n) {
    for (uint64_t at = 0; at < n;) {
      const size_t chunk = std::min(n - at, kMaxChunk);
      if (archive_write_data(a.get(), static_cast<const char*>(data) + at, chunk) !=
          static_cast<la_ssize_t>(chunk))
        check(ARCHIVE_FATAL);
      at += chunk;
    }
  };
  for (const auto& [key, array] : arrays) {
    const std::string header = npy_header(array);
    const auto [data, bytes] = payload(array);
    Entry e(archive_entry_new(), archive_entry_free);
    if (!e) throw std::bad_alloc();
    archive_entry_set_pathname(e.get(), (key + ".npy").c_str());
    archive_entry_set_filetype(e.get(), AE_IFREG);
    archive_entry_set_perm(e.get(), 0644);
    archive_entry_set_size(e.get(), static_cast<la_int64_t>(header.size() + bytes));
    check(archive_write_header(a.get(), e.get()));
    write(header.data(), header.size());
    write(data, bytes);
    check(archive_write_finish_entry(a.get()));
  }
  check(archive_write_close(a.get()));
  return out;
}

// write_file_durably, failing with an NpyError like every other npz function.
void write_durably(const std::string& path, const std::string& bytes) {
  try {
    write_file_durably(path, bytes);
  } catch (const std::runtime_error& e) {
    throw NpyError(e.what());
  }
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
  FileSource src(path);
  return read_array(src);
}

NpzEntries read_npz(const std::string& path) {
  const uint64_t file_size = readable_size(path);
  const Utf8Names utf8_names;
  const ReadArchive a = open_zip(path, /*seeking=*/true);
  if (!a) {
    if (is_empty_zip(path, file_size)) return {};
    throw NpyError(path + ": not a zip archive (no end-of-central-directory record)");
  }
  NpzEntries out;
  std::set<std::string> names;
  while (true) {
    archive_entry* e = nullptr;
    const int rc = archive_read_next_header(a.get(), &e);
    if (rc == ARCHIVE_EOF) break;
    const char* raw = rc >= ARCHIVE_WARN && e ? archive_entry_pathname(e) : nullptr;
    const std::string name = raw ? raw : "";
    const std::string where = path + ": member '" + name + "'";
    if (rc != ARCHIVE_OK)
      throw NpyError((raw ? where : path) +
                     ": corrupt zip archive (libarchive: " + libarchive_error(a.get()) + ")");
    if (!is_utf8(name))
      throw NpyError(path +
                     ": a member name is not UTF-8 text (corrupt archive, or not written "
                     "by numpy)");
    if (name.size() <= 4 || !name.ends_with(".npy"))
      throw NpyError(where + " is not a .npy array (an .npz holds only NAME.npy members)");
    const std::string key = name.substr(0, name.size() - 4);
    if (!names.insert(key).second) throw NpyError(where + " appears twice");
    if (archive_entry_is_encrypted(e)) throw NpyError(where + " is encrypted");
    if (!archive_entry_size_is_set(e) || archive_entry_size(e) < 0)
      throw NpyError(where + ": its size is not recorded (corrupt archive)");
    const uint64_t size = static_cast<uint64_t>(archive_entry_size(e));
    if (size / kMaxDeflateRatio > file_size)
      throw NpyError(where + ": claims " + std::to_string(size) + " bytes in an archive of " +
                     std::to_string(file_size) + " (corrupt)");
    MemberSource src(a.get(), size, where);
    NpyArray array = read_array(src);
    src.expect_end();
    out.emplace_back(key, std::move(array));
  }
  return out;
}

void write_npy(const std::string& path, const NpyArray& a) {
  check_array(a, path);
  const auto [data, bytes] = payload(a);
  std::string file = npy_header(a);
  file.append(static_cast<const char*>(data), bytes);
  write_durably(path, file);
}

void write_npz(const std::string& path, const NpzEntries& arrays, bool force_zip64) {
  std::set<std::string> names;
  uint64_t total = 1024;
  for (const auto& [name, a] : arrays) {
    if (name.empty() || name.size() > 60000)
      throw std::invalid_argument(path + ": array names must have 1 to 60000 characters");
    if (name.find('\0') != std::string::npos)
      throw std::invalid_argument(path + ": array names cannot hold a NUL character");
    if (!is_utf8(name)) throw std::invalid_argument(path + ": array names must be UTF-8 text");
    if (!names.insert(name).second)
      throw std::invalid_argument(path + ": the name '" + name + "' appears twice");
    check_array(a, path + ": '" + name + "'");
    total += payload(a).second + 2 * name.size() + 256;
  }
  write_durably(path, zip_in_memory(path, arrays, force_zip64, total));
}

}  // namespace gg::kernels
