// Tar shards through libarchive: the index (headers only; data read later by offset with pread)
// and the parallel writer of `gossipgrad pack`.
#include "shuffle/tar.hpp"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "shuffle/rng.hpp"

namespace gg::shuffle {

namespace fs = std::filesystem;

namespace {

struct ReadArchive {
  archive* a = archive_read_new();
  ~ReadArchive() { archive_read_free(a); }
};

std::string archive_error(archive* a) {
  const char* e = archive_error_string(a);
  return e ? e : "unknown libarchive error";
}

// "dir/name.ext" -> "dir/name" (WebDataset: the key ends at the first dot of the file name).
std::string member_key(const std::string& name, std::string* ext) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
  if (ext) *ext = dot == std::string::npos ? "" : name.substr(dot + 1);
  return name.substr(0, dot);
}

}  // namespace

std::vector<TarMember> list_tar(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw std::runtime_error(path + ": no such file");
  const int64_t file_size = static_cast<int64_t>(fs::file_size(path, ec));
  ReadArchive r;
  archive_read_support_format_tar(r.a);
  if (archive_read_open_filename(r.a, path.c_str(), 1 << 16) != ARCHIVE_OK)
    throw std::runtime_error(path + ": cannot open (" + archive_error(r.a) + ")");
  std::vector<TarMember> out;
  archive_entry* e = nullptr;
  while (true) {
    const int rc = archive_read_next_header(r.a, &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc < ARCHIVE_WARN)
      throw std::runtime_error(path + ": truncated or damaged tar archive after " +
                               std::to_string(out.size()) +
                               " members (libarchive: " + archive_error(r.a) + ")");
    if (archive_entry_filetype(e) != AE_IFREG) continue;
    TarMember m;
    m.name = archive_entry_pathname(e) ? archive_entry_pathname(e) : "";
    m.size = archive_entry_size(e);
    // The format reader has consumed every header block of this member: its position is the
    // first data byte (the archive is uncompressed, so that is a file offset).
    m.offset = archive_filter_bytes(r.a, 0);
    // Sizes come from the header (up to 2^63 in base-256 form): compare without overflowing.
    if (m.size < 0 || m.offset < 0 || m.offset > file_size || m.size > file_size - m.offset)
      throw std::runtime_error(path + ": truncated tar archive: member " + m.name + " declares " +
                               std::to_string(m.size) + " bytes at offset " +
                               std::to_string(m.offset) + ", the file has " +
                               std::to_string(file_size));
    out.push_back(std::move(m));
  }
  return out;
}

