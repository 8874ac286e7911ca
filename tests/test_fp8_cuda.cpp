// test_fp8_cuda.cpp: the GPU FP8 pieces (kernels/fp8.h) against the CPU reference (ops/fp8.h): the scaled cast bit for
// bit on a sweep of fp32 bit patterns and every rounding boundary, its amax, the transposed cast, the transpose of
// codes, the delayed-scaling update over hand-made and random histories, and the three FP8 GEMMs of a linear layer (and
// the general one with padded rows) against fp8_gemm_cpu within tolerances; the GEMM's refusal of shapes cuBLASLt's FP8
// kernels cannot take. GPU tests skip without a GPU; the refusals are checked before any GPU call and run in every CUDA
// build.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "core/dtype.h"
#include "gpu_test.h"
#include "ops/fp8.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/fp8.h"
#endif

namespace hgrn {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::E4M3, Fp8Format::E5M2};
constexpr float kInf = std::numeric_limits<float>::infinity();

#ifdef HGRN_WITH_CUDA
// Raw device memory for FP8 codes (no Tensor dtype holds them) and the other flat arrays; poisoned (0xFF bytes) in
// tests, so an unwritten output byte shows. Copies are ordered on the compute stream and finished on return.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes), ptr_(device_alloc(std::max<size_t>(bytes, 1), Device::CUDA)) {}
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    device_copy(ptr_, Device::CUDA, host.data(), Device::CPU, bytes_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { device_free(ptr_, Device::CUDA); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> to_host() const {
    std::vector<T> host(bytes_ / sizeof(T));
    device_copy(host.data(), Device::CPU, ptr_, Device::CUDA, host.size() * sizeof(T));
    return host;
  }

 private:
  size_t bytes_;
  void* ptr_;
};

// x as the GPU reads it: fp32, or bf16 (then the reference quantises the bf16 values widened to fp32).
struct DeviceInput {
  std::vector<float> values;  // what the cast sees
  DeviceBuffer buffer;
};
DeviceInput device_input(const std::vector<float>& x, DType dtype) {
  if (dtype == DType::F32) return {x, DeviceBuffer(x)};
  std::vector<bf16> rounded(x.size());
  std::vector<float> seen(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    rounded[i] = bf16(x[i]);
    seen[i] = static_cast<float>(rounded[i]);
  }
  return {seen, DeviceBuffer(rounded)};
}

// The first index where two code arrays differ (for a readable failure), or -1.
int64_t first_mismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) return static_cast<int64_t>(i);
  return -1;
}

std::vector<float> normal_values(std::mt19937_64& gen, int64_t n, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(gen);
  return x;
}

// The fp32 inputs of the cast sweep: 2^20 bit patterns spread over all 2^32 (pattern i·2^12 plus a pseudo-random low
// part, so that the dropped mantissa bits are not always zero), and every edge of both formats: each midpoint between
// neighbouring codes and one fp32 step either side of it, both signs, the saturation thresholds, zeros, fp32
// subnormals, infinities and NaNs.
std::vector<float> sweep_inputs() {
  std::vector<float> x;
  x.reserve((1u << 20) + 4096);
  for (uint32_t i = 0; i < (1u << 20); ++i) x.push_back(std::bit_cast<float>((i << 12) | ((i * 2654435761u) >> 20)));
  for (Fp8Format format : kFormats) {
    const int max_code = format == Fp8Format::E4M3 ? 0x7E : 0x7B;
    for (int lo = 0; lo < max_code; ++lo) {
      const float lo_value = fp8_to_float(static_cast<uint8_t>(lo), format);
      const float hi_value = fp8_to_float(static_cast<uint8_t>(lo + 1), format);
      const float mid = (lo_value + hi_value) / 2;
      for (float v : {lo_value, mid, std::nextafter(mid, lo_value), std::nextafter(mid, hi_value)}) {
        x.push_back(v);
        x.push_back(-v);
      }
    }
    const float max = fp8_max_finite(format);
    for (float v : {max, std::nextafter(max, kInf), max * 1.0625f, max * 1.125f, std::nextafter(max * 1.125f, kInf),
                    max * 4}) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  for (float v : {0.0f, std::numeric_limits<float>::denorm_min(), FLT_MIN, std::nextafter(FLT_MIN, 0.0f), FLT_MAX,
                  kInf}) {
    x.push_back(v);
    x.push_back(-v);
  }
  for (uint32_t bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu})
    x.push_back(std::bit_cast<float>(bits));
  return x;
}
#endif

