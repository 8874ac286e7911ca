// format.cpp: numbers scaled to a unit prefix, and durations (see format.h).
#include "core/format.h"

#include <cmath>
#include <cstdio>

namespace hgrn {

std::string format_scaled(double value, double base, const std::array<const char*, 5>& prefixes,
                          const char* separator, const char* unit) {
  size_t index = 0;
  while (value >= base && index + 1 < prefixes.size()) {
    value /= base;
    ++index;
  }
  char number[64];
  std::snprintf(number, sizeof number, index == 0 ? "%.0f" : "%.2f", value);
  return std::string(number) + separator + prefixes[index] + unit;
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
  }
  return buf;
}

}  // namespace hgrn
