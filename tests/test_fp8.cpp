// test_fp8.cpp: the FP8 reference arithmetic (ops/fp8.h): every code of both formats, rounding at every boundary,
// saturation, subnormals, NaN and infinity, random inputs against a nearest-code search written from the OCP definition,
// CUDA's own host conversion where the CUDA headers are built in, the delayed-scaling update on hand-made amax
// sequences, and the scaled FP8 GEMM against fp64 on the dequantised values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/check.h"
#include "ops/fp8.h"

#if defined(HGRN_WITH_CUDA)
#include <cuda_fp8.h>
#endif

namespace hgrn {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

// The value of a code from the OCP FP8 definition, in fp64 (NaN for NaN codes, ±inf for E5M2's infinities), written
// independently of fp8_to_float.
double spec_value(uint8_t code, Fp8Format format) {
  const bool e4m3 = format == Fp8Format::E4M3;
  const int mantissa_bits = e4m3 ? 3 : 2, exponent_bits = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
  const int field = (code >> mantissa_bits) & ((1 << exponent_bits) - 1);
  const int mantissa = code & ((1 << mantissa_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int top = (1 << exponent_bits) - 1;
  if (e4m3 && field == top && mantissa == (1 << mantissa_bits) - 1) return std::nan("");
  if (!e4m3 && field == top) return mantissa == 0 ? sign * INFINITY : std::nan("");
  const double fraction = static_cast<double>(mantissa) / (1 << mantissa_bits);
  if (field == 0) return sign * fraction * std::pow(2.0, 1 - bias);
  return sign * (1.0 + fraction) * std::pow(2.0, field - bias);
}

// The saturating round-to-nearest-even conversion by search: the finite code nearest to x (ties to the code whose
// lowest bit is 0, i.e. the even significand), ±max finite beyond the range, x's sign on a zero result, 0x7F for NaN.
uint8_t nearest_code_by_search(float x, Fp8Format format) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double magnitude = std::fabs(static_cast<double>(x));
  // Saturation (beyond the largest finite value the nearest-value search itself ties, in fp64, for huge |x|).
  const uint8_t max_code = format == Fp8Format::E4M3 ? 0x7E : 0x7B;
  if (magnitude >= spec_value(max_code, format)) return sign | max_code;
  int best = -1;
  double best_distance = INFINITY;
  for (int code = 0; code < 0x80; ++code) {
    const double value = spec_value(static_cast<uint8_t>(code), format);
    if (!std::isfinite(value)) continue;
    const double distance = std::fabs(value - magnitude);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return sign | static_cast<uint8_t>(best);
}

int nan_code_count(Fp8Format format) {
  int count = 0;
  for (int code = 0; code < 256; ++code) count += std::isnan(spec_value(static_cast<uint8_t>(code), format));
  return count;
}

TEST(Fp8Conversion, EveryCodeDecodesExactlyAndRoundTrips) {
  for (Fp8Format format : kFormats) {
    SCOPED_TRACE(fp8_format_name(format));
    EXPECT_EQ(nan_code_count(format), format == Fp8Format::E4M3 ? 2 : 6);
    for (int c = 0; c < 256; ++c) {
      const uint8_t code = static_cast<uint8_t>(c);
      const double want = spec_value(code, format);
      const float got = fp8_to_float(code, format);
      if (std::isnan(want)) {
        EXPECT_EQ(bits_of(got), 0x7FFFFFFFu) << "code " << c;  // CUDA's canonical NaN
        continue;
      }
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // -0 included
      if (std::isinf(want)) {
        EXPECT_EQ(fp8_from_float(got, format), (c & 0x80) | (format == Fp8Format::E4M3 ? 0x7E : 0x7B));  // saturates
      } else {
        EXPECT_EQ(fp8_from_float(got, format), code) << "code " << c;
      }
    }
  }
  // Anchors from the OCP table: smallest subnormal, smallest normal, one, largest finite.
  EXPECT_EQ(fp8_to_float(0x01, Fp8Format::E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_to_float(0x08, Fp8Format::E4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(fp8_to_float(0x38, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(fp8_to_float(0x7E, Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_to_float(0x01, Fp8Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_to_float(0x04, Fp8Format::E5M2), std::ldexp(1.0f, -14));
  EXPECT_EQ(fp8_to_float(0x3C, Fp8Format::E5M2), 1.0f);
  EXPECT_EQ(fp8_to_float(0x7B, Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8_to_float(0xFC, Fp8Format::E5M2), -kInf);
  EXPECT_EQ(fp8_max_finite(Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8_max_finite(Fp8Format::E5M2), 57344.0f);
}

// Every pair of neighbouring finite values, both signs: the midpoint (exact in fp32) goes to the even code, one fp32
// step either side of it to the nearer neighbour. This covers subnormals, the subnormal/normal border and every binade.
TEST(Fp8Conversion, RoundsToNearestTiesToEvenAtEveryBoundary) {
  for (Fp8Format format : kFormats) {
    SCOPED_TRACE(fp8_format_name(format));
    const int max_code = format == Fp8Format::E4M3 ? 0x7E : 0x7B;
    for (int lo = 0; lo < max_code; ++lo) {
      for (uint8_t sign : {0x00, 0x80}) {
        const uint8_t lo_code = sign | lo, hi_code = sign | (lo + 1);
        const float lo_value = fp8_to_float(lo_code, format), hi_value = fp8_to_float(hi_code, format);
        const float mid = (lo_value + hi_value) / 2;
        ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo_value) + hi_value) / 2);  // exact
        EXPECT_EQ(fp8_from_float(mid, format), (lo % 2 == 0) ? lo_code : hi_code) << "between codes " << lo << ", " << lo + 1;
        EXPECT_EQ(fp8_from_float(std::nextafter(mid, lo_value), format), lo_code) << "below the midpoint " << mid;
        EXPECT_EQ(fp8_from_float(std::nextafter(mid, hi_value), format), hi_code) << "above the midpoint " << mid;
      }
    }
  }
  // By hand: 1.0625 lies halfway between 1 (0x38) and 1.125 (0x39) in E4M3 and goes to the even 1; 1.1875, halfway
  // between 1.125 and 1.25 (0x3A), goes up; in E5M2 1.125 lies between 1 (0x3C) and 1.25 (0x3D): down.
  EXPECT_EQ(fp8_from_float(1.0625f, Fp8Format::E4M3), 0x38);
  EXPECT_EQ(fp8_from_float(1.1875f, Fp8Format::E4M3), 0x3A);
  EXPECT_EQ(fp8_from_float(-1.1875f, Fp8Format::E4M3), 0xBA);
  EXPECT_EQ(fp8_from_float(1.125f, Fp8Format::E5M2), 0x3C);
  EXPECT_EQ(fp8_from_float(1.375f, Fp8Format::E5M2), 0x3E);  // between 1.25 (0x3D) and 1.5 (0x3E): up to even
}

TEST(Fp8Conversion, SaturatesToTheLargestFiniteValue) {
  const float max = std::numeric_limits<float>::max();
  // E4M3: 464 is halfway between 448 and the NaN code's 480 (ties to the even 448 anyway); beyond it plain rounding
  // would give NaN, saturation gives 448.
  for (float x : {448.0f, 449.0f, 464.0f, 465.0f, 480.0f, 1e6f, max, kInf}) {
    EXPECT_EQ(fp8_from_float(x, Fp8Format::E4M3), 0x7E) << x;
    EXPECT_EQ(fp8_from_float(-x, Fp8Format::E4M3), 0xFE) << -x;
  }
  // E5M2: 61440 is halfway between 57344 and infinity's slot (round to even would give infinity).
  for (float x : {57344.0f, 57345.0f, 61439.0f, 61440.0f, 65536.0f, 1e30f, max, kInf}) {
    EXPECT_EQ(fp8_from_float(x, Fp8Format::E5M2), 0x7B) << x;
    EXPECT_EQ(fp8_from_float(-x, Fp8Format::E5M2), 0xFB) << -x;
  }
  // Just below the largest value rounds normally: 432 is halfway between 416 (0x7D) and 448 (0x7E) -> 448 (even).
  EXPECT_EQ(fp8_from_float(432.0f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(fp8_from_float(431.0f, Fp8Format::E4M3), 0x7D);
}

TEST(Fp8Conversion, SubnormalsAndUnderflow) {
  const float e4m3_tiny = std::ldexp(1.0f, -9), e5m2_tiny = std::ldexp(1.0f, -16);  // smallest subnormals
  for (auto [format, tiny] : {std::pair{Fp8Format::E4M3, e4m3_tiny}, std::pair{Fp8Format::E5M2, e5m2_tiny}}) {
    SCOPED_TRACE(fp8_format_name(format));
    const int max_subnormal = format == Fp8Format::E4M3 ? 7 : 3;
    EXPECT_EQ(fp8_from_float(tiny, format), 0x01);
    EXPECT_EQ(fp8_from_float(tiny / 2, format), 0x00);                             // tie: to the even zero
    EXPECT_EQ(fp8_from_float(std::nextafter(tiny / 2, 1.0f), format), 0x01);       // just above it: up
    EXPECT_EQ(fp8_from_float(-tiny / 2, format), 0x80);                            // underflow keeps the sign
    EXPECT_EQ(fp8_from_float(tiny * 1.5f, format), 0x02);                          // tie between 1 and 2: to 2
    EXPECT_EQ(fp8_from_float(tiny * max_subnormal, format), max_subnormal);        // largest subnormal
    EXPECT_EQ(fp8_from_float(tiny * (max_subnormal + 0.5f), format), max_subnormal + 1);  // tie: up to the smallest normal
    EXPECT_EQ(fp8_from_float(std::numeric_limits<float>::denorm_min(), format), 0x00);    // fp32 subnormals
    EXPECT_EQ(fp8_from_float(-std::numeric_limits<float>::denorm_min(), format), 0x80);
    EXPECT_EQ(fp8_from_float(0.0f, format), 0x00);
    EXPECT_EQ(fp8_from_float(-0.0f, format), 0x80);
  }
}

TEST(Fp8Conversion, NanAndInfinity) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::signaling_NaN(), std::bit_cast<float>(0x7F800001u),
                        std::bit_cast<float>(0xFFC12345u)};
  for (Fp8Format format : kFormats) {
    for (float nan : nans) EXPECT_EQ(fp8_from_float(nan, format), 0x7F) << std::hex << bits_of(nan);
    EXPECT_EQ(bits_of(fp8_to_float(0xFF, format)), 0x7FFFFFFFu);  // sign dropped, as CUDA does
  }
  EXPECT_EQ(fp8_from_float(kInf, Fp8Format::E5M2), 0x7B);  // saturated, not E5M2's infinity
  EXPECT_EQ(fp8_to_float(0x7C, Fp8Format::E5M2), kInf);
  for (uint8_t code : {0x7D, 0x7E, 0x7F, 0xFD}) EXPECT_TRUE(std::isnan(fp8_to_float(code, Fp8Format::E5M2)));
}

// Random fp32 inputs across and beyond each format's range (log-uniform magnitudes, random signs, plus arbitrary bit
// patterns) against the nearest-code search.
TEST(Fp8Conversion, RandomInputsMatchNearestCodeSearch) {
  std::mt19937_64 gen(42);
  std::uniform_real_distribution<double> log2_magnitude(-20.0, 18.0);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (Fp8Format format : kFormats) {
    SCOPED_TRACE(fp8_format_name(format));
    for (int i = 0; i < 100000; ++i) {
      float x = static_cast<float>(std::exp2(log2_magnitude(gen)));
      if (i % 2) x = -x;
      if (i % 5 == 0) x = std::bit_cast<float>(any_bits(gen));
      ASSERT_EQ(fp8_from_float(x, format), nearest_code_by_search(x, format)) << std::hexfloat << x;
    }
  }
}

#if defined(HGRN_WITH_CUDA)
__nv_fp8_interpretation_t cuda_interpretation(Fp8Format format) {
  return format == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
}
#endif

// CUDA's own conversion (its host code path in cuda_fp8.hpp, the same rules as the device's cvt.rn.satfinite; the
// device path itself is checked by the GPU test that uses these conversions). Inputs: every combination of sign,
// exponent and the top 7 mantissa bits (which hold every rounding position of both formats, subnormal results
// included) with low 16 bits that make exact ties, just-above and just-below ties, plus random bit patterns.
TEST(Fp8Conversion, MatchesCudaHostConversion) {
#if defined(HGRN_WITH_CUDA)
  for (Fp8Format format : kFormats) {
    SCOPED_TRACE(fp8_format_name(format));
    const auto check = [&](uint32_t bits) {
      const float x = std::bit_cast<float>(bits);
      const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, cuda_interpretation(format));
      ASSERT_EQ(fp8_from_float(x, format), want) << std::hex << "input bits 0x" << bits;
    };
    for (uint32_t high = 0; high < 0x10000u; ++high)
      for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) check(high << 16 | low);
    std::mt19937 gen(3);
    for (int i = 0; i < 1000000; ++i) check(static_cast<uint32_t>(gen()));
    for (int c = 0; c < 256; ++c) {
      __half_raw half = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), cuda_interpretation(format));
      const float want = __half2float(__half(half));
      EXPECT_EQ(bits_of(fp8_to_float(static_cast<uint8_t>(c), format)), bits_of(want)) << "code " << c;
    }
  }
#else
  GTEST_SKIP() << "this build has no CUDA headers (cuda_fp8.h) to compare with (skipped, not passed)";
#endif
}

TEST(Fp8Quantize, ScalesThenRoundsAndAmaxSkipsNan) {
  // 3 · 0.5 = 1.5 exactly, -500 saturates; 0.1f · 3 (0.3 in fp32) rounds to E4M3's nearest, 0.3125.
  const std::vector<float> x = {3.0f, 0.1f, -1000.0f, 0.0f};
  std::vector<uint8_t> q(x.size());
  fp8_quantize(x.data(), 4, 0.5f, Fp8Format::E4M3, q.data());
  EXPECT_EQ(q, (std::vector<uint8_t>{0x3C, fp8_from_float(0.1f * 0.5f, Fp8Format::E4M3), 0xFE, 0x00}));
  fp8_quantize(x.data(), 2, 3.0f, Fp8Format::E4M3, q.data());
  EXPECT_EQ(fp8_to_float(q[1], Fp8Format::E4M3), 0.3125f);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> with_nan = {1.0f, -7.5f, nan, 2.0f};
  EXPECT_EQ(fp8_amax(with_nan.data(), 4), 7.5f);
  const std::vector<float> with_inf = {1.0f, -kInf, nan};
  EXPECT_EQ(fp8_amax(with_inf.data(), 3), kInf);
  EXPECT_EQ(fp8_amax(with_nan.data(), 0), 0.0f);
  const std::vector<float> with_signalling_nan = {std::bit_cast<float>(0x7F800001u), 3.0f,
                                                  std::bit_cast<float>(0xFF800001u)};
  EXPECT_EQ(fp8_amax(with_signalling_nan.data(), 3), 3.0f);
}

// Quantising with the scale delayed scaling gives (fp8_max / amax) and dequantising with its inverse loses at most
// half a step of the format: relative 2^-4 (E4M3) or 2^-3 (E5M2) for results in the normal range.
TEST(Fp8Quantize, DequantisedValuesAreWithinHalfAStep) {
  std::mt19937_64 gen(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (Fp8Format format : kFormats) {
    std::vector<float> x(4096);
    for (float& v : x) v = normal(gen);
    const float scale = fp8_max_finite(format) / fp8_amax(x.data(), static_cast<int64_t>(x.size()));
    std::vector<uint8_t> q(x.size());
    fp8_quantize(x.data(), static_cast<int64_t>(x.size()), scale, format, q.data());
    const double min_normal = format == Fp8Format::E4M3 ? std::ldexp(1.0, -6) : std::ldexp(1.0, -14);
    const double half_step = format == Fp8Format::E4M3 ? std::ldexp(1.0, -4) : std::ldexp(1.0, -3);
    for (size_t i = 0; i < x.size(); ++i) {
      const double scaled = static_cast<double>(x[i]) * scale;
      if (std::fabs(scaled) < min_normal) continue;
      const double back = static_cast<double>(fp8_to_float(q[i], format)) * fp8_scale_inverse(scale);
      // fp32 rounding of the scale, its inverse and x·scale add a few 2^-24 relatives on top of half a step.
      EXPECT_LE(std::fabs(back - x[i]), (half_step + 4 * std::ldexp(1.0, -24)) * std::fabs(x[i])) << x[i];
    }
  }
}

// One update per step on a hand-made amax sequence; the expected scale is fp8_max / (max of the last N recorded
// steps' amaxes), worked out by hand below.
TEST(Fp8DelayedScaling, ScaleFollowsTheMaxOverTheHistoryWindow) {
  Fp8ScalingState state = fp8_scaling_state(3);
  EXPECT_EQ(state.amax_history, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(state.scale, 1.0f);
  struct Step {
    float amax;  // 0: nothing recorded this step
    float want_scale;
  };
  const Step steps[] = {
      {2.0f, 224.0f},   // window {2}
      {1.0f, 224.0f},   // {2, 1}
      {0.5f, 224.0f},   // {2, 1, 0.5}
      {0.25f, 448.0f},  // {1, 0.5, 0.25}: the 2 has left the window
      {8.0f, 56.0f},    // {0.5, 0.25, 8}
      {0.0f, 56.0f},    // nothing recorded: nothing moves
      {1.0f, 56.0f},    // {0.25, 8, 1}
      {1.0f, 56.0f},    // {8, 1, 1}
      {1.0f, 448.0f},   // {1, 1, 1}
  };
  for (const Step& step : steps) {
    if (step.amax > 0) fp8_record_amax(state, step.amax);
    fp8_update_scale(state, Fp8Format::E4M3, 0);
    EXPECT_EQ(state.scale, step.want_scale) << "after amax " << step.amax;
  }
  // The ring after 8 advancing steps of 3 slots: position 8 % 3 = 2 zeroed for the next step, the last two amaxes kept.
  EXPECT_EQ(state.position, 2);
  EXPECT_EQ(state.amax_history, (std::vector<float>{1.0f, 1.0f, 0.0f}));
}

TEST(Fp8DelayedScaling, SeveralAmaxesInOneStepKeepTheLargest) {
  Fp8ScalingState state = fp8_scaling_state(4);
  fp8_record_amax(state, 3.0f);
  fp8_record_amax(state, 7.0f);
  fp8_record_amax(state, 5.0f);
  fp8_record_amax(state, std::numeric_limits<float>::quiet_NaN());  // skipped
  EXPECT_EQ(state.amax_history[0], 7.0f);
  fp8_update_scale(state, Fp8Format::E5M2, 0);
  EXPECT_EQ(state.scale, 57344.0f / 7.0f);
  EXPECT_EQ(fp8_scale_inverse(state.scale), 1.0f / (57344.0f / 7.0f));
}

TEST(Fp8DelayedScaling, MarginDividesTheScaleByPowersOfTwo) {
  for (int margin : {0, 1, 3}) {
    Fp8ScalingState state = fp8_scaling_state(2);
    fp8_record_amax(state, 3.0f);
    fp8_update_scale(state, Fp8Format::E4M3, margin);
    EXPECT_EQ(state.scale, (448.0f / static_cast<float>(1 << margin)) / 3.0f) << "margin " << margin;
  }
  Fp8ScalingState state = fp8_scaling_state(2);
  EXPECT_THROW(fp8_update_scale(state, Fp8Format::E4M3, -1), Error);
}

TEST(Fp8DelayedScaling, ZeroNanAndInfiniteAmaxesKeepThePreviousScale) {
  Fp8ScalingState state = fp8_scaling_state(2);
  fp8_record_amax(state, 4.0f);
  fp8_update_scale(state, Fp8Format::E4M3, 0);
  ASSERT_EQ(state.scale, 112.0f);
  const Fp8ScalingState before = state;

  fp8_record_amax(state, 0.0f);  // an all-zero tensor
  fp8_update_scale(state, Fp8Format::E4M3, 0);
  EXPECT_EQ(state.scale, 112.0f);
  EXPECT_EQ(state.position, before.position);  // the history did not move
  EXPECT_EQ(state.amax_history, before.amax_history);

  fp8_record_amax(state, std::numeric_limits<float>::quiet_NaN());  // skipped: same as nothing recorded
  fp8_update_scale(state, Fp8Format::E4M3, 0);
  EXPECT_EQ(state.scale, 112.0f);
  EXPECT_EQ(state.position, before.position);

  // An infinite amax stays in the window for its N = 2 steps, and the scale with it; then the finite ones count again.
  fp8_record_amax(state, kInf);
  fp8_update_scale(state, Fp8Format::E4M3, 0);
  EXPECT_EQ(state.scale, 112.0f);
  fp8_record_amax(state, 2.0f);
  fp8_update_scale(state, Fp8Format::E4M3, 0);  // window {inf, 2}
  EXPECT_EQ(state.scale, 112.0f);
  fp8_record_amax(state, 2.0f);
  fp8_update_scale(state, Fp8Format::E4M3, 0);  // window {2, 2}
  EXPECT_EQ(state.scale, 224.0f);
}

TEST(Fp8DelayedScaling, TinyAmaxGivesTheLargestFiniteScale) {
  for (float amax : {1e-38f, std::numeric_limits<float>::denorm_min()}) {
    Fp8ScalingState state = fp8_scaling_state(1);
    fp8_record_amax(state, amax);
    fp8_update_scale(state, Fp8Format::E4M3, 0);
    EXPECT_EQ(state.scale, std::numeric_limits<float>::max()) << amax;
  }
  // Large enough for a finite scale: 448 / 2^-118 = 448 · 2^118 < 2^127.
  Fp8ScalingState state = fp8_scaling_state(1);
  fp8_record_amax(state, std::ldexp(1.0f, -118));
  fp8_update_scale(state, Fp8Format::E4M3, 0);
  EXPECT_EQ(state.scale, std::ldexp(448.0f, 118));
}

TEST(Fp8DelayedScaling, MalformedStateIsAnError) {
  EXPECT_THROW(fp8_scaling_state(0), Error);
  Fp8ScalingState state = fp8_scaling_state(4);
  state.position = 4;  // e.g. read back from a damaged checkpoint
  EXPECT_THROW(fp8_record_amax(state, 1.0f), Error);
  EXPECT_THROW(fp8_update_scale(state, Fp8Format::E4M3, 0), Error);
  state.amax_history.clear();
  state.position = 0;
  EXPECT_THROW(fp8_update_scale(state, Fp8Format::E4M3, 0), Error);
}

// By hand: A = [[1, 2], [3, 4]], B = [[1, 0.5], [-2, 1]] (E4M3, exact), scale inverses 0.5 and 0.25:
// A·B = [[-3, 2.5], [-5, 5.5]], times 0.125 = [[-0.375, 0.3125], [-0.625, 0.6875]].
TEST(Fp8Gemm, ScaleInversesMultiplyTheProduct) {
  const auto codes = [](std::vector<float> values) {
    std::vector<uint8_t> q;
    for (float v : values) q.push_back(fp8_from_float(v, Fp8Format::E4M3));
    return q;
  };
  const std::vector<uint8_t> a = codes({1, 2, 3, 4}), b = codes({1, 0.5f, -2, 1});
  std::vector<float> c(4, 0.0f);
  fp8_gemm_cpu(false, false, 2, 2, 2, a.data(), 2, Fp8Format::E4M3, 0.5f, b.data(), 2, Fp8Format::E4M3, 0.25f, 0.0f,
               c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{-0.375f, 0.3125f, -0.625f, 0.6875f}));
  const std::vector<uint8_t> e5m2 = {0x3C};
  EXPECT_THROW(fp8_gemm_cpu(false, false, 1, 1, 1, e5m2.data(), 1, Fp8Format::E5M2, 1.0f, e5m2.data(), 1,
                            Fp8Format::E5M2, 1.0f, 0.0f, c.data(), 1),
               Error);
}

// Random operands quantised with delayed-scaling scales, odd shapes, every transpose, padded leading dimensions, the
// three format pairs cuBLASLt accepts and beta 0 or 1, against fp64 on the dequantised values.
TEST(Fp8Gemm, MatchesFp64OnDequantisedValues) {
  std::mt19937_64 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape {
    int64_t m, n, k;
  };
  const std::pair<Fp8Format, Fp8Format> format_pairs[] = {
      {Fp8Format::E4M3, Fp8Format::E4M3}, {Fp8Format::E4M3, Fp8Format::E5M2}, {Fp8Format::E5M2, Fp8Format::E4M3}};
  for (Shape s : {Shape{1, 1, 1}, Shape{7, 5, 33}, Shape{17, 13, 64}}) {
    for (auto [a_format, b_format] : format_pairs) {
      for (int transposes = 0; transposes < 4; ++transposes) {
        const bool trans_a = transposes & 1, trans_b = transposes & 2;
        const float beta = transposes == 3 ? 1.0f : 0.0f;
        SCOPED_TRACE(::testing::Message() << s.m << "x" << s.n << "x" << s.k << " " << fp8_format_name(a_format) << "x"
                                          << fp8_format_name(b_format) << " trans " << trans_a << trans_b);
        // Stored shapes (rows x cols) with 3 columns of padding.
        const int64_t a_rows = trans_a ? s.k : s.m, a_cols = trans_a ? s.m : s.k, lda = a_cols + 3;
        const int64_t b_rows = trans_b ? s.n : s.k, b_cols = trans_b ? s.k : s.n, ldb = b_cols + 3, ldc = s.n + 2;
        const auto quantised = [&](int64_t rows, int64_t ld, Fp8Format format, float spread, float& scale_inv) {
          std::vector<float> x(static_cast<size_t>(rows * ld));
          for (float& v : x) v = spread * normal(gen);
          const float scale = fp8_max_finite(format) / fp8_amax(x.data(), static_cast<int64_t>(x.size()));
          scale_inv = fp8_scale_inverse(scale);
          std::vector<uint8_t> q(x.size());
          fp8_quantize(x.data(), static_cast<int64_t>(x.size()), scale, format, q.data());
          return q;
        };
        float a_scale_inv = 0, b_scale_inv = 0;
        const std::vector<uint8_t> a = quantised(a_rows, lda, a_format, 0.02f, a_scale_inv);
        const std::vector<uint8_t> b = quantised(b_rows, ldb, b_format, 5.0f, b_scale_inv);
        std::vector<float> c0(static_cast<size_t>(s.m * ldc));
        for (float& v : c0) v = normal(gen);
        std::vector<float> c = c0;
        fp8_gemm_cpu(trans_a, trans_b, s.m, s.n, s.k, a.data(), lda, a_format, a_scale_inv, b.data(), ldb, b_format,
                     b_scale_inv, beta, c.data(), ldc);
        for (int64_t i = 0; i < s.m; ++i) {
          for (int64_t j = 0; j < s.n; ++j) {
            double want = 0, magnitude = 0;
            for (int64_t p = 0; p < s.k; ++p) {
              const uint8_t qa = trans_a ? a[p * lda + i] : a[i * lda + p];
              const uint8_t qb = trans_b ? b[j * ldb + p] : b[p * ldb + j];
              const double va = static_cast<double>(fp8_to_float(qa, a_format)) * a_scale_inv;
              const double vb = static_cast<double>(fp8_to_float(qb, b_format)) * b_scale_inv;
              want += va * vb;
              magnitude += std::fabs(va * vb);
            }
            want += beta * c0[i * ldc + j];
            magnitude += std::fabs(beta * c0[i * ldc + j]);
            // fp32 summation of k exact products (k roundings of 2^-24 relative to the running sum, bounded by the sum
            // of magnitudes), the fp32 product of the two scale inverses, the scaling and the beta term: (k + 4)·2^-24.
            const double tolerance = (s.k + 4) * std::ldexp(1.0, -24) * magnitude;
            EXPECT_NEAR(c[i * ldc + j], want, tolerance) << "C[" << i << "," << j << "]";
          }
          for (int64_t j = s.n; j < ldc; ++j) EXPECT_EQ(c[i * ldc + j], c0[i * ldc + j]) << "padding written";
        }
      }
    }
  }
}

}  // namespace
}  // namespace hgrn
