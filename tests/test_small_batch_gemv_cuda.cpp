// test_small_batch_gemv_cuda.cpp: the small-batch matrix-vector product (kernels/small_batch_gemv.h) against fp64
// sums of the very values the GPU sees, every element within its own error bound, for 1 to 8 rows, fp32 and bf16,
// with and without accumulation (and one row of weights large enough for the wide blocks), written into a column
// block of a wider buffer whose other columns must stay untouched; its bits repeating launch to launch; and
// linear_product_into with a few rows (which takes it) against the same call on the CPU, also with its input
// normalised or gated as the GEMV stages it (normed_ and swiglu_linear_product_into); and a norm's weights read from
// shared memory or through L2 giving the same bits. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/rmsnorm.h"
#include "ops/linear.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/small_batch_gemv.h"
#endif

namespace hgrn {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;
using testing::to_host_f64;

#ifdef HGRN_WITH_CUDA
struct GemvOperands {
  Tensor x, w, y0;  // fp64 host tensors holding values exact in the dtype: x [B, K], w [N, K], y0 [B, width]
};

constexpr int64_t kFirstColumn = 5, kExtraColumns = 11;  // the output block's place in its wider buffer

GemvOperands random_operands(int64_t B, int64_t K, int64_t N, DType dtype) {
  Rng rng(B * 1009 + K * 31 + N);
  return {round_through(random_tensor(rng, {B, K}), dtype), round_through(random_tensor(rng, {N, K}, 0.1), dtype),
          round_through(random_tensor(rng, {B, N + kExtraColumns}), dtype)};
}

// The kernel's result: y0 on the GPU with columns [kFirstColumn, kFirstColumn + N) of each row (+)= x·wᵀ.
Tensor run_gemv(const GemvOperands& o, DType dtype, bool accumulate, const GemvInput* input = nullptr) {
  const int64_t B = o.x.size(0), K = o.x.size(1), N = o.w.size(0), width = o.y0.size(1);
  const Tensor x = to_gpu(o.x, dtype), w = to_gpu(o.w, dtype);
  Tensor y = to_gpu(o.y0, dtype);
  EXPECT_TRUE(small_batch_gemv_applies(B, N, K, x.raw_data(), w.raw_data(), dtype));
  cuda_small_batch_gemv(x.raw_data(), w.raw_data(), y.columns(kFirstColumn, N).raw_data(), dtype, width, B, N, K,
                        dtype, accumulate, input);
  return y;
}

// Each element against its fp64 sum: fp32 sums of the K exact products (and y_old) are off by at most (K + 2)·2^-24
// of the sum of their magnitudes (a summation's worst case, whatever the order, with the final rounding to fp32), and
// a bf16 output adds its rounding, at most half a bf16 ulp: 2^-8 relative. The other columns keep y0's bits.
void check_gemv(int64_t B, int64_t K, int64_t N, DType dtype, bool accumulate) {
  SCOPED_TRACE(::testing::Message() << "B " << B << " K " << K << " N " << N << " " << dtype_name(dtype)
                                    << (accumulate ? ", accumulating" : ""));
  const GemvOperands o = random_operands(B, K, N, dtype);
  const Tensor got = to_host_f64(run_gemv(o, dtype, accumulate));
  const int64_t width = o.y0.size(1);
  const double* x = o.x.data<double>();
  const double* w = o.w.data<double>();
  const double* y0 = o.y0.data<double>();
  const double* y = got.data<double>();
  int64_t bad = 0, changed = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < width; ++c) {
      const int64_t at = b * width + c;
      const int64_t j = c - kFirstColumn;
      if (j < 0 || j >= N) {
        changed += y[at] != y0[at];
        continue;
      }
      double want = accumulate ? y0[at] : 0.0, magnitude = std::fabs(want);
      for (int64_t k = 0; k < K; ++k) {
        want += x[b * K + k] * w[j * K + k];
        magnitude += std::fabs(x[b * K + k] * w[j * K + k]);
      }
      const double sum_error = static_cast<double>(K + 2) * std::ldexp(magnitude, -24);
      const double bound = dtype == DType::BF16 ? sum_error + std::ldexp(std::fabs(want) + sum_error, -8) : sum_error;
      if (!(std::fabs(y[at] - want) <= bound) && bad++ < 5)
        ADD_FAILURE() << "row " << b << " column " << j << ": " << y[at] << ", want " << want << " within " << bound;
    }
  EXPECT_EQ(bad, 0) << "elements outside their bound";
  EXPECT_EQ(changed, 0) << "elements outside the output block changed";
}
#endif

