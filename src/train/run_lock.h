// run_lock.h: one `hgrn train` per run directory. The writer holds an flock(2) on <run_dir>/run.lock, which also
// records its process id for the refusal message. The kernel drops the lock when the process ends in any way
// (kill -9 included), so a crashed run never leaves a stale lock behind; the file itself stays and is reused.
#pragma once
#include <string>

namespace hgrn {

class RunDirLock {
 public:
  // Creates run_dir if needed and takes the lock without waiting. Throws hgrn::Error naming the lock file and the
  // holder's process id when another process holds it.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  static std::string lock_path(const std::string& run_dir);

 private:
  int fd_ = -1;
};

}  // namespace hgrn
