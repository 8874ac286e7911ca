// trace.cpp: NVTX push/pop (the header-only NVTX 3 from the CUDA Toolkit); nothing in a CPU-only build.
// HGRN_PROFILE=1 also turns every range into a timer: the device is synchronised at both ends and the wall time is
// added to a total per range name (digits folded, so "layer 3" and "layer 7" add up as "layer #"); the totals are
// printed to stderr at exit. The synchronisation slows the run, so this is for breakdowns, not for speed figures.
// HGRN_MEMORY_REPORT=1 keeps the stack of open range names, which the CUDA allocator uses as its blocks' tags.
#include "core/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"
#include "core/env_flag.h"

#ifdef HGRN_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace hgrn {

namespace {
using Clock = std::chrono::steady_clock;

struct Profile {
  bool enabled = env_flag("HGRN_PROFILE");
  std::mutex mutex;
  std::vector<std::pair<std::string, Clock::time_point>> open;
  std::map<std::string, std::pair<double, long>> totals;  // name -> (seconds, count)

  ~Profile() {
    if (!enabled || totals.empty()) return;
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(totals.begin(), totals.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::fprintf(stderr, "---- HGRN_PROFILE: wall time per range (inclusive, device-synchronised) ----\n");
    for (const auto& [name, t] : rows)
      std::fprintf(stderr, "%12.3f ms %8ld x  %s\n", t.first * 1e3, t.second, name.c_str());
  }
};
Profile& profile() {
  static Profile p;
  return p;
}

std::string fold_digits(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool digit = c >= '0' && c <= '9';
    if (!digit) out += c;
    else if (out.empty() || out.back() != '#') out += '#';
  }
  return out;
}
// The open ranges' folded names, for trace_innermost_range (one stack per thread: ranges nest within a thread).
thread_local std::vector<std::string> open_ranges;
const bool keep_open_ranges = cuda_memory_report_enabled();
}  // namespace

std::string trace_innermost_range() { return open_ranges.empty() ? std::string() : open_ranges.back(); }

void trace_profile_reset() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.totals.clear();
}

void trace_push(const std::string& name) {
#ifdef HGRN_WITH_CUDA
  nvtxRangePushA(name.c_str());
#endif
  if (keep_open_ranges) open_ranges.push_back(fold_digits(name));
  Profile& p = profile();
  if (!p.enabled) return;
  device_synchronize();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.open.emplace_back(fold_digits(name), Clock::now());
}

void trace_pop() {
#ifdef HGRN_WITH_CUDA
  nvtxRangePop();
#endif
  if (keep_open_ranges && !open_ranges.empty()) open_ranges.pop_back();
  Profile& p = profile();
  if (!p.enabled) return;
  device_synchronize();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.open.empty()) return;
  auto& total = p.totals[p.open.back().first];
  total.first += std::chrono::duration<double>(Clock::now() - p.open.back().second).count();
  total.second += 1;
  p.open.pop_back();
}

}  // namespace hgrn
