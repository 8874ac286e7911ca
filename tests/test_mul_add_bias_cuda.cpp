// test_mul_add_bias_cuda.cpp: the CUDA kernels of the complex HGRU's small ops (sigmoid, the elementwise product and
// the bias add) against the fp64 CPU reference computed from the same (rounded) inputs: fp32 and bf16 activations
// (the bias fp32), odd sizes and widths (the packed bulk and the unpacked tail), gradients written fresh or added
// onto existing ones, mul(x, x); the bias gradient's bits repeat run to run. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/rng.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/elementwise.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::round_through;
using testing::to_gpu;

// Results stored in the act dtype, each computed in fp32 from exactly the reference's inputs and rounded once: fp32
// differs from fp64 by a few ulp (2^-23 relative) of one product or exponential; bf16 by that one rounding, at most
// 2^-8 of the value (RMS about 1.5e-3 of it). The max abs bound scales with the reference's largest entry.
void expect_act_close(const Tensor& got, const Tensor& want, DType dtype, const std::string& what) {
  const double rel = dtype == DType::F32 ? 1e-6 : 4e-3;
  expect_close(got, want, rel, rel * testing::max_abs(want), what);
}

const int64_t kShapes[][2] = {{1, 1}, {3, 7}, {5, 64}, {17, 96}, {33, 1001}};

std::string case_name(DType dtype, int64_t rows, int64_t width, bool accumulate) {
  return std::string(dtype_name(dtype)) + " rows=" + std::to_string(rows) + " width=" + std::to_string(width) +
         (accumulate ? " accumulated" : "");
}

TEST(SigmoidCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(501);
  for (DType dtype : {DType::F32, DType::BF16})
    for (const auto& shape : kShapes)
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(case_name(dtype, shape[0], shape[1], accumulate));
        const Tensor x = round_through(testing::random_tensor(rng, {shape[0], shape[1]}, 4.0), dtype);
        const Tensor dy = round_through(testing::random_tensor(rng, {shape[0], shape[1]}), dtype);
        const Tensor dx0 = round_through(testing::random_tensor(rng, {shape[0], shape[1]}), dtype);
        Tape ref_tape, tape;
        Var rx = make_var(x, true, "x"), gx = make_var(to_gpu(x, dtype), true, "x");
        if (accumulate) {
          rx->grad = dx0.clone();
          gx->grad = to_gpu(dx0, dtype);
        }
        Var ry = sigmoid(ref_tape, rx), gy = sigmoid(tape, gx);
        ref_tape.backward(ry, dy);
        tape.backward(gy, to_gpu(dy, dtype));
        ASSERT_EQ(gy->value.dtype(), dtype);
        expect_act_close(gy->value, ry->value, dtype, "y");
        // The backward reads the stored output y: dx = dy · y · (1 − y) from the GPU's y (in bf16, 1 − y near
        // saturation keeps few bits, which is the op's design, not the kernel's error).
        const Tensor y = testing::to_host_f64(gy->value);
        Tensor want = accumulate ? dx0.clone() : Tensor::zeros(x.shape(), DType::F64);
        for (int64_t i = 0; i < want.numel(); ++i)
          want.set_item(i, want.item(i) + dy.item(i) * y.item(i) * (1.0 - y.item(i)));
        expect_act_close(gx->grad, want, dtype, "dx");
      }
}

TEST(MulCuda, MatchesCpuReferenceAlsoForASharedInput) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(502);
  for (DType dtype : {DType::F32, DType::BF16})
    for (const auto& shape : kShapes)
      for (int variant = 0; variant < 3; ++variant) {  // fresh gradients; added onto; mul(x, x)
        const bool accumulate = variant == 1, shared = variant == 2;
        SCOPED_TRACE(case_name(dtype, shape[0], shape[1], accumulate) + (shared ? " mul(x, x)" : ""));
        const Shape s{shape[0], shape[1]};
        const Tensor a = round_through(testing::random_tensor(rng, s, 2.0), dtype);
        const Tensor b = round_through(testing::random_tensor(rng, s, 2.0), dtype);
        const Tensor dy = round_through(testing::random_tensor(rng, s), dtype);
        const Tensor da0 = round_through(testing::random_tensor(rng, s), dtype);
        const Tensor db0 = round_through(testing::random_tensor(rng, s), dtype);
        Tape ref_tape, tape;
        Var ra = make_var(a, true, "a"), rb = shared ? ra : make_var(b, true, "b");
        Var ga = make_var(to_gpu(a, dtype), true, "a"), gb = shared ? ga : make_var(to_gpu(b, dtype), true, "b");
        if (accumulate) {
          ra->grad = da0.clone();
          rb->grad = db0.clone();
          ga->grad = to_gpu(da0, dtype);
          gb->grad = to_gpu(db0, dtype);
        }
        Var ry = mul(ref_tape, ra, rb), gy = mul(tape, ga, gb);
        ref_tape.backward(ry, dy);
        tape.backward(gy, to_gpu(dy, dtype));
        ASSERT_EQ(gy->value.dtype(), dtype);
        expect_act_close(gy->value, ry->value, dtype, "y");
        // da: for mul(x, x) its two terms are added after a rounding to the act dtype (dy · b stored, then dy · a
        // added): twice the bound.
        if (shared) {
          const double rel = dtype == DType::F32 ? 2e-6 : 8e-3;
          expect_close(ga->grad, ra->grad, rel, rel * testing::max_abs(ra->grad), "da");
        } else {
          expect_act_close(ga->grad, ra->grad, dtype, "da");
          expect_act_close(gb->grad, rb->grad, dtype, "db");
        }
      }
}