ShardSource::ShardSource(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error("shard folder " + dir + ": no such folder");
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".tar") shards_.push_back(e.path().string());
  if (ec) throw std::runtime_error("shard folder " + dir + ": cannot list (" + ec.message() + ")");
  std::sort(shards_.begin(), shards_.end());
  if (shards_.empty())
    throw std::runtime_error("shard folder " + dir +
                             ": no .tar shards (write them with gossipgrad pack)");
  int32_t max_label = -1;
  for (size_t s = 0; s < shards_.size(); ++s) {
    const std::vector<TarMember> members = list_tar(shards_[s]);
    struct Parts {
      const TarMember* image = nullptr;
      const TarMember* cls = nullptr;
    };
    std::vector<std::string> keys;
    std::unordered_map<std::string, Parts> parts;
    for (const TarMember& m : members) {
      std::string ext;
      const std::string key = member_key(m.name, &ext);
      const std::string lext = [&] {
        std::string l = ext;
        for (char& c : l) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return l;
      }();
      if (lext != "jpg" && lext != "jpeg" && lext != "cls") continue;
      auto [it, fresh] = parts.try_emplace(key);
      if (fresh) keys.push_back(key);
      const TarMember*& slot = lext == "cls" ? it->second.cls : it->second.image;
      if (slot != nullptr)
        throw std::runtime_error(shards_[s] + ": sample '" + key + "' has two " +
                                 (lext == "cls" ? ".cls" : "image") + " members (" + slot->name +
                                 ", " + m.name + "); one would be silently dropped");
      slot = &m;
    }
    const int fd = ::open(shards_[s].c_str(), O_RDONLY);
    if (fd < 0)
      throw std::runtime_error(shards_[s] + ": cannot open (" + std::strerror(errno) + ")");
    for (const std::string& key : keys) {
      const Parts& p = parts[key];
      const auto fail = [&](const std::string& why) {
        ::close(fd);
        throw std::runtime_error(shards_[s] + ": sample '" + key + "' " + why);
      };
      if (p.image == nullptr) fail("has a .cls but no .jpg member");
      if (p.cls == nullptr) fail("has no .cls member (the class index)");
      char buf[32] = {0};
      if (p.cls->size < 1 || p.cls->size > 20) fail(".cls must hold a class index");
      if (::pread(fd, buf, static_cast<size_t>(p.cls->size), p.cls->offset) != p.cls->size)
        fail(".cls cannot be read");
      char* end = nullptr;
      const long v = std::strtol(buf, &end, 10);
      while (end && (*end == '\n' || *end == '\r' || *end == ' ')) ++end;
      if (end == buf || (end && *end != '\0') || v < 0)
        fail(".cls holds '" + std::string(buf) + "', not a class index");
      if (v >= kMaxClasses)
        fail(".cls holds class " + std::to_string(v) + ", beyond the " +
             std::to_string(kMaxClasses) + " classes gossipgrad takes");
      samples_.push_back(
          {static_cast<int32_t>(s), static_cast<int32_t>(v), p.image->offset, p.image->size, key});
      max_label = std::max(max_label, static_cast<int32_t>(v));
    }
    ::close(fd);
  }
  if (samples_.empty())
    throw std::runtime_error("shard folder " + dir + ": the shards hold no samples");
  classes_ = max_label + 1;
  for (const fs::path& c :
       {fs::path(dir) / "classes.txt", fs::path(dir).parent_path() / "classes.txt"}) {
    std::error_code ec;
    if (!fs::exists(c, ec)) continue;
    class_list_ = c.string();
    classes_ = read_class_list(class_list_);
    for (const Sample& m : samples_)
      if (m.label >= classes_)
        throw std::runtime_error(shards_[static_cast<size_t>(m.shard)] + ": sample '" + m.key +
                                 "' has class " + std::to_string(m.label) + " but " + class_list_ +
                                 " lists " + std::to_string(classes_) + " classes");
    break;
  }
}

void ShardSource::read(int64_t id, std::vector<uint8_t>& out) const {
  const Sample& s = samples_[static_cast<size_t>(id)];
  const std::string& path = shards_[static_cast<size_t>(s.shard)];
  if (s.size > kMaxEncodedBytes)
    throw UnusableSample(path + ": member '" + s.key + "' holds " + std::to_string(s.size >> 20) +
                         " MiB, more than the " + std::to_string(kMaxEncodedBytes >> 20) +
                         " MiB any image may have");
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + ")");
  out.resize(static_cast<size_t>(s.size));
  int64_t done = 0;
  while (done < s.size) {
    const ssize_t n =
        ::pread(fd, out.data() + done, static_cast<size_t>(s.size - done), s.offset + done);
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error(path + ": read of '" + s.key + "' failed" +
                               (n < 0 ? std::string(" (") + std::strerror(errno) + ")" : ""));
    }
    done += n;
  }
  ::close(fd);
}

std::string ShardSource::name(int64_t id) const {
  const Sample& s = samples_[static_cast<size_t>(id)];
  return shards_[static_cast<size_t>(s.shard)] + ":" + s.key;
}

std::string ShardSource::describe() const {
  return "shards " + dir_ + " (" + std::to_string(shards_.size()) + " shards, " +
         std::to_string(samples_.size()) + " samples, " + std::to_string(classes_) + " classes)";
}

