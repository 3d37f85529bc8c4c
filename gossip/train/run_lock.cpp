#include "gossip/train/run_lock.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "gossip/config/config.hpp"

namespace gg::gossip {

RunLock::RunLock(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  created_ = !std::filesystem::exists(dir, ec);
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / "run.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error("checkpoint.dir = " + dir + ": cannot create " + path + ": " +
                             std::strerror(errno));
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  if (::fcntl(fd_, F_SETLK, &lock) != 0) {
    const int err = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (err != EACCES && err != EAGAIN)
      throw std::runtime_error("checkpoint.dir = " + dir + ": cannot lock " + path + ": " +
                               std::strerror(err));
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "another process";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    throw UsageError("checkpoint.dir = " + dir + " is in use by another run (" + who +
                     "): wait for it to end or choose another folder");
  }
  char host[128] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + ", since " +
                         std::to_string(std::time(nullptr)) + " (Unix time)\n";
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // Who holds it is only for the message of a second run; the lock itself is what counts.
  }
}

RunLock::~RunLock() {
  namespace fs = std::filesystem;
  std::error_code ec;
  // Only run.lock in it: nothing of the run to keep. Unlinked while still locked, so no other run
  // can take the lock on the file being removed.
  if (fd_ >= 0 && created_) {
    bool only_lock = true;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec))
      only_lock = only_lock && e.path().filename() == "run.lock";
    if (!ec && only_lock) {
      fs::remove(fs::path(dir_) / "run.lock", ec);
      fs::remove(dir_, ec);  // only if empty
    }
  }
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace gg::gossip
