// atomic_write.h: writing files and whole directories so that a crash or an error never leaves something that looks
// complete but is not. Everything is first written under a temporary sibling name (same directory, so the final
// rename stays on one file system and is atomic), synced to disk, then renamed into place; on failure the temporary
// is removed. Used by the safetensors writer and the Hugging Face / HDF5 exporters (whole files and directories),
// and piece by piece (temporary_sibling_path, sync_path_to_disk, rename_path, TemporaryPathGuard) by the checkpoint
// writer and the token shard writer, which keep their own temporary names and commit orders.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hgrn {

// The end of every message about a failed write: what a user can do about it.
inline constexpr const char* kWriteAdvice = " (check that the disk has free space and the directory is writable)";

// The steps of a write that can fail for reasons outside hgrn (a full disk, an I/O error): tests make them fail on
// purpose through inject_write_failure to check that every writer reports the failure and loses nothing.
enum class WriteStep { kWrite, kSync, kRename };

// Test-only: the next `step` on a path that contains `path_part` fails with errno `error` (e.g. ENOSPC), once.
// Injections are kept per process until they fire or clear_write_failures() is called.
void inject_write_failure(WriteStep step, std::string path_part, int error);
void clear_write_failures();
// The errno an injected failure gives this `step` on `path` (consuming the injection), or 0 when none matches.
// Called by every write, sync and rename of the atomic-write layer and of the token shard writer.
int injected_write_failure(WriteStep step, const std::string& path);

// "<path>.tmp-<pid>": where an atomic write of `path` puts its data before the rename. The process id keeps two
// writers of the same path apart.
std::string temporary_sibling_path(const std::string& path);

// Removes what writers of `path` that were killed left behind: siblings named "<path>.tmp-<pid>" whose process no
// longer runs (a live writer's temporary is left alone). Returns the removed paths, for a note to the user.
std::vector<std::string> remove_stale_temporaries(const std::string& path);

// fsync of a file, or of a directory (which makes a rename inside it durable). File systems that cannot sync a
// directory are tolerated: the rename is still atomic there. Throws hgrn::Error naming the path.
void sync_path_to_disk(const std::string& path, bool is_directory);

// rename(2) of `from` to `to`, replacing a file at `to` atomically. Throws hgrn::Error naming both paths. Durable
// only once the directory is synced (sync_path_to_disk), which callers with several renames do once, after the last.
void rename_path(const std::string& from, const std::string& to);

// Removes a temporary file or directory tree when the scope ends, unless disarm() was called (the rename happened).
class TemporaryPathGuard {
 public:
  explicit TemporaryPathGuard(std::string path) : path_(std::move(path)) {}
  ~TemporaryPathGuard();
  TemporaryPathGuard(const TemporaryPathGuard&) = delete;
  TemporaryPathGuard& operator=(const TemporaryPathGuard&) = delete;
  void disarm() { armed_ = false; }

 private:
  std::string path_;
  bool armed_ = true;
};

// Streams data into a temporary sibling of `path` through write_all(); commit() syncs, closes and renames it to
// `path` (replacing an existing file). Destroyed without commit(), it removes the temporary file.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write_all(const void* data, size_t bytes);
  void write_all(std::string_view bytes) { write_all(bytes.data(), bytes.size()); }
  void commit();

 private:
  std::string path_, temp_path_;
  int fd_ = -1;
};

// Writes `bytes` to `path` atomically (AtomicFileWriter in one call).
void write_file_atomically(const std::string& path, std::string_view bytes);

// What an earlier output of one kind looks like: --force replaces such an output and nothing else, so that a
// mistyped output path never costs a user an unrelated file or directory.
struct OutputKind {
  std::string description;                                  // e.g. "an hgrn HDF5 weights file"
  std::function<bool(const std::string& path)> recognises;  // true when path holds an earlier output of this kind
};

// Checks that a new output may be put at `path`: nothing there, an empty directory, or (only with `overwrite`) an
// earlier output of `kind`. Throws hgrn::Error naming the path and what is there otherwise; deletes nothing.
void require_replaceable(const std::string& path, bool overwrite, const OutputKind& kind);

// Creates `final_path` (a directory when `is_directory`, else a file) atomically: `fill` is called with a temporary
// sibling path (for a directory: an existing empty directory; for a file: a path that does not exist yet) and must
// produce the complete result there; then it replaces final_path in one rename. What may be there is decided by
// require_replaceable; an existing output is replaced only after the new one is complete (atomically where the
// kernel can exchange two names, else by moving the old one aside first, so that final_path is never half-written).
// Throws hgrn::Error naming final_path; on any failure the temporary is removed and final_path is left as it was.
void publish_atomically(const std::string& final_path, bool is_directory, bool overwrite, const OutputKind& kind,
                        const std::function<void(const std::string& temp_path)>& fill);

}  // namespace hgrn
