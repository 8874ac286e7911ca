// format.h: numbers for people to read in reports and progress lines: scaled to a unit prefix (1234567 -> "1.23M",
// 1536 bytes -> "1.50 KiB") and durations ("12.3s", "3m05s", "1h02m"). Used by `hgrn info`, the training progress
// line and the `hgrn prepare` progress line.
#pragma once
#include <array>
#include <string>

namespace hgrn {

// `value` divided by `base` while it is at least `base`, at most four times; printed with no decimals when it was not
// divided and with two otherwise, then `separator`, the prefix for the number of divisions, and `unit`.
// format_scaled(1234567, 1000, {"", "K", "M", "G", "T"}, " ", "B") is "1.23 MB"; format_scaled(950, ...) "950 B".
std::string format_scaled(double value, double base, const std::array<const char*, 5>& prefixes,
                          const char* separator, const char* unit);

// "12.3s", "3m05s", "1h02m"; "?" for a negative or non-finite value (an ETA that cannot be known yet).
std::string format_duration(double seconds);

}  // namespace hgrn