// The device cast is the instruction fp8_from_float mirrors: equal code for code on the sweep, at scale 1 (the plain
// conversion) and at scales that move values across the range (the product rounded to fp32 first, as fp8_quantize
// does). The amax of the sweep is infinite (NaNs skipped); Fp8CastCuda.AmaxSkipsNanAndFolds checks finite ones.
TEST(Fp8CastCuda, EqualsTheReferenceOnASweepOfFp32Patterns) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  const std::vector<float> x = sweep_inputs();
  const int64_t n = static_cast<int64_t>(x.size());
  const DeviceBuffer device_x(x);
  for (Fp8Format format : kFormats) {
    for (float scale : {1.0f, 0.3f, 1.0f / 448.0f, 3071.5f}) {
      SCOPED_TRACE(detail::concat(fp8_format_name(format), " scale ", scale));
      std::vector<uint8_t> want(x.size());
      fp8_quantize(x.data(), n, scale, format, want.data());
      const DeviceBuffer device_scale(std::vector<float>{scale}), amax(std::vector<float>{0.0f}),
          out(x.size());
      cuda_fp8_quantize(device_x.as<float>(), DType::F32, n, device_scale.as<float>(), format, out.as<uint8_t>(),
                        amax.as<float>());
      const std::vector<uint8_t> got = out.to_host<uint8_t>();
      const int64_t bad = first_mismatch(got, want);
      EXPECT_EQ(bad, -1) << "x = " << std::hexfloat << x[bad < 0 ? 0 : bad] << " (bits 0x" << std::hex
                         << std::bit_cast<uint32_t>(x[bad < 0 ? 0 : bad]) << "): GPU code 0x"
                         << int{got[bad < 0 ? 0 : bad]} << ", reference 0x" << int{want[bad < 0 ? 0 : bad]};
      EXPECT_EQ(amax.to_host<float>()[0], fp8_amax(x.data(), n));
      EXPECT_EQ(fp8_amax(x.data(), n), kInf);
    }
  }
#endif
}

// Random fp32 and bf16 tensors of odd sizes, through the packed and the unpacked path (a view one element in): codes
// equal fp8_quantize's and the amax equals fp8_amax exactly (a max is exact in any order). The amax folds into the
// value already there: a larger one stays, a smaller one is replaced; a NaN element is skipped and an infinity kept.
TEST(Fp8CastCuda, AmaxSkipsNanAndFolds) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  std::mt19937_64 gen(7);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}, int64_t{(1 << 20) + 3}}) {
      for (int64_t offset : {int64_t{0}, int64_t{1}}) {
        for (Fp8Format format : kFormats) {
          SCOPED_TRACE(detail::concat(dtype_name(dtype), " n ", n, " offset ", offset, " ", fp8_format_name(format)));
          std::vector<float> host = normal_values(gen, n + offset, 3.0f);
          if (n > 100) host[static_cast<size_t>(offset + n / 2)] = std::numeric_limits<float>::quiet_NaN();
          const DeviceInput input = device_input(host, dtype);
          const float* x = input.values.data() + offset;
          const float scale = fp8_max_finite(format) / 11.0f;  // values beyond 11 saturate
          std::vector<uint8_t> want(static_cast<size_t>(n));
          fp8_quantize(x, n, scale, format, want.data());
          const float want_amax = fp8_amax(x, n);
          const DeviceBuffer device_scale(std::vector<float>{scale}), out(static_cast<size_t>(n) + 1);
          const size_t element = dtype_size(dtype);
          const void* device_x = input.buffer.as<char>() + offset * element;
          for (float initial : {0.0f, want_amax * 0.5f, want_amax * 2.0f}) {
            const DeviceBuffer amax(std::vector<float>{initial});
            // The output one byte in where the input is: an unaligned output goes unpacked too.
            cuda_fp8_quantize(device_x, dtype, n, device_scale.as<float>(), format, out.as<uint8_t>() + offset,
                              amax.as<float>());
            std::vector<uint8_t> got = out.to_host<uint8_t>();
            got.erase(got.begin(), got.begin() + offset);
            got.resize(static_cast<size_t>(n));
            EXPECT_EQ(first_mismatch(got, want), -1) << "initial amax " << initial;
            EXPECT_EQ(amax.to_host<float>()[0], std::max(initial, want_amax)) << "initial amax " << initial;
          }
        }
      }
    }
  }
  // An infinity is kept; a null amax pointer only casts.
  const std::vector<float> host{1.0f, -kInf, 2.0f, std::numeric_limits<float>::quiet_NaN()};
  const DeviceBuffer x(host), scale(std::vector<float>{1.0f}), amax(std::vector<float>{0.0f}), out(host.size());
  cuda_fp8_quantize(x.as<float>(), DType::F32, 4, scale.as<float>(), Fp8Format::E5M2, out.as<uint8_t>(),
                    amax.as<float>());
  EXPECT_EQ(amax.to_host<float>()[0], kInf);
  cuda_fp8_quantize(x.as<float>(), DType::F32, 4, scale.as<float>(), Fp8Format::E4M3, out.as<uint8_t>(), nullptr);
  EXPECT_EQ(out.to_host<uint8_t>(), (std::vector<uint8_t>{0x38, 0xFE, 0x40, 0x7F}));
