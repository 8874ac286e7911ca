// cpu_math.h: what the CPU ops' element loops need to vectorise: exp, expm1 and log1p, the sigmoid and log-sigmoid
// made of them, and HGRN_VECTOR_CLONES.
// exp, expm1 and log1p: fp64 calls the C library. fp32 is evaluated in fp64 with no branches, tables or calls, so
// that a loop over it vectorises, and rounded once to fp32: the result is the correctly rounded value except where
// the exact one lies within ~1e-12 (relative) of a rounding boundary, at least as accurate as the C library's fp32
// functions (which are not correctly rounded either).
#pragma once
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

// On a function of element loops: also compiled for AVX-512 and AVX2 machines, the version picked when the program
// loads, the baseline build's (x86-64-v2) elsewhere. Only for loops whose every result is computed by the same
// operations whatever the vector width — no reduction whose order the compiler picks (omp simd reduction); sums in
// explicit lanes are fine — so that every machine gets the same bits (the build has -ffp-contract=off: no fused
// multiply-adds where the CPU offers them).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HGRN_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HGRN_VECTOR_CLONES
#endif

namespace hgrn {
namespace cpu_math_detail {

// e^x = scale · (1 + em1) with scale = 2^k and em1 = e^r − 1, r = x − k·ln 2 in [−ln2/2, ln2/2], for x in fp64 from
// an fp32 number. x is clamped to ±150, beyond which every fp32 result is 0 or inf anyway; NaN passes through.
struct ExpParts {
  double scale, em1;
};

// c[0]·t^(N−1) + … + c[N−1] by Horner's rule, highest coefficient first (unrolled, so that the callers' element
// loops still vectorise and cost what the written-out polynomial did).
template <size_t N>
__attribute__((always_inline)) inline double horner(const std::array<double, N>& c, double t) {
  double p = c[0];
#pragma GCC unroll 32
  for (size_t i = 1; i < N; ++i) p = p * t + c[i];
  return p;
}
__attribute__((always_inline)) inline ExpParts exp_parts(double x) {
  constexpr double kLog2e = 1.4426950408889634;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // ln 2 with its low 32 bits zero: k·kLn2Hi is exact
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kRoundShift = 0x1.8p52;  // adding it rounds to an integer, which lands in the low mantissa bits
  // (In this form the clamp leaves the loop vectorisable: GCC turns a pair of min/max bounds into branches.)
  x = std::fabs(x) > 150.0 ? std::copysign(150.0, x) : x;
  const double shifted = x * kLog2e + kRoundShift;
  const uint64_t k_bits = std::bit_cast<uint64_t>(shifted);
  const double k = shifted - kRoundShift;
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // e^r − 1 = r·(1 + r/2! + … + r^10/11!): Taylor to r^11, truncation below 1e-13 relative on |r| <= ln2/2.
  constexpr std::array<double, 11> kTaylor = {1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
                                              1.0 / 5040.0,     1.0 / 720.0,     1.0 / 120.0,    1.0 / 24.0,
                                              1.0 / 6.0,        0.5,             1.0};
  return {std::bit_cast<double>((k_bits + 1023) << 52), r * horner(kTaylor, r)};
}

}  // namespace cpu_math_detail

// e^x; fp32 as described above.
inline double cpu_exp(double x) { return std::exp(x); }
inline float cpu_exp(float x) {
  const cpu_math_detail::ExpParts e = cpu_math_detail::exp_parts(x);
  return static_cast<float>(e.scale + e.scale * e.em1);
}

// e^x − 1 with full relative precision near 0 (k = 0 there: scale − 1 is exactly 0).
inline double cpu_expm1(double x) { return std::expm1(x); }
inline float cpu_expm1(float x) {
  const cpu_math_detail::ExpParts e = cpu_math_detail::exp_parts(x);
  return static_cast<float>((e.scale - 1.0) + e.scale * e.em1);
}

// log(1 + z) for z in [−1/2, 1] (the fp32 form is only accurate there; the callers' arguments are e^{−|x|} and
// similar): 2·atanh(s), s = z / (2 + z) in [−1/3, 1/3], as its odd series to s^21 (truncation below 2e-12 relative).
inline double cpu_log1p(double z) { return std::log1p(z); }
inline float cpu_log1p(float z) {
  const double s = static_cast<double>(z) / (2.0 + static_cast<double>(z));
  constexpr std::array<double, 11> kOddSeries = {1.0 / 21.0, 1.0 / 19.0, 1.0 / 17.0, 1.0 / 15.0, 1.0 / 13.0, 1.0 / 11.0,
                                                 1.0 / 9.0,  1.0 / 7.0,  1.0 / 5.0,  1.0 / 3.0,  1.0};
  return static_cast<float>(2.0 * s * cpu_math_detail::horner(kOddSeries, s * s));
}

// The logistic sigmoid without overflow: exp is only ever taken of a non-positive number. Written without a branch so
// that element loops over it vectorise.
template <typename T>
inline T stable_sigmoid(T x) {
  const T e = cpu_exp(-std::abs(x));
  return (x >= T(0) ? T(1) : e) / (T(1) + e);
}

// log σ(x) = min(x, 0) − log1p(e^{−|x|}): exp only of a non-positive number, no cancellation for large |x|.
template <typename T>
inline T stable_log_sigmoid(T x) {
  return (T(0) < x ? T(0) : x) - cpu_log1p(cpu_exp(-std::abs(x)));  // std::min(x, 0) as a select
}

}  // namespace hgrn