namespace {

struct PackItem {
  std::string path, key;
  int32_t label;
  int64_t size;
};

struct WriteArchive {
  archive* a = archive_write_new();
  ~WriteArchive() { archive_write_free(a); }
};

// Writes one member; throws with the shard path on failure.
void write_member(archive* a, const std::string& shard, const std::string& name, const void* data,
                  int64_t size) {
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_size(e, size);
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_mtime(e, 0, 0);  // reproducible shards
  const int rc = archive_write_header(a, e);
  archive_entry_free(e);
  if (rc != ARCHIVE_OK ||
      (size > 0 && archive_write_data(a, data, static_cast<size_t>(size)) != size))
    throw std::runtime_error(shard + ": cannot write " + name + " (" + archive_error(a) + ")");
}

}  // namespace

PackResult pack(const PackOptions& o, const std::function<void(const PackProgress&)>& progress) {
  if (o.input.empty() || o.output.empty())
    throw std::invalid_argument("pack needs --input DIR and --output DIR");
  if (o.shard_bytes < 1) throw std::invalid_argument("--shard-size must be positive");
  if (o.threads < 1 || o.threads > 256)
    throw std::invalid_argument("--threads must be in [1, 256]");
  std::error_code ec;
  if (!fs::is_directory(o.input, ec))
    throw std::invalid_argument("pack: input " + o.input + ": no such folder");

  // (split output folder, items); classes from the train folders.
  struct Split {
    fs::path out;
    std::vector<PackItem> items;
  };
  std::vector<Split> splits;
  std::vector<std::string> classes;
  const auto items_of = [](const FileListSource& src) {
    std::vector<PackItem> v;
    std::unordered_map<std::string, std::string> owner;  // key -> the file that took it
    for (const FileListSource::File& f : src.files()) {
      std::string stem = fs::path(f.path).stem().string();
      std::replace(stem.begin(), stem.end(), '.', '_');
      std::string key = src.class_names()[static_cast<size_t>(f.label)] + "/" + stem;
      const auto bytes = static_cast<int64_t>(fs::file_size(f.path));
      if (bytes > kMaxEncodedBytes)
        throw std::runtime_error("pack: " + f.path + " holds " + std::to_string(bytes >> 20) +
                                 " MiB, more than the " + std::to_string(kMaxEncodedBytes >> 20) +
                                 " MiB the loader reads of one image: remove it");
      if (const auto [it, fresh] = owner.emplace(key, f.path); !fresh)
        throw std::runtime_error("pack: " + it->second + " and " + f.path +
                                 " would both be stored as " + key +
                                 ".jpg (names differ only in extension or '.' vs '_'): rename one");
      v.push_back({f.path, std::move(key), f.label, bytes});
    }
    return v;
  };
  if (fs::is_directory(fs::path(o.input) / "train", ec)) {
    auto train = read_imagenet(o.input, true);
    classes = train->class_names();
    splits.push_back({fs::path(o.output) / "train", items_of(*train)});
    if (fs::is_directory(fs::path(o.input) / "val", ec))
      splits.push_back({fs::path(o.output) / "val", items_of(*read_imagenet(o.input, false))});
  } else {
    auto src = read_image_folders(o.input);
    classes = src->class_names();
    splits.push_back({fs::path(o.output), items_of(*src)});
  }
  for (const Split& s : splits) {
    if (!fs::is_directory(s.out, ec)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(s.out, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("shard-", 0) == 0)
        throw std::invalid_argument("pack: " + s.out.string() + " already holds shards (" + n +
                                    "); refusing to overwrite them: choose an empty --output");
    }
  }

  // Shards: consecutive runs of items of about shard_bytes each.
  struct Job {
    fs::path file;
    const std::vector<PackItem>* items;
    size_t begin, end;
  };
  std::vector<Job> jobs;
  PackProgress prog;
  for (Split& s : splits) {
    if (o.shuffle_seed != 0) {
      std::mt19937_64 rng(stream_seed({0x7061636b, o.shuffle_seed}));  // "pack"
      for (size_t i = s.items.size(); i > 1; --i)
        std::swap(s.items[i - 1], s.items[uniform_below(rng, i)]);
    }
    fs::create_directories(s.out);
    size_t begin = 0;
    int64_t bytes = 0;
    for (size_t i = 0; i < s.items.size(); ++i) {
      bytes += s.items[i].size;
      if (bytes >= o.shard_bytes || i + 1 == s.items.size()) {
        char name[32];
        std::snprintf(
            name, sizeof name, "shard-%06zu.tar",
            static_cast<size_t>(std::count_if(jobs.begin(), jobs.end(),
                                              [&](const Job& j) { return j.items == &s.items; })));
        jobs.push_back({s.out / name, &s.items, begin, i + 1});
        begin = i + 1;
        bytes = 0;
      }
    }
    prog.total_images += static_cast<int64_t>(s.items.size());
  }
  {
    std::ofstream cf(fs::path(o.output) / "classes.txt");
    for (const std::string& c : classes) cf << c << "\n";
    if (!cf)
      throw std::runtime_error("pack: cannot write " +
                               (fs::path(o.output) / "classes.txt").string());
  }
  prog.shards = static_cast<int>(jobs.size());

  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false}, stopped{false};
  std::exception_ptr error;
  const auto asked_to_stop = [&] {
    if (o.stop && !stopped && o.stop()) stopped = failed = true;
    return failed.load();
  };
  const auto work = [&] {
    std::vector<uint8_t> buf;
    while (!asked_to_stop()) {
      const size_t j = next++;
      if (j >= jobs.size()) return;
      const Job& job = jobs[j];
      const std::string tmp = job.file.string() + ".tmp";
      try {
        {
          WriteArchive w;
          archive_write_set_format_pax_restricted(w.a);
          if (archive_write_open_filename(w.a, tmp.c_str()) != ARCHIVE_OK)
            throw std::runtime_error(tmp + ": cannot create (" + archive_error(w.a) + ")");
          for (size_t i = job.begin; i < job.end && !asked_to_stop(); ++i) {
            const PackItem& it = (*job.items)[i];
            std::ifstream in(it.path, std::ios::binary);
            buf.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
            if (!in && !in.eof()) throw std::runtime_error("pack: cannot read " + it.path);
            write_member(w.a, tmp, it.key + ".jpg", buf.data(), static_cast<int64_t>(buf.size()));
            const std::string cls = std::to_string(it.label);
            write_member(w.a, tmp, it.key + ".cls", cls.data(), static_cast<int64_t>(cls.size()));
            std::lock_guard<std::mutex> lk(mu);
            prog.images += 1;
            prog.bytes += static_cast<int64_t>(buf.size());
            if (progress) progress(prog);
          }
          if (archive_write_close(w.a) != ARCHIVE_OK)
            throw std::runtime_error(tmp + ": cannot finish (" + archive_error(w.a) + ")");
        }
        if (failed) {  // another shard failed, or a stop: this one is not finished
          std::error_code ignore;
          fs::remove(tmp, ignore);
          return;
        }
        fs::rename(tmp, job.file);
        std::lock_guard<std::mutex> lk(mu);
        prog.shards_done += 1;
        if (progress) progress(prog);
      } catch (...) {
        std::error_code ignore;
        fs::remove(tmp, ignore);
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  const int n = std::min<int>(o.threads, static_cast<int>(std::max<size_t>(1, jobs.size())));
  for (int t = 0; t < n; ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  if (stopped) throw PackStopped(prog.shards_done, prog.shards);
  PackResult r;
  r.images = prog.images;
  r.bytes = prog.bytes;
  r.shards = static_cast<int>(jobs.size());
  for (const Job& j : jobs) r.files.push_back(j.file.string());
  return r;
}

}  // namespace gg::shuffle
