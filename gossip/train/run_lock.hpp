// One run at a time per checkpoint folder: two runs writing the same checkpoint.dir would
// interleave their checkpoints and overwrite each other's final model. Rank 0 holds a POSIX
// record lock on <checkpoint.dir>/run.lock for the run's life; the system releases it when the
// process ends, however it ends, so a killed run never blocks its own restart.
#pragma once

#include <string>

namespace gg::gossip {

class RunLock {
 public:
  // Creates the folder if needed and takes the lock; throws UsageError naming the run that holds
  // it, std::runtime_error when the folder or the lock file cannot be made.
  explicit RunLock(const std::string& dir);
  // Releases the lock. A folder this lock created and the run left empty (a start refused after
  // the lock, e.g. by its data) is removed with its run.lock: a refused run leaves nothing.
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
  std::string dir_;
  bool created_ = false;  // the folder did not exist before
};

}  // namespace gg::gossip
