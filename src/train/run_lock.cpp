// run_lock.cpp: the run directory lock (run_lock.h).
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/check.h"

namespace hgrn {

std::string RunDirLock::lock_path(const std::string& run_dir) { return run_dir + "/run.lock"; }

RunDirLock::RunDirLock(const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  const std::string path = lock_path(run_dir);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  HGRN_CHECK(fd_ >= 0, "cannot open the run directory lock ", path, ": ", std::strerror(errno),
             " (check that logging.run_dir is writable)");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string("unknown");
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    HGRN_CHECK(error != EWOULDBLOCK, "logging.run_dir = ", run_dir, " is in use by another hgrn train (process ", pid,
               ", holding ", path, "): two runs in one directory would overwrite each other's checkpoints and "
               "metrics; wait for it to finish, stop it, or choose another logging.run_dir");
    throw Error("cannot lock " + path + ": " + std::strerror(error));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  HGRN_CHECK(::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size()),
             "cannot write the process id into the run directory lock ", path, ": ", std::strerror(errno));
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace hgrn
