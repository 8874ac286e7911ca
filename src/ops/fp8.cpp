// fp8.cpp: the FP8 formats' conversions, delayed scaling and the scaled FP8 GEMM on the CPU (see fp8.h).
#include "ops/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "ops/gemm_cpu.h"

namespace hgrn {
namespace {

struct Fp8Layout {
  int mantissa_bits;
  int bias;
  uint8_t max_code;  // the code of the largest finite value
  float max_finite;
};

Fp8Layout layout(Fp8Format format) {
  return format == Fp8Format::E4M3 ? Fp8Layout{3, 7, 0x7E, 448.0f} : Fp8Layout{2, 15, 0x7B, 57344.0f};
}

bool is_nan_code(uint8_t code, Fp8Format format) {
  const uint8_t magnitude = code & 0x7F;
  return format == Fp8Format::E4M3 ? magnitude == 0x7F : magnitude > 0x7C;
}

}  // namespace

const char* fp8_format_name(Fp8Format format) { return format == Fp8Format::E4M3 ? "E4M3" : "E5M2"; }

float fp8_max_finite(Fp8Format format) { return layout(format).max_finite; }

uint8_t fp8_from_float(float x, Fp8Format format) {
  const Fp8Layout f = layout(format);
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  if (magnitude_bits > 0x7F800000u) return 0x7F;  // NaN
  // Saturation: every |x| >= max finite (infinity included) gives ±max finite. Values just above the max would round
  // to it anyway; from max + ulp/2 up (which round-to-nearest would send to E4M3's NaN or E5M2's infinity) it clamps.
  if (std::bit_cast<float>(magnitude_bits) >= f.max_finite) return sign | f.max_code;

  // |x| = significand · 2^(exponent - 23) with the implicit bit in the significand (fp32 subnormals: exponent -126).
  const int biased = static_cast<int>(magnitude_bits >> 23);
  const uint32_t significand = biased == 0 ? (magnitude_bits & 0x7FFFFFu) : ((magnitude_bits & 0x7FFFFFu) | 0x800000u);
  const int exponent = biased == 0 ? -126 : biased - 127;
  // Keep mantissa_bits bits below the leading one, or fewer where the result is an FP8 subnormal (below 2^(1-bias),
  // whose spacing is fixed at 2^(1 - bias - mantissa_bits)): drop `shift` low bits with round to nearest even.
  const int min_normal_exponent = 1 - f.bias;
  const int shift = std::min(23 - f.mantissa_bits + std::max(0, min_normal_exponent - exponent), 26);
  uint32_t kept = significand >> shift;
  const uint32_t dropped = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (dropped > half || (dropped == half && (kept & 1))) ++kept;
  // A normal result is (exponent field - 1) << mantissa_bits plus `kept`, whose implicit bit adds the missing 1 (and a
  // carry from rounding up moves to the next binade on its own). A subnormal result is `kept` itself, and one that
  // rounds up to 2^mantissa_bits is the smallest normal code, as it should be.
  const uint32_t code =
      exponent >= min_normal_exponent ? (static_cast<uint32_t>(exponent + f.bias - 1) << f.mantissa_bits) + kept : kept;
  return sign | static_cast<uint8_t>(code);
}

float fp8_to_float(uint8_t code, Fp8Format format) {
  if (is_nan_code(code, format)) return std::bit_cast<float>(0x7FFFFFFFu);
  const Fp8Layout f = layout(format);
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent_field = (code & 0x7F) >> f.mantissa_bits;
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  if (format == Fp8Format::E5M2 && exponent_field == 31) return sign * std::numeric_limits<float>::infinity();
  // Subnormal (exponent field 0): mantissa · 2^(1 - bias - mantissa_bits); normal: (2^mantissa_bits + mantissa) ·
  // 2^(field - bias - mantissa_bits). Both are exact in fp32.
  const int significand = exponent_field == 0 ? mantissa : (1 << f.mantissa_bits) + mantissa;
  const int scale_exponent = (exponent_field == 0 ? 1 : exponent_field) - f.bias - f.mantissa_bits;
  return sign * std::ldexp(static_cast<float>(significand), scale_exponent);
}

void fp8_quantize(const float* x, int64_t n, float scale, Fp8Format format, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = fp8_from_float(x[i] * scale, format);
}

float fp8_amax(const float* x, int64_t n) {
  float amax = 0.0f;
  // Not std::fmax: the C library's returns NaN for a signalling NaN, the device's skips it.
  for (int64_t i = 0; i < n; ++i) {
    const float magnitude = std::fabs(x[i]);
    if (magnitude > amax) amax = magnitude;
  }
  return amax;
}

Fp8ScalingState fp8_scaling_state(int64_t history_length) {
  HGRN_CHECK(history_length >= 1, "fp8 amax history length: expected >= 1, got ", history_length);
  Fp8ScalingState state;
  state.amax_history.assign(static_cast<size_t>(history_length), 0.0f);
  return state;
}

namespace {
// A state read back from a checkpoint may be malformed: say so rather than index out of range.
void check_state(const Fp8ScalingState& state) {
  HGRN_CHECK(!state.amax_history.empty() && state.position >= 0 &&
                 state.position < static_cast<int64_t>(state.amax_history.size()),
             "fp8 scaling state: expected a non-empty amax history and a position within it, got length ",
             state.amax_history.size(), " and position ", state.position);
}
}  // namespace

void fp8_record_amax(Fp8ScalingState& state, float amax) {
  check_state(state);
  float& slot = state.amax_history[static_cast<size_t>(state.position)];
  slot = std::fmax(slot, amax);
}

void fp8_update_scale(Fp8ScalingState& state, Fp8Format format, int margin) {
  check_state(state);
  HGRN_CHECK(margin >= 0, "fp8 scaling margin: expected >= 0, got ", margin);
  std::vector<float>& history = state.amax_history;
  if (history[static_cast<size_t>(state.position)] == 0.0f) return;
  float amax = 0.0f;
  for (float a : history) amax = std::fmax(amax, a);
  state.position = (state.position + 1) % static_cast<int64_t>(history.size());
  history[static_cast<size_t>(state.position)] = 0.0f;
  if (std::isfinite(amax) && amax > 0.0f) {
    const float scaled_max = fp8_max_finite(format) * std::ldexp(1.0f, -margin);
    state.scale = scaled_max / amax;
  }
  if (std::isinf(state.scale)) state.scale = std::numeric_limits<float>::max();
}

void fp8_gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                  Fp8Format a_format, float a_scale_inv, const uint8_t* b, int64_t ldb, Fp8Format b_format,
                  float b_scale_inv, float beta, float* c, int64_t ldc) {
  HGRN_CHECK(!(a_format == Fp8Format::E5M2 && b_format == Fp8Format::E5M2),
             "fp8 GEMM: E5M2 x E5M2 is not supported (cuBLASLt has no such kernel); one operand must be E4M3");
  // The operands' exact values in fp32, stored as given (rows x cols with leading dimension ld), then an fp32 GEMM
  // with alpha = a_scale_inv · b_scale_inv: products of FP8 values are exact, so only the fp32 sums round.
  const auto decode = [](const uint8_t* codes, int64_t rows, int64_t cols, int64_t ld, Fp8Format format) {
    std::vector<float> values(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col) values[r * cols + col] = fp8_to_float(codes[r * ld + col], format);
    return values;
  };
  const std::vector<float> a_values = trans_a ? decode(a, k, m, lda, a_format) : decode(a, m, k, lda, a_format);
  const std::vector<float> b_values = trans_b ? decode(b, n, k, ldb, b_format) : decode(b, k, n, ldb, b_format);
  gemm_cpu<float>(trans_a, trans_b, m, n, k, a_scale_inv * b_scale_inv, a_values.data(), trans_a ? m : k,
                  b_values.data(), trans_b ? k : n, beta, c, ldc);
}

}  // namespace hgrn