#endif
}

// The transposed cast on odd shapes (one tile, partial tiles, a single row or column, the packed path, and shapes with
// more row tiles than blocks): out_t[c, r] and out[r, c] are fp8_quantize's code of x[r, c], the amax fp8_amax's.
TEST(Fp8CastCuda, TransposedCastMatchesTheReference) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  struct Shape2 {
    int64_t rows, cols;
  };
  std::mt19937_64 gen(11);
  for (Shape2 s : {Shape2{1, 1}, Shape2{1, 33}, Shape2{33, 1}, Shape2{32, 32}, Shape2{31, 65}, Shape2{100, 17},
                   Shape2{257, 130}, Shape2{1500, 2048},
                   // the packed path (cols % 8 == 0, rows % 16 == 0): whole and partial tiles
                   Shape2{16, 8}, Shape2{64, 64}, Shape2{208, 136}, Shape2{2048, 1024},
                   // more row tiles than blocks: blocks stride over them, packed and not
                   Shape2{4352, 1024}, Shape2{4500, 1000}}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (Fp8Format format : kFormats) {
        for (bool with_out : {true, false}) {
          SCOPED_TRACE(detail::concat(s.rows, "x", s.cols, " ", dtype_name(dtype), " ", fp8_format_name(format),
                                      with_out ? " with out" : " transpose only"));
          const int64_t n = s.rows * s.cols;
          const DeviceInput input = device_input(normal_values(gen, n, 2.0f), dtype);
          const float scale = 0.75f * fp8_max_finite(format) / 8.0f;
          std::vector<uint8_t> want(static_cast<size_t>(n)), want_t(static_cast<size_t>(n));
          fp8_quantize(input.values.data(), n, scale, format, want.data());
          for (int64_t r = 0; r < s.rows; ++r)
            for (int64_t c = 0; c < s.cols; ++c) want_t[c * s.rows + r] = want[r * s.cols + c];
          const DeviceBuffer device_scale(std::vector<float>{scale}), amax(std::vector<float>{0.0f}),
              out(static_cast<size_t>(n)), out_t(static_cast<size_t>(n));
          cuda_fp8_quantize_transpose(input.buffer.as<void>(), dtype, s.rows, s.cols, device_scale.as<float>(), format,
                                      with_out ? out.as<uint8_t>() : nullptr, out_t.as<uint8_t>(), amax.as<float>());
          EXPECT_EQ(first_mismatch(out_t.to_host<uint8_t>(), want_t), -1) << "transposed codes";
          if (with_out) {
            EXPECT_EQ(first_mismatch(out.to_host<uint8_t>(), want), -1) << "codes";
          }
          EXPECT_EQ(amax.to_host<float>()[0], fp8_amax(input.values.data(), n));
        }
      }
    }
  }
#endif
}

// The transpose of codes (a weight's, for its input gradient) on multiples of 16 that are not whole tiles (the packed
// path), one with more row tiles than blocks, and odd shapes (the unpacked path), of random bytes: exactly the host's
// transpose, since bytes are only moved.
TEST(Fp8CastCuda, CodeTransposeEqualsTheHostTranspose) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  struct Shape2 {
    int64_t rows, cols;
  };
  std::mt19937_64 gen(13);
  for (Shape2 s : {Shape2{16, 48}, Shape2{48, 16}, Shape2{80, 208}, Shape2{1024, 2816}, Shape2{4352, 1024},
                   Shape2{1, 1}, Shape2{33, 17}, Shape2{100, 72}}) {
    SCOPED_TRACE(detail::concat(s.rows, "x", s.cols));
    const int64_t n = s.rows * s.cols;
    std::vector<uint8_t> codes(static_cast<size_t>(n)), want_t(static_cast<size_t>(n));
    for (uint8_t& c : codes) c = static_cast<uint8_t>(gen());
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t c = 0; c < s.cols; ++c) want_t[c * s.rows + r] = codes[r * s.cols + c];
    const DeviceBuffer device_codes(codes), codes_t(static_cast<size_t>(n));
    cuda_fp8_transpose_codes(device_codes.as<uint8_t>(), s.rows, s.cols, codes_t.as<uint8_t>());
    EXPECT_EQ(first_mismatch(codes_t.to_host<uint8_t>(), want_t), -1);
  }
#endif
}

