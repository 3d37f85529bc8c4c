// The sample sources: idx data in memory, synthetic samples, image folders; and the spec parser.
#include "shuffle/source.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <system_error>

#include "shuffle/rng.hpp"
#include "shuffle/tar.hpp"

namespace gg::shuffle {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSyntheticLabelStream = 0x6c61626c;  // "labl"
constexpr uint64_t kSyntheticPixelStream = 0x7069786c;  // "pixl"

// Reads a whole file; a failure names the file and the reason.
void read_file(const std::string& path, std::vector<uint8_t>& out) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + ")");
  const std::streamsize n = f.tellg();
  if (n > kMaxEncodedBytes)
    throw UnusableSample(path + ": " + std::to_string(n >> 20) + " MiB, larger than the " +
                         std::to_string(kMaxEncodedBytes >> 20) + " MiB any image may have");
  f.seekg(0);
  out.resize(static_cast<size_t>(std::max<std::streamsize>(n, 0)));
  if (n > 0 && !f.read(reinterpret_cast<char*>(out.data()), n))
    throw std::runtime_error(path + ": read failed");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Sorted names of the entries of dir that satisfy keep; errors name dir.
template <typename Keep>
std::vector<std::string> sorted_entries(const fs::path& dir, Keep keep) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw std::runtime_error(dir.string() + ": cannot list (" + ec.message() + ")");
  for (const fs::directory_entry& e : it)
    if (keep(e)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool is_dir(const fs::directory_entry& e) {
  std::error_code ec;
  return e.is_directory(ec);
}

bool is_jpeg_file(const fs::directory_entry& e) {
  std::error_code ec;
  return e.is_regular_file(ec) && is_jpeg_name(e.path().filename().string());
}

void require_dir(const std::string& dir, const std::string& what) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw std::runtime_error(what + " " + dir + ": no such folder");
  if (!fs::is_directory(dir, ec)) throw std::runtime_error(what + " " + dir + ": not a folder");
}

}  // namespace

DatasetSource::DatasetSource(Dataset data, std::string where)
    : DatasetSource(std::make_shared<const Dataset>(std::move(data)), std::move(where)) {}

DatasetSource::DatasetSource(std::shared_ptr<const Dataset> data, std::string where)
    : owned_(std::move(data)), data_(*owned_), where_(std::move(where)) {}

std::array<int, 3> DatasetSource::shape() const {
  return {data_.channels, data_.height, data_.width};
}

void DatasetSource::read(int64_t id, std::vector<uint8_t>& out) const {
  const uint8_t* p = pixels(id);
  out.assign(p, p + data_.sample_size());
}

const uint8_t* DatasetSource::pixels(int64_t id) const {
  return data_.pixels.data() + id * data_.sample_size();
}

std::string DatasetSource::name(int64_t id) const { return where_ + "#" + std::to_string(id); }

std::string DatasetSource::describe() const {
  return "idx " + where_ + " (" + std::to_string(data_.count) + " samples " +
         std::to_string(data_.channels) + "x" + std::to_string(data_.height) + "x" +
         std::to_string(data_.width) + ", " + std::to_string(data_.classes) + " classes)";
}

SyntheticSpec parse_synthetic(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("synthetic:" + text +
                                 " must be synthetic:<C>x<H>x<W>[:classes[:count]] with C in "
                                 "{1, 3}, H and W in [1, 4096], classes >= 1, count >= 1");
  };
  SyntheticSpec s;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.empty() || parts.size() > 3) throw bad();
  const auto number = [&](const std::string& t) {
    if (t.empty() || t.size() > 12 || !std::all_of(t.begin(), t.end(), ::isdigit)) throw bad();
    return std::stoll(t);
  };
  int64_t dims[3];
  size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t x = i < 2 ? parts[0].find('x', pos) : std::string::npos;
    if (i < 2 && x == std::string::npos) throw bad();
    dims[i] = number(parts[0].substr(pos, x == std::string::npos ? x : x - pos));
    pos = x + 1;
  }
  if ((dims[0] != 1 && dims[0] != 3) || dims[1] < 1 || dims[1] > 4096 || dims[2] < 1 ||
      dims[2] > 4096)
    throw bad();
  s.channels = static_cast<int>(dims[0]);
  s.height = static_cast<int>(dims[1]);
  s.width = static_cast<int>(dims[2]);
  if (parts.size() > 1) {
    const int64_t c = number(parts[1]);
    if (c < 1 || c > 1000000) throw bad();
    s.classes = static_cast<int>(c);
  }
  if (parts.size() > 2) {
    s.count = number(parts[2]);
    if (s.count < 1) throw bad();
  }
  return s;
}

