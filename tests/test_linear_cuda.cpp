// test_linear_cuda.cpp: the projection on the GPU (cuBLASLt) against the CPU reference in fp64: forward, dx and dW,
// for fp32 activations and for bf16 activations with an fp32 master weight (the mixed-precision case), with and
// without a residual added by the GEMM; and linear_columns (several weights side by side: one GEMM each way where they
// are adjacent, one per weight otherwise).
#include <gtest/gtest.h>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/linear.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;

struct LinearCase {
  int64_t rows, in, out;
};

void check_linear(const LinearCase& c, DType act, bool with_residual) {
  SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " in " << c.in << " out " << c.out << " act "
                                    << dtype_name(act) << (with_residual ? " with a residual" : ""));
  Rng rng(c.rows * 131 + c.in * 7 + c.out);
  // The reference sees exactly the values the GPU sees: x and dy rounded through the activation dtype, and for
  // bf16 activations the weight rounded too (the GEMM runs on the bf16 copy of the fp32 master weight).
  Tensor x = round_through(random_tensor(rng, {c.rows, c.in}), act);
  Tensor w = random_tensor(rng, {c.out, c.in}, 0.1);
  Tensor dy = round_through(random_tensor(rng, {c.rows, c.out}), act);
  Tensor w_seen = round_through(w, act);
  Tensor r = round_through(random_tensor(rng, {c.rows, c.out}), act);

  Tape cpu_tape;
  Var xc = make_var(x, true), wc = make_var(w_seen, true), rc = with_residual ? make_var(r, true) : nullptr;
  Var yc = linear(cpu_tape, xc, wc, rc);
  cpu_tape.backward(yc, dy);

  Tape gpu_tape;
  Var xg = make_var(to_gpu(x, act), true), wg = make_var(to_gpu(w, DType::F32), true);
  Var rg = with_residual ? make_var(to_gpu(r, act), true) : nullptr;
  Var yg = linear(gpu_tape, xg, wg, rg);
  ASSERT_EQ(yg->value.dtype(), act);
  gpu_tape.backward(yg, to_gpu(dy, act));
  ASSERT_EQ(wg->grad.dtype(), DType::F32) << "weight gradients stay fp32";

  // fp32: true fp32 GEMMs (no TF32) differ from fp64 only by summation order: 1e-5 relative RMS is ~100 ulps.
  // bf16: inputs are exact in the reference; the error is the bf16 rounding of y and dx (2^-9 relative), so
  // 1e-2; dW accumulates in fp32 straight into the fp32 gradient, so it stays at the fp32 bound.
  const double out_tol = act == DType::F32 ? 1e-5 : 1e-2;
  expect_close(yg->value, yc->value, out_tol, act == DType::F32 ? 1e-4 : 0.05 * std::sqrt(c.in), "y");
  expect_close(xg->grad, xc->grad, out_tol, act == DType::F32 ? 1e-4 : 0.05 * std::sqrt(c.out), "dx");
  expect_close(wg->grad, wc->grad, 1e-5, 1e-3 * std::sqrt(c.rows), "dW");
  // The residual's gradient is dy itself: exact.
  if (with_residual) expect_close(rg->grad, rc->grad, 0.0, 0.0, "dresidual");
}

TEST(LinearCuda, MatchesCpuReferenceOnOddShapes) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16})
    for (LinearCase c : {LinearCase{1, 96, 200}, LinearCase{63, 771, 96}, LinearCase{65, 128, 384},
                         LinearCase{2047, 200, 771}})
      for (bool with_residual : {false, true}) check_linear(c, act, with_residual);
}