#ifdef HGRN_WITH_CUDA
// States of one history length, each in a situation fp8_update_scale treats apart (see ops/fp8.h), then random ones.
std::vector<Fp8ScalingState> hand_made_states(int64_t length, std::mt19937_64& gen) {
  const auto state = [&](std::vector<float> history, int64_t position, float scale) {
    Fp8ScalingState s = fp8_scaling_state(length);
    for (int64_t i = 0; i < length; ++i) s.amax_history[i] = history[static_cast<size_t>(i) % history.size()];
    s.position = position % length;
    s.scale = scale;
    return s;
  };
  std::vector<Fp8ScalingState> states = {
      fp8_scaling_state(length),                              // fresh: nothing recorded, nothing moves
      state({0.5f, 3.0f, 1.25f}, 1, 1.0f),                    // an ordinary step
      state({2.0f, 7.0f, 0.25f}, length - 1, 4.0f),           // the ring wraps around
      state({0.5f, kInf, 1.0f}, 0, 8.0f),                     // an infinite amax in the window: the scale stays
      state({1e-42f}, 0, 1.0f),                               // a subnormal amax: the scale overflows to FLT_MAX
      state({0.0f, 5.0f}, 0, 2.0f),                           // the current slot is 0: nothing moves
      state({kInf}, 0, kInf),                                 // an infinite scale (a bad checkpoint) becomes FLT_MAX
      state({3.0f, 0.0f, 9.0f, 1.0f, 0.0f}, 2, 0.125f),       // zeros in the window
  };
  std::uniform_real_distribution<float> log_amax(-20.0f, 20.0f);
  for (int i = 0; i < 24; ++i) {
    Fp8ScalingState s = fp8_scaling_state(length);
    for (float& a : s.amax_history) a = std::exp2(log_amax(gen));
    s.position = static_cast<int64_t>(gen() % static_cast<uint64_t>(length));
    s.scale = std::exp2(log_amax(gen));
    states.push_back(s);
  }
  return states;
}

struct DeviceStates {
  DeviceBuffer history, positions, scales;
};
DeviceStates upload(const std::vector<Fp8ScalingState>& states) {
  std::vector<float> history, scales;
  std::vector<int64_t> positions;
  for (const Fp8ScalingState& s : states) {
    history.insert(history.end(), s.amax_history.begin(), s.amax_history.end());
    positions.push_back(s.position);
    scales.push_back(s.scale);
  }
  return {DeviceBuffer(history), DeviceBuffer(positions), DeviceBuffer(scales)};
}

// Bit for bit: every history slot, position and scale of every state.
void expect_same_states(const DeviceStates& got, const std::vector<Fp8ScalingState>& want, const std::string& when) {
  const std::vector<float> history = got.history.to_host<float>(), scales = got.scales.to_host<float>();
  const std::vector<int64_t> positions = got.positions.to_host<int64_t>();
  size_t slot = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    EXPECT_EQ(positions[t], want[t].position) << when << ", tensor " << t;
    EXPECT_EQ(std::bit_cast<uint32_t>(scales[t]), std::bit_cast<uint32_t>(want[t].scale))
        << when << ", tensor " << t << ": scale " << scales[t] << ", reference " << want[t].scale;
    for (float a : want[t].amax_history)
      EXPECT_EQ(std::bit_cast<uint32_t>(history[slot++]), std::bit_cast<uint32_t>(a)) << when << ", tensor " << t;
  }
}
#endif

// The update kernel against fp8_update_scale: first on the hand-made states alone (no step amaxes), then over 12
// steps in which each tensor's step amax (zero, NaN, infinite or ordinary) is recorded and the scales updated, for
// both formats, margins 0 and 3, and history lengths 1, 5 and 1024 (Transformer Engine's default).
TEST(Fp8ScalingCuda, UpdateEqualsTheReference) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  std::mt19937_64 gen(5);
  for (int64_t length : {int64_t{1}, int64_t{5}, int64_t{1024}}) {
    for (Fp8Format format : kFormats) {
      for (int margin : {0, 3}) {
        const std::string name = detail::concat("length ", length, " ", fp8_format_name(format), " margin ", margin);
        std::vector<Fp8ScalingState> want = hand_made_states(length, gen);
        const int64_t tensors = static_cast<int64_t>(want.size());
        DeviceStates got = upload(want);
        for (Fp8ScalingState& s : want) fp8_update_scale(s, format, margin);
        cuda_fp8_update_scales(got.history.as<float>(), length, got.positions.as<int64_t>(), got.scales.as<float>(),
                               nullptr, tensors, format, margin);
        expect_same_states(got, want, name + ", hand-made states");
        std::uniform_real_distribution<float> log_amax(-30.0f, 30.0f);
        for (int step = 0; step < 12; ++step) {
          std::vector<float> step_amax(static_cast<size_t>(tensors));
          for (size_t t = 0; t < step_amax.size(); ++t) {
            const uint64_t kind = gen() % 8;
            step_amax[t] = kind == 0   ? 0.0f
                           : kind == 1 ? std::numeric_limits<float>::quiet_NaN()
                           : kind == 2 && step == 3 ? kInf
                                                    : std::exp2(log_amax(gen));
            fp8_record_amax(want[t], step_amax[t]);
            fp8_update_scale(want[t], format, margin);
          }
          const DeviceBuffer device_step_amax(step_amax);
          cuda_fp8_update_scales(got.history.as<float>(), length, got.positions.as<int64_t>(), got.scales.as<float>(),
                                 device_step_amax.as<float>(), tensors, format, margin);
          expect_same_states(got, want, detail::concat(name, ", step ", step));
          const std::vector<float> cleared = device_step_amax.to_host<float>();
          EXPECT_TRUE(std::all_of(cleared.begin(), cleared.end(), [](float a) { return a == 0.0f; }))
              << name << ", step " << step << ": the step amaxes are reset for the next step";
        }
      }
    }
  }