SyntheticSource::SyntheticSource(SyntheticSpec spec) : spec_(spec) {}

int32_t SyntheticSource::label(int64_t id) const {
  return static_cast<int32_t>(
      stream_seed({kSyntheticLabelStream, spec_.seed, static_cast<uint64_t>(id)}) %
      static_cast<uint64_t>(spec_.classes));
}

void SyntheticSource::read(int64_t id, std::vector<uint8_t>& out) const {
  out.resize(static_cast<size_t>(spec_.channels) * spec_.height * spec_.width);
  uint64_t x = stream_seed({kSyntheticPixelStream, spec_.seed, static_cast<uint64_t>(id)});
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    x = splitmix64(x);
    std::memcpy(out.data() + i, &x, 8);
  }
  x = splitmix64(x);
  for (; i < out.size(); ++i, x >>= 8) out[i] = static_cast<uint8_t>(x);
}

std::string SyntheticSource::name(int64_t id) const { return "synthetic#" + std::to_string(id); }

std::string SyntheticSource::describe() const {
  return "synthetic " + std::to_string(spec_.count) + " samples " + std::to_string(spec_.channels) +
         "x" + std::to_string(spec_.height) + "x" + std::to_string(spec_.width) + ", " +
         std::to_string(spec_.classes) + " classes";
}

FileListSource::FileListSource(std::vector<File> files, std::vector<std::string> class_names,
                               std::string where)
    : files_(std::move(files)), class_names_(std::move(class_names)), where_(std::move(where)) {}

void FileListSource::read(int64_t id, std::vector<uint8_t>& out) const {
  read_file(files_[static_cast<size_t>(id)].path, out);
}

std::string FileListSource::describe() const {
  return "images " + where_ + " (" + std::to_string(files_.size()) + " files, " +
         std::to_string(class_names_.size()) + " classes)";
}

bool is_jpeg_name(const std::string& filename) {
  const size_t dot = filename.rfind('.');
  if (dot == std::string::npos) return false;
  const std::string ext = lower(filename.substr(dot + 1));
  return ext == "jpg" || ext == "jpeg";
}

std::unique_ptr<FileListSource> read_image_folders(const std::string& dir) {
  require_dir(dir, "image folder");
  const std::vector<std::string> classes = sorted_entries(dir, is_dir);
  if (classes.size() > static_cast<size_t>(kMaxClasses))
    throw std::runtime_error("image folder " + dir + ": " + std::to_string(classes.size()) +
                             " class folders, more than the " + std::to_string(kMaxClasses) +
                             " classes gossipgrad takes");
  std::vector<FileListSource::File> files;
  std::string empty_class;  // the first class folder without images
  for (size_t c = 0; c < classes.size(); ++c) {
    const fs::path sub = fs::path(dir) / classes[c];
    const size_t before = files.size();
    for (const std::string& f : sorted_entries(sub, is_jpeg_file))
      files.push_back({(sub / f).string(), static_cast<int32_t>(c)});
    if (files.size() == before && empty_class.empty()) empty_class = classes[c];
  }
  if (files.empty())
    throw std::runtime_error("image folder " + dir +
                             ": no class folder holds .jpg/.jpeg files (expected "
                             "<class>/<name>.JPEG)");
  // Every folder is a class: an empty one would be a class no sample teaches (issue 31: the
  // shards folder of `gossipgrad pack --output DIR/shards`, counted as a class).
  if (!empty_class.empty())
    throw std::invalid_argument("image folder " + dir + ": the class folder " +
                                (fs::path(dir) / empty_class).string() +
                                " holds no .jpg/.jpeg files (every folder in " + dir +
                                " is a class): remove it or add its images");
  return std::make_unique<FileListSource>(std::move(files), classes, dir);
}