// linear_columns on the GPU against the CPU in fp64: fp32 master weights in one buffer (adjacent: one GEMM each way,
// their bf16 copies made adjacent, their gradients made adjacent) or apart (one GEMM per weight into and from its
// columns). Tolerances as check_linear's.
TEST(LinearCuda, ColumnsMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> outs{96, 200, 8};
  const int64_t rows = 65, in = 771, width = 304;
  for (DType act : {DType::F32, DType::BF16}) {
    for (bool adjacent : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(act) << (adjacent ? ", adjacent" : ", apart"));
      Rng rng(77);
      const Tensor x = round_through(random_tensor(rng, {rows, in}), act);
      const Tensor w = random_tensor(rng, {width, in}, 0.1);
      const Tensor dy = round_through(random_tensor(rng, {rows, width}), act);
      const Tensor w_gpu = to_gpu(w, DType::F32);
      std::vector<Var> wc, wg;
      int64_t row = 0;
      for (int64_t o : outs) {
        wc.push_back(make_var(round_through(w, act).rows(row, o).clone(), true));
        wg.push_back(make_var(adjacent ? w_gpu.rows(row, o) : w_gpu.rows(row, o).clone(), true));
        row += o;
      }
      // dy's column blocks seed the blocks' gradients (on the GPU written contiguous, so copied into dx's operand).
      const auto run = [&](Tape& tape, const Var& xv, const std::vector<Var>& w, const Tensor& d) {
        std::vector<Var> y = linear_columns(tape, xv, w);
        int64_t col = 0;
        std::vector<Tensor> seeds;
        for (const Var& b : y) seeds.push_back(d.columns(col, b->value.size(-1)).clone()), col += b->value.size(-1);
        for (size_t k = 1; k < y.size(); ++k) y[k]->grad = seeds[k];
        std::vector<Tensor> values;
        for (const Var& b : y) values.push_back(b->value.clone());
        tape.backward(y[0], seeds[0]);
        return values;
      };
      Tape cpu_tape;
      Var xc = make_var(x, true);
      const std::vector<Tensor> yc = run(cpu_tape, xc, wc, dy);
      Tape gpu_tape;
      Var xg = make_var(to_gpu(x, act), true);
      const std::vector<Tensor> yg = run(gpu_tape, xg, wg, to_gpu(dy, act));
      std::vector<Tensor> copies, grads;
      for (const Var& v : wg) copies.push_back(v->compute_copy), grads.push_back(v->grad);
      if (act == DType::BF16) EXPECT_TRUE(Tensor::adjacent_rows(copies).defined()) << "bf16 copies made apart";
      EXPECT_TRUE(Tensor::adjacent_rows(grads).defined()) << "first weight gradients made apart";
      const double out_tol = act == DType::F32 ? 1e-5 : 1e-2;
      for (size_t k = 0; k < outs.size(); ++k)
        expect_close(yg[k], yc[k], out_tol, act == DType::F32 ? 1e-4 : 0.05 * std::sqrt(in), "y " + std::to_string(k));
      expect_close(xg->grad, xc->grad, out_tol, act == DType::F32 ? 1e-4 : 0.05 * std::sqrt(width), "dx");
      for (size_t i = 0; i < outs.size(); ++i)
        expect_close(wg[i]->grad, wc[i]->grad, 1e-5, 1e-3 * std::sqrt(rows), "dW " + std::to_string(i));
    }
  }
}

TEST(LinearCuda, BackwardAccumulatesIntoExistingGradients) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(5);
  Tensor x = random_tensor(rng, {33, 40}, 1.0, DType::F32), w = random_tensor(rng, {24, 40}, 0.2, DType::F32);
  Tensor dy = random_tensor(rng, {33, 24}, 1.0, DType::F32);
  Var xg = make_var(x.to(Device::CUDA), true), wg = make_var(w.to(Device::CUDA), true);
  for (int pass = 0; pass < 2; ++pass) {
    Tape tape;
    tape.backward(linear(tape, xg, wg), dy.to(Device::CUDA));
  }
  Tape once;
  Var xc = make_var(x, true), wc = make_var(w, true);
  once.backward(linear(once, xc, wc), dy);
  Tensor twice_x = xc->grad.clone(), twice_w = wc->grad.clone();
  for (int64_t i = 0; i < twice_x.numel(); ++i) twice_x.set_item(i, 2 * twice_x.item(i));
  for (int64_t i = 0; i < twice_w.numel(); ++i) twice_w.set_item(i, 2 * twice_w.item(i));
  // Two identical backward passes must sum: fp32 tolerance as above.
  expect_close(xg->grad, twice_x, 1e-5, 1e-4, "dx after two passes");
  expect_close(wg->grad, twice_w, 1e-5, 1e-4, "dW after two passes");
}

}  // namespace
}  // namespace hgrn