#endif
}

#ifdef HGRN_WITH_CUDA
// Tolerances of the GPU FP8 GEMM against fp8_gemm_cpu: the FP8 products are exact in both, only the summation differs.
// Hopper's FP8 tensor cores keep partial sums to about 14 significant bits. Without fast accumulation cuBLASLt
// promotes them to fp32 every few k-steps: an error of a few 2^-14 of a partial sum, far below 2e-3 relative RMS.
// With fast accumulation they stay in the tensor cores for the whole k, and the truncations add up, about
// (k / 32) · 2^-14 relative: 4e-3 at k = 2048; 2e-2 leaves a margin of 5. A bf16 output adds its rounding, at most
// 2^-9 relative per element. The largest error is bounded the same way relative to the largest output.
struct GemmTolerance {
  double rel_rms, max_abs_of_max;
};
GemmTolerance gemm_tolerance(bool fast_accumulation, DType out_dtype) {
  GemmTolerance tol = fast_accumulation ? GemmTolerance{2e-2, 5e-2} : GemmTolerance{2e-3, 1e-2};
  if (out_dtype == DType::BF16) tol = {tol.rel_rms + 3e-3, tol.max_abs_of_max + std::ldexp(1.0, -8)};
  return tol;
}

// Codes of a row-major [rows, cols] matrix of normal values quantised with the scale that maps its amax to the
// format's largest value (as delayed scaling converges to), and the transposed codes.
struct QuantisedMatrix {
  std::vector<uint8_t> codes, codes_t;
  Fp8Format format;
  float scale_inverse;
};
QuantisedMatrix quantised(std::mt19937_64& gen, int64_t rows, int64_t cols, float stddev, Fp8Format format) {
  const std::vector<float> x = normal_values(gen, rows * cols, stddev);
  QuantisedMatrix q{std::vector<uint8_t>(x.size()), std::vector<uint8_t>(x.size()), format, 0.0f};
  const float scale = fp8_max_finite(format) / fp8_amax(x.data(), rows * cols);
  q.scale_inverse = fp8_scale_inverse(scale);
  fp8_quantize(x.data(), rows * cols, scale, format, q.codes.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) q.codes_t[c * rows + r] = q.codes[r * cols + c];
  return q;
}

// The GPU output (fp32 or bf16 on the device) as fp32 values, [rows, cols] with leading dimension ld.
std::vector<float> output_values(const DeviceBuffer& out, DType dtype, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> values(static_cast<size_t>(rows * cols));
  if (dtype == DType::F32) {
    const std::vector<float> all = out.to_host<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) values[r * cols + c] = all[r * ld + c];
  } else {
    const std::vector<bf16> all = out.to_host<bf16>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) values[r * cols + c] = static_cast<float>(all[r * ld + c]);
  }
  return values;
}

// The starting output in dtype (bf16-rounded where the GPU holds bf16) with leading dimension ld, and the fp32
// values the reference accumulates onto.
struct StartingOutput {
  std::vector<float> reference;  // [rows, cols], dense
  DeviceBuffer device;
};
StartingOutput starting_output(std::mt19937_64& gen, DType dtype, int64_t rows, int64_t cols, int64_t ld) {
  const std::vector<float> x = normal_values(gen, rows * ld, 1.0f);
  std::vector<float> reference(static_cast<size_t>(rows * cols));
  if (dtype == DType::F32) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) reference[r * cols + c] = x[r * ld + c];
    return {reference, DeviceBuffer(x)};
  }
  std::vector<bf16> rounded(x.size());
  for (size_t i = 0; i < x.size(); ++i) rounded[i] = bf16(x[i]);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) reference[r * cols + c] = static_cast<float>(rounded[r * ld + c]);
  return {reference, DeviceBuffer(rounded)};
}