std::unique_ptr<FileListSource> read_imagenet(const std::string& root, bool train,
                                              const std::string& labels_file) {
  require_dir(root, "ImageNet folder");
  const std::string train_dir = (fs::path(root) / "train").string();
  auto train_src = read_image_folders(train_dir);
  if (train) return train_src;
  const std::vector<std::string>& wnids = train_src->class_names();
  const fs::path val = fs::path(root) / "val";
  require_dir(val.string(), "ImageNet validation folder");
  std::map<std::string, int32_t> index;
  for (size_t i = 0; i < wnids.size(); ++i) index[wnids[i]] = static_cast<int32_t>(i);
  std::vector<FileListSource::File> files;
  const std::vector<std::string> sub = sorted_entries(val, is_dir);
  if (!sub.empty() && !labels_file.empty())
    throw std::runtime_error("ImageNet validation: " + val.string() +
                             " holds class folders, so the labels file " + labels_file +
                             " would be ignored: remove data.val_labels or flatten val/");
  if (!sub.empty()) {
    for (const std::string& w : sub) {
      const auto it = index.find(w);
      if (it == index.end())
        throw std::runtime_error(val.string() + "/" + w +
                                 ": class folder not present in train/ (classes follow the "
                                 "sorted train folders)");
      for (const std::string& f : sorted_entries(val / w, is_jpeg_file))
        files.push_back({(val / w / f).string(), it->second});
    }
  } else {
    const std::string lf =
        labels_file.empty() ? (fs::path(root) / "val_labels.txt").string() : labels_file;
    std::ifstream in(lf);
    if (!in)
      throw std::runtime_error("ImageNet validation: " + val.string() +
                               " has no class folders and the labels file " + lf +
                               " cannot be read (lines: <file name> <wnid or class index>)");
    // One listing of val/ instead of a stat per line (50,000 lines for ImageNet).
    const std::vector<std::string> present = sorted_entries(val, [](const fs::directory_entry& e) {
      std::error_code ec;
      return e.is_regular_file(ec);
    });
    std::map<std::string, int64_t> named;  // file -> the line naming it
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      const size_t a = line.find_first_not_of(" \t\r");
      if (a == std::string::npos || line[a] == '#') continue;
      const size_t b = line.find_first_of(" \t,", a);
      const size_t c = b == std::string::npos ? b : line.find_first_not_of(" \t,", b);
      const size_t d = c == std::string::npos ? c : line.find_first_of(" \t\r", c);
      if (c == std::string::npos)
        throw std::runtime_error(lf + ":" + std::to_string(n) + ": expected <file> <label>");
      const std::string file = line.substr(a, b - a), lab = line.substr(c, d - c);
      const std::string at = lf + ":" + std::to_string(n) + ": ";
      std::error_code ec;
      if (file.find('/') == std::string::npos
              ? !std::binary_search(present.begin(), present.end(), file)
              : !fs::is_regular_file(val / file, ec))
        throw std::runtime_error(at + "names " + file + ", which is not a file in " + val.string());
      if (const auto [it, fresh] = named.emplace(file, n); !fresh)
        throw std::runtime_error(at + file + " is already labelled on line " +
                                 std::to_string(it->second));
      int32_t label = -1;
      if (const auto it = index.find(lab); it != index.end()) {
        label = it->second;
      } else if (!lab.empty() && std::all_of(lab.begin(), lab.end(), ::isdigit) && lab.size() < 9 &&
                 std::stol(lab) < static_cast<long>(wnids.size())) {
        label = static_cast<int32_t>(std::stol(lab));
      } else {
        throw std::runtime_error(at + "label '" + lab +
                                 "' is neither a train wnid nor a class index below " +
                                 std::to_string(wnids.size()));
      }
      files.push_back({(val / file).string(), label});
    }
  }
  if (files.empty())
    throw std::runtime_error("ImageNet validation " + val.string() + ": no images");
  return std::make_unique<FileListSource>(std::move(files), wnids, val.string());
}

SourceSpec parse_source(const std::string& text, const std::string& idx_dir) {
  SourceSpec s;
  const auto after = [&](const std::string& prefix) -> const char* {
    return text.rfind(prefix, 0) == 0 ? text.c_str() + prefix.size() : nullptr;
  };
  if (text == "fashion-mnist") {
    s.kind = SourceSpec::Kind::Idx;
    s.path = idx_dir;
    s.classes = kFashionMnistClasses;
  } else if (const char* p = after("idx:")) {
    s.kind = SourceSpec::Kind::Idx;
    s.path = p;
  } else if (const char* p = after("imagenet:")) {
    s.kind = SourceSpec::Kind::ImageNet;
    s.path = p;
  } else if (const char* p = after("shards:")) {
    s.kind = SourceSpec::Kind::Shards;
    s.path = p;
  } else if (const char* p = after("synthetic:")) {
    s.kind = SourceSpec::Kind::Synthetic;
    s.synthetic = parse_synthetic(p);
    return s;
  } else {
    throw std::invalid_argument("'" + text +
                                "' is not a data source: use fashion-mnist, idx:DIR, "
                                "imagenet:DIR, shards:DIR or synthetic:CxHxW[:classes[:count]]");
  }
  if (s.path.empty()) throw std::invalid_argument("'" + text + "' names no folder");
  return s;
}

