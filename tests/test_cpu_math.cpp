// test_cpu_math.cpp: the CPU ops' fp32 exp, expm1 and log1p (ops/cpu_math.h) against fp64 values rounded once to
// fp32, over their ranges and at special values; their fp64 forms are the C library's.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "ops/cpu_math.h"

namespace hgrn {
namespace {

// How many fp32 steps apart a and b are (both finite, same sign or zero).
int64_t ulps_apart(float a, float b) {
  const auto key = [](float f) {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? static_cast<int64_t>(INT32_MIN) - i : static_cast<int64_t>(i);
  };
  return std::abs(key(a) - key(b));
}

// Over `count` inputs from [lo, hi] (every third also scaled towards 0 by up to 2^-40): the fp32 function against the
// fp64 one rounded to fp32 (correctly rounded but for rare double-rounding cases). All within 1 ulp; almost all equal
// (the fp64 evaluation's error is below 1e-12 relative, so it rounds the other way only within that of a midpoint).
template <typename F32, typename F64>
void expect_rounded_from_fp64(const char* name, F32 f32, F64 f64, double lo, double hi) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> dist(lo, hi);
  constexpr int kCount = 400000;
  int differ = 0;
  for (int i = 0; i < kCount; ++i) {
    float x = static_cast<float>(dist(gen));
    if (i % 3 == 0) x = std::ldexp(x, -static_cast<int>(gen() % 41));
    const float want = static_cast<float>(f64(static_cast<double>(x)));
    const float got = f32(x);
    ASSERT_LE(ulps_apart(got, want), 1) << name << "(" << x << "): " << got << ", expected " << want;
    differ += got != want;
  }
  EXPECT_LE(differ, kCount / 100000) << name << ": not the correctly rounded value in " << differ << " of " << kCount;
}

TEST(CpuMath, Fp32ExpIsCorrectlyRoundedAlmostEverywhere) {
  expect_rounded_from_fp64("exp", [](float x) { return cpu_exp(x); }, [](double x) { return std::exp(x); }, -103.0,
                           88.7);
}

TEST(CpuMath, Fp32Expm1KeepsRelativePrecisionNearZero) {
  expect_rounded_from_fp64("expm1", [](float x) { return cpu_expm1(x); }, [](double x) { return std::expm1(x); },
                           -30.0, 20.0);
  EXPECT_EQ(cpu_expm1(1e-30f), 1e-30f);
  EXPECT_EQ(cpu_expm1(-0.0f), 0.0f);
}

TEST(CpuMath, Fp32Log1pOnItsDomain) {
  expect_rounded_from_fp64("log1p", [](float x) { return cpu_log1p(x); }, [](double x) { return std::log1p(x); },
                           -0.5, 1.0);
  EXPECT_EQ(cpu_log1p(0.0f), 0.0f);
  EXPECT_EQ(cpu_log1p(1e-30f), 1e-30f);
  EXPECT_EQ(cpu_log1p(1.0f), static_cast<float>(std::log(2.0)));
}

TEST(CpuMath, Fp32SpecialValues) {
  constexpr float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(cpu_exp(0.0f), 1.0f);
  EXPECT_EQ(cpu_exp(kInf), kInf);
  EXPECT_EQ(cpu_exp(-kInf), 0.0f);
  EXPECT_EQ(cpu_exp(89.0f), kInf);    // overflows fp32
  EXPECT_EQ(cpu_exp(1e30f), kInf);    // beyond the clamp
  EXPECT_EQ(cpu_exp(-1e30f), 0.0f);
  EXPECT_EQ(cpu_exp(-104.0f), 0.0f);  // below the smallest subnormal
  EXPECT_EQ(cpu_exp(-100.0f), static_cast<float>(std::exp(-100.0)));  // subnormal, rounded once
  EXPECT_EQ(cpu_expm1(-kInf), -1.0f);
  EXPECT_EQ(cpu_expm1(kInf), kInf);
  EXPECT_TRUE(std::isnan(cpu_exp(kNan)));
  EXPECT_TRUE(std::isnan(cpu_expm1(kNan)));
  EXPECT_TRUE(std::isnan(cpu_log1p(kNan)));
}

TEST(CpuMath, Fp64IsTheCLibrary) {
  for (double x : {-700.0, -3.5, -1e-12, 0.0, 0.3, 2.0, 700.0}) {
    EXPECT_EQ(cpu_exp(x), std::exp(x));
    EXPECT_EQ(cpu_expm1(x), std::expm1(x));
  }
  for (double z : {-0.5, -1e-12, 0.0, 0.25, 1.0}) EXPECT_EQ(cpu_log1p(z), std::log1p(z));
}

}  // namespace
}  // namespace hgrn