void expect_gemm_close(const std::vector<float>& got, const std::vector<float>& want, bool fast_accumulation,
                       DType out_dtype, const std::string& what) {
  const GemmTolerance tol = gemm_tolerance(fast_accumulation, out_dtype);
  double diff2 = 0, want2 = 0, max_diff = 0, max_want = 0;
  int64_t non_finite = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++non_finite;
      continue;
    }
    const double d = static_cast<double>(got[i]) - want[i];
    diff2 += d * d;
    want2 += static_cast<double>(want[i]) * want[i];
    max_diff = std::max(max_diff, std::fabs(d));
    max_want = std::max(max_want, std::fabs(static_cast<double>(want[i])));
  }
  EXPECT_EQ(non_finite, 0) << what << ": NaN/Inf (or unwritten, poisoned) elements";
  EXPECT_LE(std::sqrt(diff2 / want2), tol.rel_rms) << what << ": relative RMS error (max abs " << max_diff << ")";
  EXPECT_LE(max_diff, tol.max_abs_of_max * max_want) << what << ": max abs error (largest output " << max_want << ")";
}
#endif

// The three GEMMs of a linear layer on sizes that are multiples of 16 but of no tile size (and one with a long k for
// the weight gradient), X and W in E4M3 and dY in E5M2, fp32 and bf16 outputs, with and without fast accumulation; the
// weight gradient also accumulating onto an existing dW (beta = 1). The reference is fp8_gemm_cpu on the same codes.
TEST(Fp8GemmCuda, LinearLayerGemmsMatchTheReference) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  struct Sizes {
    int64_t rows, in, out;
  };
  std::mt19937_64 gen(3);
  for (Sizes s : {Sizes{16, 16, 16}, Sizes{48, 80, 112}, Sizes{272, 208, 400}, Sizes{2048, 144, 96}}) {
    const QuantisedMatrix x = quantised(gen, s.rows, s.in, 1.0f, Fp8Format::E4M3);
    const QuantisedMatrix w = quantised(gen, s.out, s.in, 0.02f, Fp8Format::E4M3);
    const QuantisedMatrix dy = quantised(gen, s.rows, s.out, 1e-4f, Fp8Format::E5M2);
    const DeviceBuffer x_codes(x.codes), x_codes_t(x.codes_t), w_codes(w.codes), w_codes_t(w.codes_t),
        dy_codes(dy.codes), dy_codes_t(dy.codes_t), x_scale_inv(std::vector<float>{x.scale_inverse}),
        w_scale_inv(std::vector<float>{w.scale_inverse}), dy_scale_inv(std::vector<float>{dy.scale_inverse});
    for (DType out_dtype : {DType::F32, DType::BF16}) {
      for (bool fast : {false, true}) {
        const std::string name = detail::concat("rows ", s.rows, " in ", s.in, " out ", s.out, " -> ",
                                                dtype_name(out_dtype), fast ? " fast accumulation" : "");
        // Y = X·Wᵀ
        std::vector<float> want(static_cast<size_t>(s.rows * s.out), 0.0f);
        fp8_gemm_cpu(false, true, s.rows, s.out, s.in, x.codes.data(), s.in, x.format, x.scale_inverse,
                     w.codes.data(), s.in, w.format, w.scale_inverse, 0.0f, want.data(), s.out);
        DeviceBuffer y(want.size() * dtype_size(out_dtype));
        cuda_fp8_linear_gemm(Fp8LinearGemm::Forward, s.rows, s.in, s.out,
                             {x_codes.as<uint8_t>(), x.format, x_scale_inv.as<float>()},
                             {w_codes.as<uint8_t>(), w.format, w_scale_inv.as<float>()}, 0.0f, y.as<void>(),
                             out_dtype, fast);
        expect_gemm_close(output_values(y, out_dtype, s.rows, s.out, s.out), want, fast, out_dtype, name + ": Y");
        // dX = dY·W, from dY and Wᵀ
        want.assign(static_cast<size_t>(s.rows * s.in), 0.0f);
        fp8_gemm_cpu(false, false, s.rows, s.in, s.out, dy.codes.data(), s.out, dy.format, dy.scale_inverse,
                     w.codes.data(), s.in, w.format, w.scale_inverse, 0.0f, want.data(), s.in);
        DeviceBuffer dx(want.size() * dtype_size(out_dtype));
        cuda_fp8_linear_gemm(Fp8LinearGemm::InputGrad, s.rows, s.in, s.out,
                             {dy_codes.as<uint8_t>(), dy.format, dy_scale_inv.as<float>()},
                             {w_codes_t.as<uint8_t>(), w.format, w_scale_inv.as<float>()}, 0.0f, dx.as<void>(),
                             out_dtype, fast);
        expect_gemm_close(output_values(dx, out_dtype, s.rows, s.in, s.in), want, fast, out_dtype, name + ": dX");
        // dW (+)= dYᵀ·X, from dYᵀ and Xᵀ
        for (float beta : {0.0f, 1.0f}) {
          StartingOutput dw = starting_output(gen, out_dtype, s.out, s.in, s.in);
          want = beta != 0.0f ? dw.reference : std::vector<float>(dw.reference.size(), 0.0f);
          fp8_gemm_cpu(true, false, s.out, s.in, s.rows, dy.codes.data(), s.out, dy.format, dy.scale_inverse,
                       x.codes.data(), s.in, x.format, x.scale_inverse, beta, want.data(), s.in);
          cuda_fp8_linear_gemm(Fp8LinearGemm::WeightGrad, s.rows, s.in, s.out,
                               {dy_codes_t.as<uint8_t>(), dy.format, dy_scale_inv.as<float>()},
                               {x_codes_t.as<uint8_t>(), x.format, x_scale_inv.as<float>()}, beta,
                               dw.device.as<void>(), out_dtype, fast);
          expect_gemm_close(output_values(dw.device, out_dtype, s.out, s.in, s.in), want, fast, out_dtype,
                            detail::concat(name, ": dW, beta ", beta));
        }
      }
    }
  }
