// atomic_write.cpp: temporary-then-rename writes of files and directories (see atomic_write.h).
#include "io/atomic_write.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc >= 2.28)
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <vector>

#include "core/check.h"

namespace hgrn {

namespace fs = std::filesystem;

namespace {

fs::path parent_or_current(const fs::path& path) {
  const fs::path parent = path.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

// Swaps two directory entries in one step, so that readers see either the old or the new one at every moment.
// Returns false when the kernel or file system cannot do it (the caller then falls back to two renames).
bool exchange_paths(const fs::path& a, const fs::path& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  const int error = errno;
  if (error == EINVAL || error == ENOSYS || error == ENOTSUP || error == EPERM) return false;
  throw Error("cannot exchange " + a.string() + " with " + b.string() + ": " + std::strerror(error));
}

struct InjectedFailure {
  WriteStep step;
  std::string path_part;
  int error;
};

std::mutex injected_mutex;
std::vector<InjectedFailure> injected_failures;
std::atomic<bool> any_injected{false};  // spares every write the lock while nothing is injected

}  // namespace

void inject_write_failure(WriteStep step, std::string path_part, int error) {
  std::lock_guard<std::mutex> lock(injected_mutex);
  injected_failures.push_back({step, std::move(path_part), error});
  any_injected = true;
}

void clear_write_failures() {
  std::lock_guard<std::mutex> lock(injected_mutex);
  injected_failures.clear();
  any_injected = false;
}

int injected_write_failure(WriteStep step, const std::string& path) {
  if (!any_injected) return 0;
  std::lock_guard<std::mutex> lock(injected_mutex);
  for (auto it = injected_failures.begin(); it != injected_failures.end(); ++it)
    if (it->step == step && path.find(it->path_part) != std::string::npos) {
      const int error = it->error;
      injected_failures.erase(it);
      any_injected = !injected_failures.empty();
      return error;
    }
  return 0;
}

std::string temporary_sibling_path(const std::string& path) {
  // A trailing slash would put the suffix inside the directory instead of next to it.
  std::string base = path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + ".tmp-" + std::to_string(::getpid());
}

std::vector<std::string> remove_stale_temporaries(const std::string& path) {
  const std::string prefix = fs::path(temporary_sibling_path(path)).filename().string();
  const std::string stem = prefix.substr(0, prefix.rfind('-') + 1);  // "<name>.tmp-"
  const fs::path dir = parent_or_current(fs::path(path));
  std::vector<std::string> removed;
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error) return removed;  // no directory yet: nothing was left there
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) break;
    const std::string name = it->path().filename().string();
    if (!name.starts_with(stem) || name.size() == stem.size()) continue;
    const std::string digits = name.substr(stem.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may still be running
    std::error_code remove_error;
    fs::remove_all(it->path(), remove_error);
    if (!remove_error) removed.push_back(it->path().string());
  }
  return removed;
}

void sync_path_to_disk(const std::string& path, bool is_directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | (is_directory ? O_DIRECTORY : 0) | O_CLOEXEC);
  HGRN_CHECK(fd >= 0, "cannot open ", path, " to sync it to disk: ", std::strerror(errno));
  const int injected = injected_write_failure(WriteStep::kSync, path);
  const int result = injected ? -1 : ::fsync(fd);
  const int error = injected ? injected : errno;
  ::close(fd);
  if (result != 0 && is_directory && (error == EINVAL || error == ENOTSUP)) return;
  HGRN_CHECK(result == 0, "cannot sync ", path, " to disk: ", std::strerror(error), kWriteAdvice);
}

void rename_path(const std::string& from, const std::string& to) {
  std::error_code error;
  if (const int injected = injected_write_failure(WriteStep::kRename, to))
    error.assign(injected, std::generic_category());
  else
    fs::rename(from, to, error);
  HGRN_CHECK(!error, "cannot rename ", from, " to ", to, ": ", error.message(), kWriteAdvice);
}

