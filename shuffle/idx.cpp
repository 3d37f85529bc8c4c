// idx file reading: headers and payloads through zlib, which reads gzip and plain files alike.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "shuffle/dataset.hpp"

namespace gg::shuffle {

int64_t Dataset::sample_size() const { return static_cast<int64_t>(channels) * height * width; }

namespace {

namespace fs = std::filesystem;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// idx element type codes (the third magic byte) and their sizes in bytes; 0 = not an idx type.
int element_size(uint8_t type) {
  switch (type) {
    case 0x08:  // unsigned byte
    case 0x09:  // signed byte
      return 1;
    case 0x0B:  // int16
      return 2;
    case 0x0C:  // int32
    case 0x0D:  // float32
      return 4;
    case 0x0E:  // float64
      return 8;
    default:
      return 0;
  }
}

struct Header {
  uint32_t magic = 0;
  uint8_t type = 0;
  std::vector<uint32_t> dims;
};

// One idx file opened through zlib; every error names the file so a user with several data
// directories knows which one is broken.
class IdxFile {
 public:
  explicit IdxFile(const std::string& path) : path_(path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) fail("file not found");
    if (fs::is_directory(st)) fail("is a directory, expected an idx file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      fail(std::string("cannot open (") + (errno != 0 ? std::strerror(errno) : "out of memory") +
           ")");
    }
    gzbuffer(file_, 1 << 17);
  }
  ~IdxFile() {
    if (file_ != nullptr) gzclose(file_);
  }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& problem) const {
    throw std::runtime_error("read_idx: " + path_ + ": " + problem);
  }