TEST(SmallBatchGemvCuda, MatchesFp64SumsWithinTheirBounds) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t B : {1, 3, 8})
      for (int64_t K : {8, 1024, 2816})
        for (int64_t N : {1, 37, 1024, 3072})
          for (bool accumulate : {false, true}) check_gemv(B, K, N, dtype, accumulate);
#endif
}

// One row of weights past kSmallBatchGemvWideBytes takes the wide blocks: the same bounds, an odd column count.
TEST(SmallBatchGemvCuda, OneRowOfLargeWeightsMatchesFp64Sums) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  constexpr int64_t K = 2048;
  for (DType dtype : {DType::F32, DType::BF16}) {
    const int64_t N = kSmallBatchGemvWideBytes / (K * static_cast<int64_t>(dtype_size(dtype))) + 3;
    for (bool accumulate : {false, true}) check_gemv(1, K, N, dtype, accumulate);
  }
#endif
}

// The sums' order is fixed by the shapes: two launches give the same bits.
TEST(SmallBatchGemvCuda, RepeatsItsBits) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  for (DType dtype : {DType::F32, DType::BF16}) {
    const GemvOperands o = random_operands(8, 2816, 1024, dtype);
    const Tensor a = run_gemv(o, dtype, true).to(Device::CPU), b = run_gemv(o, dtype, true).to(Device::CPU);
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << dtype_name(dtype);
  }
#endif
}

// The norm's weights are copied into shared memory before the kernel waits where they are 16-byte aligned, and read
// through L2 where they are not: both give the same bits (the same values in the same order), at 1 to 8 rows, fp32
// and bf16, k from one warp's packs to more than a block's threads'.
TEST(SmallBatchGemvCuda, NormWeightsInSharedMemoryGiveTheBitsOfTheGlobalRead) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t B : {1, 3, 8})
      for (int64_t K : {64, 1024, 2816})
        for (int64_t N : {37, 1000}) {
          SCOPED_TRACE(::testing::Message() << "B " << B << " K " << K << " N " << N << " " << dtype_name(dtype));
          const GemvOperands o = random_operands(B, K, N, dtype);
          Rng rng(K * 3 + N);
          // The same K weights at the start of one buffer (aligned) and one float into another (unaligned).
          Tensor weights = random_tensor(rng, {K}, 0.3), shifted = Tensor::zeros({K + 1}, DType::F64);
          for (int64_t i = 0; i < K; ++i) shifted.data<double>()[i + 1] = weights.data<double>()[i] += 1.0;
          const Tensor gpu_weights = to_gpu(weights, DType::F32), gpu_shifted = to_gpu(shifted, DType::F32);
          GemvInput aligned, unaligned;
          aligned.norm_weight = static_cast<const float*>(gpu_weights.raw_data());
          unaligned.norm_weight = static_cast<const float*>(gpu_shifted.raw_data()) + 1;
          aligned.eps = unaligned.eps = 1e-6f;
          const Tensor a = run_gemv(o, dtype, true, &aligned).to(Device::CPU);
          const Tensor b = run_gemv(o, dtype, true, &unaligned).to(Device::CPU);
          EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
        }
#endif
}

// What it does not take, the GEMM does: more than kSmallBatchGemvMaxRows rows, k off the 16-byte pack, unaligned
// operands, x's rows too wide for a block's shared memory.
TEST(SmallBatchGemvCuda, RefusesWhatItDoesNotTake) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  const Tensor x = Tensor::empty({8, 1 << 16}, DType::BF16, Device::CUDA);
  const char* p = static_cast<const char*>(x.raw_data());
  EXPECT_TRUE(small_batch_gemv_applies(8, 64, 1024, p, p, DType::BF16));
  EXPECT_FALSE(small_batch_gemv_applies(kSmallBatchGemvMaxRows + 1, 64, 1024, p, p, DType::BF16));
  EXPECT_FALSE(small_batch_gemv_applies(1, 64, 1020, p, p, DType::BF16));
  EXPECT_TRUE(small_batch_gemv_applies(1, 64, 1020, p, p, DType::F32));
  EXPECT_FALSE(small_batch_gemv_applies(1, 64, 1024, p + 2, p, DType::BF16));
  EXPECT_FALSE(small_batch_gemv_applies(1, 64, 1024, p, p + 8, DType::BF16));
  EXPECT_FALSE(small_batch_gemv_applies(8, 64, 1 << 16, p, p, DType::BF16));
#endif
}