TEST(AddBiasCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(503);
  for (DType dtype : {DType::F32, DType::BF16})
    for (const auto& shape : kShapes)
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(case_name(dtype, shape[0], shape[1], accumulate));
        const int64_t rows = shape[0], width = shape[1];
        // A 3-D input: the bias runs along the last axis whatever the leading ones.
        const Tensor x = round_through(testing::random_tensor(rng, {rows, 3, width}), dtype);
        const Tensor bias = round_through(testing::random_tensor(rng, {width}), DType::F32);
        const Tensor dy = round_through(testing::random_tensor(rng, {rows, 3, width}), dtype);
        const Tensor db0 = round_through(testing::random_tensor(rng, {width}), DType::F32);
        const Tensor dx0 = round_through(testing::random_tensor(rng, {rows, 3, width}), dtype);
        Tape ref_tape, tape;
        Var rx = make_var(x, true, "x"), rb = make_var(bias, true, "bias");
        Var gx = make_var(to_gpu(x, dtype), true, "x"), gb = make_var(to_gpu(bias, DType::F32), true, "bias");
        if (accumulate) {
          rx->grad = dx0.clone();
          rb->grad = db0.clone();
          gx->grad = to_gpu(dx0, dtype);
          gb->grad = to_gpu(db0, DType::F32);
        }
        Var ry = add_bias(ref_tape, rx, rb), gy = add_bias(tape, gx, gb);
        ref_tape.backward(ry, dy);
        tape.backward(gy, to_gpu(dy, dtype));
        ASSERT_EQ(gy->value.dtype(), dtype);
        ASSERT_EQ(gb->grad.dtype(), DType::F32);
        expect_act_close(gy->value, ry->value, dtype, "y");
        expect_act_close(gx->grad, rx->grad, dtype, "dx");
        // An fp32 sum over rows of exactly the reference's (rounded) inputs: tight for both act dtypes.
        expect_close(gb->grad, rb->grad, 1e-6, 1e-6 * testing::max_abs(rb->grad) + 1e-6, "dbias");
      }
}

// The bias gradient is reduced without atomics in a fixed order: two runs give the same bits over many row chunks.
TEST(AddBiasCuda, BiasGradientIsBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(504);
  const int64_t rows = 8192 + 17, width = 771;
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
    const Tensor bias = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
    const Tensor dy = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
    Tensor first;
    for (int run = 0; run < 2; ++run) {
      Tape tape;
      Var gx = make_var(x, false, "x"), gb = make_var(bias, true, "bias");
      tape.backward(add_bias(tape, gx, gb), dy);
      const Tensor got = gb->grad.to(Device::CPU);
      if (run == 0)
        first = got;
      else
        EXPECT_EQ(std::memcmp(got.raw_data(), first.raw_data(), got.nbytes()), 0) << dtype_name(dtype);
    }
  }
}

// On the GPU the bias (a parameter) is fp32 whatever the activation dtype; a bf16 bias is refused.
TEST(AddBiasCuda, RefusesANonFp32Bias) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(505);
  Tape tape;
  const Var x = make_var(to_gpu(testing::random_tensor(rng, {3, 8}), DType::BF16));
  EXPECT_THROW(add_bias(tape, x, make_var(to_gpu(testing::random_tensor(rng, {8}), DType::BF16))), Error);
}

}  // namespace
}  // namespace hgrn