namespace {

// One split of an idx folder, its labels checked against the declared classes (the spec's, or
// DIR/classes.txt), else the training labels' own.
Dataset open_idx(const SourceSpec& spec, bool train) {
  const IdxFiles f = find_idx_files(spec.path, train);
  const std::string list = (fs::path(spec.path) / "classes.txt").string();
  std::error_code ec;
  int declared = spec.classes;
  std::string how = "data.source fashion-mnist has " + std::to_string(spec.classes) +
                    " classes (other idx data: idx:DIR)";
  if (declared == 0 && fs::exists(list, ec)) {
    declared = read_class_list(list);
    how = list + " lists " + std::to_string(declared) + " classes";
  }
  if (declared == 0) {
    Dataset d = read_idx(f.images, f.labels);
    if (train)
      check_discovered_classes(d.labels, d.classes, f.labels,
                               "declare the classes in " + list + " (one name per line)");
    return d;
  }
  try {
    return read_idx(f.images, f.labels, declared);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + "; " + how);
  }
}

std::string shape_text(const std::array<int, 3>& s) {
  return std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]);
}

}  // namespace

std::unique_ptr<SampleSource> open_source(const SourceSpec& spec, bool train,
                                          const std::string& val_labels) {
  switch (spec.kind) {
    case SourceSpec::Kind::Idx:
      return std::make_unique<DatasetSource>(open_idx(spec, train), spec.path);
    case SourceSpec::Kind::ImageNet: {
      std::error_code ec;
      if (!train && !fs::is_directory(fs::path(spec.path) / "val", ec)) return nullptr;
      return read_imagenet(spec.path, train, val_labels);
    }
    case SourceSpec::Kind::Shards: {
      require_dir(spec.path, "shard folder");
      const fs::path sub = fs::path(spec.path) / (train ? "train" : "val");
      std::error_code ec;
      std::unique_ptr<ShardSource> s;
      if (fs::is_directory(sub, ec)) {
        s = std::make_unique<ShardSource>(sub.string());
      } else {
        if (!train) return nullptr;
        s = std::make_unique<ShardSource>(spec.path);
      }
      if (train && s->class_list().empty()) {
        std::vector<int32_t> labels(static_cast<size_t>(s->size()));
        for (int64_t i = 0; i < s->size(); ++i) labels[static_cast<size_t>(i)] = s->label(i);
        check_discovered_classes(labels, s->classes(), "shard folder " + spec.path,
                                 "list the classes in " +
                                     (fs::path(spec.path) / "classes.txt").string() +
                                     " (one name per line; gossipgrad pack writes it)");
      }
      return s;
    }
    case SourceSpec::Kind::Synthetic:
      if (!train) return nullptr;
      return std::make_unique<SyntheticSource>(spec.synthetic);
  }
  return nullptr;
}

DataSplits open_splits(const SourceSpec& spec, const std::string& val_labels) {
  DataSplits d;
  d.train = open_source(spec, true, val_labels);
  d.eval = open_source(spec, false, val_labels);
  if (!d.eval) return d;
  const SampleSource &train = *d.train, &eval = *d.eval;
  // idx data: name the files; other sources name themselves.
  const bool idx = spec.kind == SourceSpec::Kind::Idx;
  const IdxFiles tf = idx ? find_idx_files(spec.path, true) : IdxFiles{};
  const IdxFiles ef = idx ? find_idx_files(spec.path, false) : IdxFiles{};
  if (train.encoding() != eval.encoding() ||
      (train.encoding() == Encoding::Pixels && train.shape() != eval.shape())) {
    const std::string ts =
        train.encoding() == Encoding::Pixels ? shape_text(train.shape()) : "JPEG";
    const std::string es = eval.encoding() == Encoding::Pixels ? shape_text(eval.shape()) : "JPEG";
    throw std::runtime_error(
        "the test images " + (idx ? ef.images : eval.describe()) + " are " + es +
        " but the training images " + (idx ? tf.images : train.describe()) + " are " + ts +
        ": the model takes one input shape, so give both splits the same image size");
  }
  const int classes = train.classes();
  for (int64_t i = 0; i < eval.size(); ++i) {
    const int32_t v = eval.label(i);
    if (v >= 0 && v < classes) continue;
    throw std::runtime_error(
        (idx ? ef.labels + ": label " + std::to_string(v) + " of sample " + std::to_string(i)
             : eval.name(i) + ": label " + std::to_string(v)) +
        " is not one of the " + std::to_string(classes) + " training classes 0.." +
        std::to_string(classes - 1) + " (" + (idx ? tf.labels : train.describe()) +
        "): fix the label or the data");
  }
  return d;
}

}  // namespace gg::shuffle