#endif
}

// The general GEMM with padded rows (leading dimensions past the row) and the format pairs the layer GEMMs do not
// use in that order (E4M3 x E5M2 with the E5M2 operand second), the padding of the output left untouched.
TEST(Fp8GemmCuda, PaddedRowsAndEveryFormatPair) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  std::mt19937_64 gen(9);
  const int64_t m = 80, n = 48, k = 96, lda = k + 32, ldb = k + 16, ldc = n + 16;
  const std::pair<Fp8Format, Fp8Format> pairs[] = {{Fp8Format::E4M3, Fp8Format::E4M3},
                                                    {Fp8Format::E4M3, Fp8Format::E5M2},
                                                    {Fp8Format::E5M2, Fp8Format::E4M3}};
  for (auto [a_format, b_format] : pairs) {
    for (DType out_dtype : {DType::F32, DType::BF16}) {
      const std::string name = detail::concat(fp8_format_name(a_format), " x ", fp8_format_name(b_format), " -> ",
                                              dtype_name(out_dtype));
      const QuantisedMatrix a = quantised(gen, m, lda, 1.0f, a_format), b = quantised(gen, n, ldb, 0.5f, b_format);
      const DeviceBuffer a_codes(a.codes), b_codes(b.codes), a_scale_inv(std::vector<float>{a.scale_inverse}),
          b_scale_inv(std::vector<float>{b.scale_inverse});
      StartingOutput c = starting_output(gen, out_dtype, m, ldc, ldc);  // the padding columns included
      const std::vector<float> before = c.reference;
      std::vector<float> want(static_cast<size_t>(m * n));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = 0; col < n; ++col) want[r * n + col] = before[r * ldc + col];
      fp8_gemm_cpu(false, true, m, n, k, a.codes.data(), lda, a_format, a.scale_inverse, b.codes.data(), ldb, b_format,
                   b.scale_inverse, 0.5f, want.data(), n);
      cuda_fp8_gemm(m, n, k, {a_codes.as<uint8_t>(), a_format, a_scale_inv.as<float>()}, lda,
                    {b_codes.as<uint8_t>(), b_format, b_scale_inv.as<float>()}, ldb, 0.5f, c.device.as<void>(), ldc,
                    out_dtype, false);
      expect_gemm_close(output_values(c.device, out_dtype, m, n, ldc), want, false, out_dtype, name);
      const std::vector<float> after = output_values(c.device, out_dtype, m, ldc, ldc);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = n; col < ldc; ++col)
          ASSERT_EQ(after[r * ldc + col], before[r * ldc + col]) << name << ": padding written at " << r << ", " << col;
      // The addend read from another buffer (c_in): the same sums into the output, the addend left as it was.
      const StartingOutput addend = starting_output(gen, out_dtype, m, ldc, ldc);
      StartingOutput d = starting_output(gen, out_dtype, m, ldc, ldc);
      std::vector<float> want_apart(static_cast<size_t>(m * n));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t col = 0; col < n; ++col) want_apart[r * n + col] = addend.reference[r * ldc + col];
      fp8_gemm_cpu(false, true, m, n, k, a.codes.data(), lda, a_format, a.scale_inverse, b.codes.data(), ldb, b_format,
                   b.scale_inverse, 0.5f, want_apart.data(), n);
      cuda_fp8_gemm(m, n, k, {a_codes.as<uint8_t>(), a_format, a_scale_inv.as<float>()}, lda,
                    {b_codes.as<uint8_t>(), b_format, b_scale_inv.as<float>()}, ldb, 0.5f, d.device.as<void>(), ldc,
                    out_dtype, false, addend.device.as<void>());
      expect_gemm_close(output_values(d.device, out_dtype, m, n, ldc), want_apart, false, out_dtype,
                        name + ", addend apart");
      EXPECT_EQ(output_values(addend.device, out_dtype, m, ldc, ldc), addend.reference) << name << ": addend written";
    }
  }
