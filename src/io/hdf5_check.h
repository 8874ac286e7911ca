// hdf5_check.h: H5_CHECK, the one way hgrn calls the HDF5 C library, and an owning handle for HDF5 identifiers.
// HDF5 reports failure by a negative return value and, by default, by printing its whole internal error stack to
// stderr. hgrn turns that printing off and instead throws hgrn::Error carrying its own message (which file, which
// object, what to do) plus the most specific lines of HDF5's error stack, so a user sees one readable message.
#pragma once
#include <hdf5.h>

#include <string>
#include <type_traits>
#include <utility>

#include "core/check.h"

namespace hgrn::hdf5 {

// Initialises the library and turns off HDF5's automatic error printing. Every entry point of hgrn's HDF5 code
// calls this first: it is cheap, and HDF5 keeps the setting per thread in thread-safe builds. It also keeps HDF5
// from closing files at process exit: hgrn closes every file itself, and a file whose close failed (a full disk)
// would crash HDF5's exit handler.
void prepare_library();

// The innermost (most specific) entries of HDF5's current error stack as "function(): description; ...", or ""
// when the stack is empty. Used only while a failure is being reported.
std::string error_stack_summary();

// True when HDF5's current error stack says the file is shorter than its superblock claims (H5E_TRUNCATED).
bool error_stack_says_truncated();

// HDF5 signals failure with a negative value, except for calls that return a size (an unsigned type), which return
// 0 instead.
template <typename Result, typename MessageFn>
Result checked_result(Result result, MessageFn&& message) {
  bool failed;
  if constexpr (std::is_unsigned_v<Result>)
    failed = result == 0;
  else
    failed = result < 0;
  if (failed) {
    std::string details = error_stack_summary();
    throw Error(message() + (details.empty() ? std::string() : " [HDF5: " + details + "]"));
  }
  return result;
}

// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype, attribute or property list) and the function
// that closes it. close() is the normal, checked way to release it; the destructor only releases what an exception
// left open, and stays silent because it runs while another error is already on its way to the user.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer, std::string description)
      : id_(id), closer_(closer), description_(std::move(description)) {}
  Handle(Handle&& other) noexcept { *this = std::move(other); }
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  hid_t id() const { return id_; }
  const std::string& description() const { return description_; }
  // Closes the identifier and throws hgrn::Error naming the object if HDF5 reports a failure (for a file this is
  // where buffered data reaches the disk, so a full disk often shows up here).
  void close();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
  std::string description_;
};

// Closes `file`, a temporary being written at `path`, after a write failed; the caller removes the file and
// reports the original error. HDF5 writes its metadata when a file is closed, which on a full disk fails again
// and leaves the file open, so the contents are dropped first (the file is truncated to nothing) to give the close
// room. Objects inside the file must be closed already. Never throws.
void abandon_file(Handle& file, const std::string& path) noexcept;

}  // namespace hgrn::hdf5

// Evaluates an HDF5 call; when it returns HDF5's failure signal (see checked_result), throws hgrn::Error whose message
// is the remaining arguments, concatenated (evaluated only on failure), followed by HDF5's own explanation.
// Yields the call's result otherwise.
#define H5_CHECK(call, ...) \
  ::hgrn::hdf5::checked_result((call), [&] { return ::hgrn::detail::concat(__VA_ARGS__); })