TemporaryPathGuard::~TemporaryPathGuard() {
  if (!armed_) return;
  std::error_code ignored;  // cleanup after an error that is already being reported; a second error would hide it
  fs::remove_all(path_, ignored);
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temp_path_(temporary_sibling_path(path_)) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  HGRN_CHECK(fd_ >= 0, "cannot create ", temp_path_, " (to write ", path_, "): ", std::strerror(errno), kWriteAdvice);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void AtomicFileWriter::write_all(const void* data, size_t bytes) {
  HGRN_CHECK(fd_ >= 0, "cannot write ", path_, ": the file was already committed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most about 2 GiB per call; larger tensors go in pieces.
    const size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    const int injected = injected_write_failure(WriteStep::kWrite, path_);
    if (injected) errno = injected;
    const ssize_t written = injected ? -1 : ::write(fd_, p, chunk);
    if (written < 0 && errno == EINTR) continue;
    HGRN_CHECK(written > 0, "cannot write ", temp_path_, " (to become ", path_, "): ",
               written < 0 ? std::strerror(errno) : "no progress", kWriteAdvice);
    p += written;
    bytes -= static_cast<size_t>(written);
  }
}

void AtomicFileWriter::commit() {
  HGRN_CHECK(fd_ >= 0, "cannot commit ", path_, " twice");
  const int fd = fd_;
  fd_ = -1;
  const int injected = injected_write_failure(WriteStep::kSync, path_);
  const bool synced = !injected && ::fsync(fd) == 0;
  const int sync_error = injected ? injected : errno;
  const bool closed = ::close(fd) == 0;
  const int close_error = errno;
  if (!synced || !closed) {
    ::unlink(temp_path_.c_str());
    throw Error("cannot finish writing " + path_ + ": " + std::strerror(synced ? close_error : sync_error) +
                kWriteAdvice);
  }
  try {
    rename_path(temp_path_, path_);
  } catch (const Error&) {
    ::unlink(temp_path_.c_str());
    throw;
  }
  sync_path_to_disk(parent_or_current(path_).string(), true);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.write_all(bytes);
  writer.commit();
}

void require_replaceable(const std::string& path, bool overwrite, const OutputKind& kind) {
  std::error_code error;
  const fs::file_status status = fs::symlink_status(path, error);
  if (!fs::exists(status)) return;
  const bool is_directory = fs::is_directory(status);
  if (is_directory && fs::is_empty(path, error) && !error) return;
  const char* what = is_directory ? "a non-empty directory" : fs::is_regular_file(status) ? "a file" : "something";
  HGRN_CHECK(overwrite, "refusing to overwrite ", path, ": it already exists",
             is_directory ? " and is not empty" : "",
             " (remove it, choose another output path, or pass --force to replace ", kind.description, ")");
  HGRN_CHECK(kind.recognises(path), "refusing to replace ", path, " with --force: it is ", what, " but not ",
             kind.description, ", and --force replaces nothing else; nothing was deleted (remove it yourself or "
             "choose another output path)");
}

void publish_atomically(const std::string& requested_path, bool is_directory, bool overwrite, const OutputKind& kind,
                        const std::function<void(const std::string& temp_path)>& fill) {
  HGRN_CHECK(!requested_path.empty(), "the output path is empty");
  // "out/" names the same thing as "out", but its parent_path() would be "out" itself.
  std::string final_path = requested_path;
  while (final_path.size() > 1 && final_path.back() == '/') final_path.pop_back();
  const fs::path target(final_path);
  const fs::path parent = parent_or_current(target);
  std::error_code error;
  fs::create_directories(parent, error);
  HGRN_CHECK(!error, "cannot create directory ", parent.string(), " for ", final_path, ": ", error.message(),
             kWriteAdvice);

  const fs::file_status status = fs::symlink_status(target, error);
  const bool exists = fs::exists(status);
  const bool empty_directory = exists && fs::is_directory(status) && fs::is_empty(target, error) && !error;
  require_replaceable(final_path, overwrite, kind);

  const std::string temp_path = temporary_sibling_path(final_path);
  fs::remove_all(temp_path, error);  // left by an earlier process with this id that crashed
  TemporaryPathGuard guard(temp_path);
  if (is_directory) {
    fs::create_directory(temp_path, error);
    HGRN_CHECK(!error, "cannot create ", temp_path, " (to write ", final_path, "): ", error.message(), kWriteAdvice);
  }
  fill(temp_path);
  HGRN_CHECK(fs::exists(temp_path), "internal: nothing was written to ", temp_path, " for ", final_path);
  sync_path_to_disk(temp_path, is_directory);

  const fs::path temp(temp_path);
  if (!exists || (!is_directory && fs::is_regular_file(status))) {
    // Nothing there, or a file replaced by a file: rename() replaces atomically.
    rename_path(temp_path, final_path);
    guard.disarm();
  } else if (empty_directory) {
    fs::remove(target, error);
    HGRN_CHECK(!error, "cannot replace the empty directory ", final_path, ": ", error.message());
    rename_path(temp_path, final_path);
    guard.disarm();
  } else if (exchange_paths(temp, target)) {
    // The old contents now sit at temp_path, which the guard removes.
  } else {
    const fs::path aside(temp_path + ".old");
    fs::rename(target, aside, error);
    HGRN_CHECK(!error, "cannot move the old ", final_path, " aside to ", aside.string(), ": ", error.message());
    try {
      rename_path(temp_path, final_path);
    } catch (const Error&) {
      std::error_code ignored;
      fs::rename(aside, target, ignored);  // put the old one back: the user keeps what they had
      throw;
    }
    guard.disarm();
    fs::remove_all(aside, error);
    HGRN_CHECK(!error, "replaced ", final_path, " but cannot remove the old copy at ", aside.string(), ": ",
               error.message());
  }
  sync_path_to_disk(parent.string(), true);
}

}  // namespace hgrn