#endif
}

// What cuBLASLt's FP8 kernels cannot take is an hgrn::Error naming the GEMM and its sizes, raised before any GPU call
// (so this runs in every CUDA build, GPU or not). The operand addresses are never dereferenced: all-zero-low-bit
// stand-ins pass the alignment checks.
TEST(Fp8GemmCuda, RefusesShapesCublasLtCannotTake) {
#ifndef HGRN_WITH_CUDA
  GTEST_SKIP() << "this build has no CUDA backend (skipped, not passed)";
#else
  const auto address = [](uintptr_t a) { return reinterpret_cast<uint8_t*>(a); };
  const float* scale = reinterpret_cast<const float*>(address(0x1000));
  const Fp8Matrix e4m3{address(0x10000), Fp8Format::E4M3, scale}, e5m2{address(0x20000), Fp8Format::E5M2, scale};
  void* out = address(0x30000);
  const auto expect_refused = [](const auto& call, std::vector<std::string> fragments) {
    try {
      call();
      ADD_FAILURE() << "not refused; expected an error containing " << fragments.front();
    } catch (const Error& e) {
      for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
    }
  };
  // The layer's sizes, each in turn not a multiple of 16.
  expect_refused([&] { cuda_fp8_linear_gemm(Fp8LinearGemm::Forward, 100, 64, 32, e4m3, e4m3, 0, out, DType::F32, 0); },
                 {"fp8 linear forward", "rows 100, in_features 64, out_features 32", "multiples of 16"});
  expect_refused(
      [&] { cuda_fp8_linear_gemm(Fp8LinearGemm::InputGrad, 64, 40, 32, e5m2, e4m3, 0, out, DType::BF16, 0); },
      {"fp8 linear input gradient", "in_features 40", "multiples of 16"});
  expect_refused(
      [&] { cuda_fp8_linear_gemm(Fp8LinearGemm::WeightGrad, 64, 48, 24, e5m2, e4m3, 1, out, DType::F32, 0); },
      {"fp8 linear weight gradient", "out_features 24", "multiples of 16"});
  expect_refused([&] { cuda_fp8_linear_gemm(Fp8LinearGemm::Forward, 0, 64, 32, e4m3, e4m3, 0, out, DType::F32, 0); },
                 {"rows 0", "positive multiples of 16"});
  // Format pair, output dtype, leading dimensions, alignment, null pointers.
  expect_refused([&] { cuda_fp8_linear_gemm(Fp8LinearGemm::InputGrad, 64, 64, 64, e5m2, e5m2, 0, out, DType::F32, 0); },
                 {"E5M2 x E5M2"});
  expect_refused([&] { cuda_fp8_linear_gemm(Fp8LinearGemm::Forward, 64, 64, 64, e4m3, e4m3, 0, out, DType::F64, 0); },
                 {"fp32 or bf16"});
  expect_refused([&] { cuda_fp8_gemm(32, 32, 32, e4m3, 40, e4m3, 32, 0, out, 32, DType::F32, false); },
                 {"lda 40", "16-byte aligned"});
  expect_refused([&] { cuda_fp8_gemm(32, 32, 32, e4m3, 32, e4m3, 32, 0, out, 36, DType::BF16, false); },
                 {"ldc 36", "ldc of 8"});
  expect_refused([&] { cuda_fp8_gemm(32, 32, 32, e4m3, 16, e4m3, 32, 0, out, 32, DType::F32, false); },
                 {"lda 16", "smaller than its row"});
  expect_refused(
      [&] {
        cuda_fp8_gemm(32, 32, 32, {address(0x10008), Fp8Format::E4M3, scale}, 32, e4m3, 32, 0, out, 32, DType::F32,
                      false);
      },
      {"16-byte aligned"});
  expect_refused(
      [&] {
        cuda_fp8_gemm(32, 32, 32, {nullptr, Fp8Format::E4M3, scale}, 32, e4m3, 32, 0, out, 32, DType::F32, false);
      },
      {"null"});
  const float* scale_off16 = reinterpret_cast<const float*>(address(0x1004));
  expect_refused(
      [&] {
        cuda_fp8_gemm(32, 32, 32, e4m3, 32, {address(0x10000), Fp8Format::E4M3, scale_off16}, 32, 0, out, 32,
                      DType::F32, false);
      },
      {"scale pointers must be 16-byte aligned"});
#endif
}

}  // namespace
}  // namespace hgrn
