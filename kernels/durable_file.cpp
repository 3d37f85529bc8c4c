// Durability needs both fsyncs: the file's, so the renamed name never points at missing data, and
// the folder's, so the rename itself survives a crash.
#include "kernels/durable_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace gg::kernels {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& reason) {
  throw std::runtime_error("cannot write " + path + ": " + reason);
}

// Writes all n bytes; false with errno set when the descriptor refuses them.
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t done = ::write(fd, p, n);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) return false;
    if (done == 0) {
      errno = EIO;
      return false;
    }
    p += done;
    n -= static_cast<size_t>(done);
  }
  return true;
}

int fsync_retrying(int fd) {
  int rc;
  do rc = ::fsync(fd);
  while (rc != 0 && errno == EINTR);
  return rc;
}

}  // namespace

void write_file_durably(const std::string& path, const void* data, size_t size) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail(path, "it is a folder");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail(path, std::strerror(errno));
  if (!write_all(fd, static_cast<const char*>(data), size) || fsync_retrying(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(path, std::strerror(err));
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(path, std::strerror(err));
  }
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // EINVAL: the file system cannot sync a folder, so there is nothing more to wait for.
  if (dir < 0 || (fsync_retrying(dir) != 0 && errno != EINVAL)) {
    const int err = errno;
    if (dir >= 0) ::close(dir);
    fail(path, std::string("its folder could not be synced (") + std::strerror(err) + ")");
  }
  ::close(dir);
}

void write_file_durably(const std::string& path, const std::string& bytes) {
  write_file_durably(path, bytes.data(), bytes.size());
}

}  // namespace gg::kernels
