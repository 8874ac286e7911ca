// checked_math.h: products and sums of sizes that come from configs or files, which must be refused rather than
// wrap around: every multiplication of sizes taken from a config value or a file header goes through these.
#pragma once
#include <cstdint>

#include "core/check.h"

namespace hgrn {

// a * b and a + b, throwing hgrn::Error "<what> overflows 64 bits (a x b)" instead of wrapping. `what` names the
// quantity for the message, e.g. "the element count of shape [..]".
template <typename... What>
int64_t checked_mul(int64_t a, int64_t b, const What&... what) {
  int64_t result;
  HGRN_CHECK(!__builtin_mul_overflow(a, b, &result), what..., " overflows 64 bits (", a, " x ", b, ")");
  return result;
}

template <typename... What>
int64_t checked_add(int64_t a, int64_t b, const What&... what) {
  int64_t result;
  HGRN_CHECK(!__builtin_add_overflow(a, b, &result), what..., " overflows 64 bits (", a, " + ", b, ")");
  return result;
}

}  // namespace hgrn
