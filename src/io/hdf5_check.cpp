// hdf5_check.cpp: HDF5 library setup, error-stack summaries for hgrn's messages, and the owning Handle.
#include "io/hdf5_check.h"

#include <unistd.h>

#include <utility>
#include <vector>

namespace hgrn::hdf5 {

void prepare_library() {
  H5dont_atexit();  // effective before the first H5open only, a no-op after
  H5_CHECK(H5open(), "cannot initialise the HDF5 library (is libhdf5 installed correctly?)");
  // With automatic printing on, every failure would dump HDF5's internal stack trace to stderr before hgrn's own
  // message; the stack stays available to error_stack_summary() for the message hgrn throws.
  H5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), "cannot turn off HDF5's automatic error printing");
}

namespace {

struct ErrorStackEntry {
  hid_t minor;
  std::string text;
};

herr_t collect_error_entry(unsigned /*position*/, const H5E_error2_t* entry, void* client_data) {
  auto* entries = static_cast<std::vector<ErrorStackEntry>*>(client_data);
  std::string text = entry->func_name ? std::string(entry->func_name) + "(): " : std::string();
  text += entry->desc ? entry->desc : "";
  entries->push_back({entry->min_num, std::move(text)});
  return 0;
}

// Walking the stack is itself an HDF5 call, made while a failure is being reported. If the walk fails there is
// nothing better to add, so the caller's own message is thrown without HDF5's details rather than a second error
// about the walk hiding the first one.
std::vector<ErrorStackEntry> current_error_stack() {
  std::vector<ErrorStackEntry> entries;
  if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error_entry, &entries) < 0) entries.clear();
  return entries;
}

}  // namespace

std::string error_stack_summary() {
  // Innermost first: the bottom entries say what actually went wrong ("truncated file: eof = ..."); the outer ones
  // repeat it in more general words, so three are plenty.
  constexpr size_t kEntriesShown = 3;
  std::string summary;
  std::vector<ErrorStackEntry> entries = current_error_stack();
  for (size_t i = 0; i < entries.size() && i < kEntriesShown; ++i) summary += (i ? "; " : "") + entries[i].text;
  return summary;
}

bool error_stack_says_truncated() {
  for (const ErrorStackEntry& entry : current_error_stack())
    if (entry.minor == H5E_TRUNCATED) return true;
  return false;
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0 && closer_) closer_(id_);  // unchecked for the destructor's reason: assignment cannot report it
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    closer_ = other.closer_;
    description_ = std::move(other.description_);
  }
  return *this;
}

Handle::~Handle() {
  if (id_ >= 0 && closer_) closer_(id_);
}

void abandon_file(Handle& file, const std::string& path) noexcept {
  ::truncate(path.c_str(), 0);  // best effort: the close below is what matters
  try {
    file.close();
  } catch (const Error&) {
    // Still open: prepare_library made sure HDF5 does not trip over it at exit; the first error is the one reported.
  }
}

void Handle::close() {
  if (id_ < 0) return;
  hid_t id = id_;
  id_ = H5I_INVALID_HID;  // released even if HDF5 reports an error: a second close would only fail again
  H5_CHECK(closer_(id), "cannot close ", description_);
}

}  // namespace hgrn::hdf5