// linear_product_into with a few rows on the GPU (the small-batch GEMV) against the same call on the CPU in fp64, on
// the rounded values the GPU sees: weights adjacent (one block) or apart (a block each, the second at column 96),
// fresh or accumulating. fp32: summation order alone, 1e-5 relative RMS; bf16: the output's rounding, 2^-8 relative
// at most, so 1e-2 relative RMS and 0.05·sqrt(in) absolute (test_linear_cuda.cpp's bounds).
TEST(SmallBatchGemvCuda, LinearProductIntoMatchesTheCpu) {
  HGRN_SKIP_WITHOUT_GPU();
  const int64_t in = 1000;
  const std::vector<int64_t> outs{96, 200};
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t rows : {1, 5, 8})
      for (bool adjacent : {true, false})
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", " << rows << " rows"
                                            << (adjacent ? ", adjacent" : ", apart")
                                            << (accumulate ? ", accumulating" : ""));
          Rng rng(rows * 7 + adjacent * 2 + accumulate);
          const Tensor x = round_through(random_tensor(rng, {rows, in}), dtype);
          const Tensor w = round_through(random_tensor(rng, {296, in}, 0.1), dtype);
          const Tensor y0 = round_through(random_tensor(rng, {rows, 296}), dtype);
          const Tensor w_gpu = to_gpu(w, dtype);
          std::vector<Tensor> cpu_weights, gpu_weights;
          int64_t row = 0;
          for (int64_t out : outs) {
            cpu_weights.push_back(w.rows(row, out));
            gpu_weights.push_back(adjacent ? w_gpu.rows(row, out) : to_gpu(w.rows(row, out), dtype));
            row += out;
          }
          Tensor want = y0.clone();
          linear_product_into(x, cpu_weights, want, accumulate);
          Tensor got = to_gpu(y0, dtype);
          linear_product_into(to_gpu(x, dtype), gpu_weights, got, accumulate);
          const bool f32 = dtype == DType::F32;
          expect_close(got, want, f32 ? 1e-5 : 1e-2, f32 ? 1e-4 : 0.05 * std::sqrt(in), "y");
        }
}

// bf16 inputs into an fp32 output (decoding's logits): linear_product_into takes the GEMV for a few rows and the
// GEMM for more, both against fp64 sums of the bf16 values; the output is never rounded to bf16, so fp32's bounds
// apply (summation order alone: 1e-5 relative RMS, 1e-4 absolute), plain and, where the GEMV takes it, with the input
// normalised inside.
TEST(SmallBatchGemvCuda, Bf16IntoFp32MatchesTheCpu) {
  HGRN_SKIP_WITHOUT_GPU();
  const int64_t in = 1024, out = 777;
  for (int64_t rows : {1, 8, 9})
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows" << (accumulate ? ", accumulating" : ""));
      Rng rng(rows * 13 + accumulate);
      const Tensor x = round_through(random_tensor(rng, {rows, in}), DType::BF16);
      const Tensor w = round_through(random_tensor(rng, {out, in}, 0.1), DType::BF16);
      const Tensor y0 = round_through(random_tensor(rng, {rows, out}), DType::F32);
      Tensor want = y0.clone();
      linear_product_into(x, {w}, want, accumulate);
      Tensor got = to_gpu(y0, DType::F32);
      linear_product_into(to_gpu(x, DType::BF16), {to_gpu(w, DType::BF16)}, got, accumulate);
      ASSERT_EQ(got.dtype(), DType::F32);
      expect_close(got, want, 1e-5, 1e-4, "y");
      // The norm made inside. The GEMV (1 and 8 rows) sums x·w in fp32 and scales each sum by rstd: the normed input
      // is never rounded, so fp32's bounds apply against the unrounded norm. The composition (9 rows: the norm's
      // kernel, then the GEMM) rounds its stored output to bf16 before the product, and so does its reference.
      const bool in_gemv = rows <= 8;
      Tensor norm_weight = Tensor::full({in}, 1.0, DType::F64);
      Tensor want_normed = y0.clone(), scratch = Tensor::empty({rows, in}, DType::F64);
      Tensor rstd = Tensor::empty({rows}, DType::F64);
      rmsnorm_forward_into(x, &norm_weight, 1e-6, scratch, rstd);
      const Tensor normed = in_gemv ? scratch : round_through(scratch, DType::BF16);
      linear_product_into(normed, {w}, want_normed, accumulate);
      Tensor got_normed = to_gpu(y0, DType::F32), gpu_scratch = Tensor::empty({rows, in}, DType::BF16, Device::CUDA);
      Tensor gpu_rstd = Tensor::empty({rows}, DType::F32, Device::CUDA);
      normed_linear_product_into(to_gpu(x, DType::BF16), to_gpu(norm_weight, DType::F32), 1e-6, gpu_scratch, gpu_rstd,
                                 {to_gpu(w, DType::BF16)}, got_normed, accumulate);
      // Composed, a normed value near a bf16 rounding boundary may round the other way (the norm's rstd differs in
      // its last bits): a few such elements, 2^-8 relative each, bound the sum at 1e-3 relative RMS.
      if (in_gemv)
        expect_close(got_normed, want_normed, 1e-5, 1e-4, "normed y");
      else
        expect_close(got_normed, want_normed, 1e-3, 1e-2 * std::sqrt(in), "normed y");
    }
}

