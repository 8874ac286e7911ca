// test_layernorm_cuda.cpp: the CUDA layernorm (kernels/layernorm.cu) against the fp64 CPU reference computed from the
// same (rounded) inputs: fp32 and bf16 activations with fp32 weight and bias, odd row counts and widths, with and
// without weight and bias, gradients written fresh or added onto existing ones; the parameter gradients' bits repeat
// run to run. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/rng.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/layernorm.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::round_through;
using testing::to_gpu;

constexpr double kEps = 1e-5;

// Tolerances for act-dtype results (y, dx): fp32 differs from fp64 by float rounding of O(width) sums (tight); bf16 by
// the final rounding to bf16 (2^-9 relative per element) of values up to ~10.
double act_rel(DType dtype) { return dtype == DType::F32 ? 1e-5 : 1e-2; }
double act_abs(DType dtype) { return dtype == DType::F32 ? 1e-4 : 1e-1; }

TEST(LayerNormCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(401);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 63, 65, 2047}) {
      for (int64_t width : {1, 33, 192, 771, 2048}) {
        for (int variant = 0; variant < 3; ++variant) {  // weight and bias; neither; existing gradients added onto
          const bool with_params = variant != 1, accumulate = variant == 2;
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << rows << " width=" << width
                                            << (with_params ? " weight+bias" : " no params")
                                            << (accumulate ? " accumulated" : ""));
          // The values the GPU sees: activations rounded to the act dtype, the parameters to fp32. x has a mean off
          // zero, which the centring must remove.
          Tensor x = round_through(testing::random_tensor(rng, {rows, width}, 2.0), dtype);
          for (int64_t i = 0; i < x.numel(); ++i) x.set_item(i, x.item(i) + 3.0);
          x = round_through(x, dtype);
          const Tensor w = round_through(testing::random_tensor(rng, {width}), DType::F32);
          const Tensor b = round_through(testing::random_tensor(rng, {width}), DType::F32);
          const Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), dtype);
          const Tensor dx0 = round_through(testing::random_tensor(rng, {rows, width}, 0.5), dtype);
          const Tensor dw0 = round_through(testing::random_tensor(rng, {width}, 0.5), DType::F32);
          const Tensor db0 = round_through(testing::random_tensor(rng, {width}, 0.5), DType::F32);

          Tape ref_tape;
          Var rx = make_var(x, true, "x");
          Var rw = with_params ? make_var(w, true, "weight") : nullptr;
          Var rb = with_params ? make_var(b, true, "bias") : nullptr;
          if (accumulate) {
            rx->grad = dx0.clone();
            rw->grad = dw0.clone();
            rb->grad = db0.clone();
          }
          Var ry = layernorm(ref_tape, rx, rw, rb, kEps);
          ref_tape.backward(ry, dy);

          Tape tape;
          Var gx = make_var(to_gpu(x, dtype), true, "x");
          Var gw = with_params ? make_var(to_gpu(w, DType::F32), true, "weight") : nullptr;
          Var gb = with_params ? make_var(to_gpu(b, DType::F32), true, "bias") : nullptr;
          if (accumulate) {
            gx->grad = to_gpu(dx0, dtype);
            gw->grad = to_gpu(dw0, DType::F32);
            gb->grad = to_gpu(db0, DType::F32);
          }
          Var gy = layernorm(tape, gx, gw, gb, kEps);
          ASSERT_EQ(gy->value.device(), Device::CUDA);
          ASSERT_EQ(gy->value.dtype(), dtype);
          tape.backward(gy, to_gpu(dy, dtype));

          expect_close(gy->value, ry->value, act_rel(dtype), act_abs(dtype), "y");
          if (width == 1 && with_params) {
            // x̂ = 0, so dx = rstd·(w·dy − mean(w·dy)) (+ dx0) cancels exactly; fp32 rounds the two terms apart (fused
            // or not) and rstd = eps^(-1/2) amplifies that: a few ulps of w·dy times rstd, absolute.
            double max_wdy = 0;
            for (int64_t r = 0; r < rows; ++r) max_wdy = std::max(max_wdy, std::fabs(w.item(0) * dy.item(r)));
            const double bound = dtype == DType::F32 ? 8.0 * 0x1p-24 * max_wdy / std::sqrt(kEps) : act_abs(dtype);
            const testing::Discrepancy d = testing::compare(gx->grad, rx->grad);
            EXPECT_EQ(d.non_finite, 0);
            EXPECT_LE(d.max_abs, bound) << "dx, width 1";
          } else {
            expect_close(gx->grad, rx->grad, act_rel(dtype), act_abs(dtype), "dx");
          }
          if (with_params) {
            ASSERT_EQ(gw->grad.dtype(), DType::F32);
            ASSERT_EQ(gb->grad.dtype(), DType::F32);
            // fp32 sums over rows of fp32 products of exactly the reference's inputs (bf16 values are exact in fp32),
            // x̂ from fp32 statistics: tight for both act dtypes; the abs bound allows ~2047-term sums of size ~50.
            expect_close(gw->grad, rw->grad, 1e-5, 1e-3, "dweight");
            expect_close(gb->grad, rb->grad, 1e-5, 1e-3, "dbias");
          }
        }
      }
    }
  }
}

// The parameter gradients are reduced without atomics in a fixed order: two runs give the same bits (dx too). Many
// rows, so the reduction spans many row chunks.
TEST(LayerNormCuda, GradientsAreBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(402);
  const int64_t rows = 8192 + 17, width = 384;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
    const Tensor w = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
    const Tensor b = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
    const Tensor dy = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
    Tensor first[3];
    for (int run = 0; run < 2; ++run) {
      Tape tape;
      Var gx = make_var(x, true, "x"), gw = make_var(w, true, "weight"), gb = make_var(b, true, "bias");
      tape.backward(layernorm(tape, gx, gw, gb, kEps), dy);
      const Tensor got[3] = {gx->grad.to(Device::CPU), gw->grad.to(Device::CPU), gb->grad.to(Device::CPU)};
      for (int k = 0; k < 3; ++k) {
        if (run == 0)
          first[k] = got[k];
        else
          EXPECT_EQ(std::memcmp(got[k].raw_data(), first[k].raw_data(), got[k].nbytes()), 0)
              << "gradient " << k << " differs between runs";
      }
    }
  }
}

// A GPU weight or bias (a parameter) is fp32 whatever the activation dtype.
TEST(LayerNormCuda, RefusesNonFp32Parameters) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(403);
  Tape tape;
  const Var x = make_var(to_gpu(testing::random_tensor(rng, {3, 8}), DType::BF16));
  const Var w = make_var(to_gpu(testing::random_tensor(rng, {8}), DType::BF16));
  EXPECT_THROW(layernorm(tape, x, w, nullptr, kEps), Error);
  EXPECT_NO_THROW(layernorm(tape, x, make_var(to_gpu(testing::random_tensor(rng, {8}), DType::F32)), nullptr, kEps));
}

}  // namespace
}  // namespace hgrn