  // Reads up to n bytes and returns how many arrived: fewer than n only at the end of the data.
  // A damaged gzip stream throws; one that merely ends early reads short (reported as truncated).
  size_t read(void* dst, size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    size_t done = 0;
    while (done < n) {
      const unsigned ask = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(file_, out + done, ask);
      if (got < 0) {
        int errnum = 0;
        const char* msg = gzerror(file_, &errnum);
        if (errnum == Z_ERRNO) fail(std::string("unreadable (") + std::strerror(errno) + ")");
        fail(std::string("unreadable, corrupt gzip data (zlib: ") + msg + ")");
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // Describes why a read came up short: zlib flags a gzip stream cut mid-way separately.
  std::string short_read_cause() {
    int errnum = 0;
    gzerror(file_, &errnum);
    return errnum == Z_BUF_ERROR ? " (the gzip stream ends early)" : "";
  }

  Header read_header(const char* expected) {
    unsigned char m[4];
    if (read(m, 4) != 4) fail("truncated: shorter than the 4-byte idx magic number");
    Header h;
    h.magic = (uint32_t{m[0]} << 24) | (uint32_t{m[1]} << 16) | (uint32_t{m[2]} << 8) | m[3];
    h.type = m[2];
    if (m[0] != 0 || m[1] != 0 || element_size(m[2]) == 0 || m[3] == 0) {
      fail("bad magic number " + hex32(h.magic) + ", expected " + expected +
           "; not an idx file (or a gzip file not named .gz that zlib could not recognise)");
    }
    h.dims.resize(m[3]);
    for (uint32_t& d : h.dims) {
      unsigned char b[4];
      if (read(b, 4) != 4) fail("truncated inside the header" + short_read_cause());
      d = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
    }
    return h;
  }

  // Reads exactly `bytes` of payload. The buffer grows as data arrives so that a corrupt header
  // claiming terabytes reports "truncated" instead of failing to allocate.
  std::vector<uint8_t> read_payload(uint64_t bytes, const std::string& what) {
    std::vector<uint8_t> out;
    uint64_t done = 0;
    while (done < bytes) {
      const uint64_t step = std::min<uint64_t>(bytes - done, std::max<uint64_t>(done, 1u << 20));
      out.resize(done + step);
      const size_t got = read(out.data() + done, step);
      done += got;
      if (got < step) {
        fail("truncated: expected " + std::to_string(bytes) + " bytes of " + what + ", found " +
             std::to_string(done) + short_read_cause());
      }
    }
    return out;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

Dataset read_idx_impl(const std::string& images_path, const std::string& labels_path, int classes) {
  IdxFile images(images_path);
  IdxFile labels(labels_path);
  const Header ih = images.read_header("0x00000803 (idx3 unsigned-byte images)");
  const Header lh = labels.read_header("0x00000801 (idx1 labels)");

  if (ih.type != 0x08 || (ih.dims.size() != 3 && ih.dims.size() != 4)) {
    images.fail("bad magic number " + hex32(ih.magic) +
                ", expected 0x00000803 (idx3 unsigned-byte images) or 0x00000804 (idx4 N x C x H "
                "x W); images and labels swapped?");
  }
  if (lh.dims.size() != 1 || lh.type == 0x0D || lh.type == 0x0E) {
    labels.fail("bad magic number " + hex32(lh.magic) +
                ", expected 0x00000801 (idx1 unsigned-byte labels) or an idx1 integer type; images "
                "and labels swapped?");
  }

  Dataset d;
  d.count = ih.dims[0];
  const bool has_channels = ih.dims.size() == 4;
  const uint32_t c = has_channels ? ih.dims[1] : 1;
  const uint32_t h = ih.dims[has_channels ? 2 : 1];
  const uint32_t w = ih.dims[has_channels ? 3 : 2];
  // One sample must fit the int sizes of the model's input (and c*h*w must not wrap).
  if (c == 0 || h == 0 || w == 0 || uint64_t{c} * h > INT_MAX || uint64_t{c} * h * w > INT_MAX) {
    images.fail("implausible image shape " + std::to_string(c) + "x" + std::to_string(h) + "x" +
                std::to_string(w) + " in the header");
  }
  d.channels = static_cast<int>(c);
  d.height = static_cast<int>(h);
  d.width = static_cast<int>(w);

  if (lh.dims[0] != ih.dims[0]) {
    throw std::runtime_error("read_idx: count mismatch: " + images_path + " holds " +
                             std::to_string(ih.dims[0]) + " images but " + labels_path + " holds " +
                             std::to_string(lh.dims[0]) + " labels");
  }

  // Labels first: the file is small, so its errors surface before decompressing the images.
  const int esize = element_size(lh.type);
  const std::vector<uint8_t> raw = labels.read_payload(
      static_cast<uint64_t>(d.count) * static_cast<uint64_t>(esize), "label data");
  d.labels.resize(static_cast<size_t>(d.count));
  int32_t max_label = -1;
  for (int64_t i = 0; i < d.count; ++i) {
    const uint8_t* p = raw.data() + i * esize;
    int32_t v = 0;
    switch (lh.type) {
      case 0x08:
        v = p[0];
        break;
      case 0x09:
        v = static_cast<int8_t>(p[0]);
        break;
      case 0x0B:
        v = static_cast<int16_t>((p[0] << 8) | p[1]);
        break;
      default:  // 0x0C, big-endian int32
        v = static_cast<int32_t>((uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
                                 (uint32_t{p[2]} << 8) | p[3]);
        break;
    }
    if (v < 0 || v >= (classes > 0 ? classes : kMaxClasses)) {
      const std::string range =
          classes > 0
              ? "[0, " + std::to_string(classes) + ") of the declared classes"
              : "[0, " + std::to_string(kMaxClasses) + "), the most classes gossipgrad takes";
      labels.fail("label " + std::to_string(v) + " of sample " + std::to_string(i) +
                  " is out of range " + range);
    }
    d.labels[static_cast<size_t>(i)] = v;
    max_label = std::max(max_label, v);
  }
  d.classes = classes > 0 ? classes : max_label + 1;

  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(d.count), static_cast<uint64_t>(c) * h * w,
                             &bytes)) {
    images.fail("implausible dimensions in the header (size overflows 64 bits)");
  }
  d.pixels = images.read_payload(bytes, "pixel data for " + std::to_string(d.count) +
                                            " images of " + std::to_string(c) + "x" +
                                            std::to_string(h) + "x" + std::to_string(w));
  return d;
}

// The hint every load_idx_dir failure carries: the fix is nearly always installing the package.
std::string install_hint() {
  return std::string(
             "; Debian's `dataset-fashion-mnist` package installs the Fashion-MNIST idx files "
             "under ") +
         kFashionMnistDir + " (apt-get install dataset-fashion-mnist)";
}

std::string find_idx_file(const fs::path& dir, const std::string& stem) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw std::runtime_error("load_idx_dir: " + dir.string() +
                             (fs::exists(dir, ec) ? " is not a directory" : ": no such directory") +
                             install_hint());
  }
  for (const std::string& name : {stem + ".gz", stem}) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) return (dir / name).string();
  }
  throw std::runtime_error("load_idx_dir: neither " + (dir / (stem + ".gz")).string() + " nor " +
                           (dir / stem).string() + " exists" + install_hint());
}

}  // namespace