// normed_linear_product_into and swiglu_linear_product_into on the GPU (the GEMV makes the input as it stages x; at 9
// rows the GEMM reads the input's op's output) against the same calls on the CPU in fp64, with linear_product_into's
// bounds above plus the input's own rounding to bf16 (2^-9 relative per element). gate and up are column blocks of one
// [rows, 2·in] buffer, as decoding's gate/up projection writes them. The gated input matches the GPU composition
// (swiglu_forward, then linear_product_into) bit for bit: the same staged values, the same sums.
TEST(SmallBatchGemvCuda, InputsMadeInTheProductMatchTheCpu) {
  HGRN_SKIP_WITHOUT_GPU();
  const int64_t in = 1000, out = 296;
  for (DType dtype : {DType::F32, DType::BF16})
    for (int64_t rows : {1, 5, 8, 9})
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", " << rows << " rows"
                                          << (accumulate ? ", accumulating" : ""));
        Rng rng(rows * 11 + accumulate);
        const Tensor x = round_through(random_tensor(rng, {rows, in}), dtype);
        const Tensor gate_up = round_through(random_tensor(rng, {rows, 2 * in}, 2.0), dtype);
        Tensor norm_weight = round_through(random_tensor(rng, {in}, 0.3), DType::F32);
        for (int64_t i = 0; i < in; ++i) norm_weight.data<double>()[i] += 1.0;
        const Tensor w = round_through(random_tensor(rng, {out, in}, 0.1), dtype);
        const Tensor y0 = round_through(random_tensor(rng, {rows, out}), dtype);
        const bool f32 = dtype == DType::F32;
        const double rel = f32 ? 1e-5 : 1.5e-2, abs = f32 ? 1e-4 : 0.05 * std::sqrt(in);
        const Tensor w_gpu = to_gpu(w, dtype), norm_gpu = to_gpu(norm_weight, DType::F32);
        {
          Tensor want = y0.clone(), scratch = Tensor::empty({rows, in}, DType::F64);
          Tensor rstd = Tensor::empty({rows}, DType::F64);
          normed_linear_product_into(x, norm_weight, 1e-6, scratch, rstd, {w}, want, accumulate);
          Tensor got = to_gpu(y0, dtype), gpu_scratch = Tensor::empty({rows, in}, dtype, Device::CUDA);
          Tensor gpu_rstd = Tensor::empty({rows}, DType::F32, Device::CUDA);
          normed_linear_product_into(to_gpu(x, dtype), norm_gpu, 1e-6, gpu_scratch, gpu_rstd, {w_gpu}, got, accumulate);
          expect_close(got, want, rel, abs, "normed y");
        }
        {
          Tensor want = y0.clone(), scratch = Tensor::empty({rows, in}, DType::F64);
          swiglu_linear_product_into(gate_up.columns(0, in), gate_up.columns(in, in), scratch, {w}, want, accumulate);
          const Tensor gu = to_gpu(gate_up, dtype);
          Tensor got = to_gpu(y0, dtype), gpu_scratch = Tensor::empty({rows, in}, dtype, Device::CUDA);
          swiglu_linear_product_into(gu.columns(0, in), gu.columns(in, in), gpu_scratch, {w_gpu}, got, accumulate);
          expect_close(got, want, rel, abs, "gated y");
          Tensor composed = to_gpu(y0, dtype), hidden = Tensor::empty({rows, in}, dtype, Device::CUDA);
          const Tensor up = gu.columns(in, in);
          swiglu_forward(gu.columns(0, in), &up, hidden);
          linear_product_into(hidden, {w_gpu}, composed, accumulate);
          const Tensor a = got.to(Device::CPU), b = composed.to(Device::CPU);
          EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "the gated product's bits";
        }
      }
}

}  // namespace
}  // namespace hgrn