Dataset read_idx(const std::string& images_path, const std::string& labels_path) {
  return read_idx_impl(images_path, labels_path, 0);
}

Dataset read_idx(const std::string& images_path, const std::string& labels_path, int classes) {
  if (classes <= 0) {
    throw std::invalid_argument("read_idx: classes must be positive, got " +
                                std::to_string(classes));
  }
  return read_idx_impl(images_path, labels_path, classes);
}

IdxFiles find_idx_files(const std::string& dir, bool train) {
  const std::string split = train ? "train" : "t10k";
  IdxFiles f;
  // Two statements: images should be reported first.
  f.images = find_idx_file(dir, split + "-images-idx3-ubyte");
  f.labels = find_idx_file(dir, split + "-labels-idx1-ubyte");
  return f;
}

Dataset load_idx_dir(const std::string& dir, bool train) {
  const IdxFiles f = find_idx_files(dir, train);
  return read_idx(f.images, f.labels);
}

void check_discovered_classes(const std::vector<int32_t>& labels, int classes,
                              const std::string& where, const std::string& declare) {
  if (classes <= 0) return;
  std::vector<uint8_t> seen(static_cast<size_t>(classes), 0);
  int64_t present = 0, top = -1;
  for (size_t i = 0; i < labels.size(); ++i) {
    const int32_t v = labels[i];
    if (v < 0 || v >= classes) continue;
    if (v == classes - 1 && top < 0) top = static_cast<int64_t>(i);
    present += seen[static_cast<size_t>(v)] == 0;
    seen[static_cast<size_t>(v)] = 1;
  }
  if (2 * present >= classes) return;
  throw std::runtime_error(where + ": the labels use only " + std::to_string(present) + " of the " +
                           std::to_string(classes) + " classes 0.." + std::to_string(classes - 1) +
                           " that their largest label implies (label " +
                           std::to_string(classes - 1) +
                           (top >= 0 ? " of sample " + std::to_string(top) : std::string()) +
                           "); fix the stray labels, or " + declare);
}

int read_class_list(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    throw std::runtime_error(path + ": cannot open the class list (" + std::strerror(errno) + ")");
  int64_t n = 0;
  bool blank = true;
  for (int ch = std::fgetc(f);; ch = std::fgetc(f)) {
    if (ch == EOF || ch == '\n') {
      n += !blank;
      blank = true;
      if (ch == EOF || n > kMaxClasses) break;
    } else if (ch != ' ' && ch != '\t' && ch != '\r') {
      blank = false;
    }
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw std::runtime_error(path + ": read error in the class list");
  if (n == 0) throw std::runtime_error(path + ": the class list is empty (one name per line)");
  if (n > kMaxClasses)
    throw std::runtime_error(path + ": lists more than " + std::to_string(kMaxClasses) +
                             " classes, the most gossipgrad takes");
  return static_cast<int>(n);
}

}  // namespace gg::shuffle
