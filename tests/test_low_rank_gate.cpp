// test_low_rank_gate.cpp: low_rank_log_sigmoid_gate on the CPU: fp64 finite differences of u, the weight and the
// bias (GLA's rank 16 into 512 outputs, a tiny rank 3 into 5, u a column block of a wider tensor whose gradient lands
// in its columns, and u read twice so that its gradient accumulates), equality with the composition it replaces
// (linear, add_bias, log_sigmoid), fp32 against fp64, sums whose bits do not depend on the thread count, and argument
// errors. (The GPU kernels against this reference: test_low_rank_gate_cuda.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <omp.h>

#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/low_rank_gate.h"

namespace hgrn {
namespace {

using testing::expect_gradients_match;
using testing::random_tensor;

constexpr double kDivisor = 16.0;  // GLA's gate_logit_normalizer

struct GateInputs {
  Var u, weight, bias;
};

// u [shape..., rank] ~ N(0, 1), weight [out, rank] ~ N(0, 0.5), bias [out] ~ N(0, 1): logits of a few units, where
// log σ is neither flat nor linear.
GateInputs random_inputs(Rng& rng, const Shape& u_shape, int64_t out, DType dtype = DType::F64) {
  const int64_t rank = u_shape.back();
  return {make_var(random_tensor(rng, u_shape, 1.0, dtype), true, "u"),
          make_var(random_tensor(rng, {out, rank}, 0.5, dtype), true, "weight"),
          make_var(random_tensor(rng, {out}, 1.0, dtype), true, "bias")};
}

Var gate(Tape& tape, const std::vector<Var>& in) {
  return low_rank_log_sigmoid_gate(tape, in[0], in[1], in[2], kDivisor, in[0]->value.dtype());
}

TEST(LowRankGate, GradientsMatchFiniteDifferences) {
  Rng rng(501);
  // GLA's shape (rank 16 into 512 outputs) on a few rows, a tiny rank 3 into 5 over [4, 7] rows.
  for (const auto& [u_shape, out] : std::vector<std::pair<Shape, int64_t>>{{{1, 3, 16}, 512}, {{4, 7, 3}, 5}}) {
    SCOPED_TRACE(shape_str(u_shape) + " -> " + std::to_string(out));
    const GateInputs in = random_inputs(rng, u_shape, out);
    expect_gradients_match(gate, {in.u, in.weight, in.bias});
  }
}

// u a column block of a wider tensor (a fused projection's output): its gradient lands in its columns of the
// parent's gradient, the other columns' stay zero. u is read by two gates (different weights), so the first backward
// to reach it writes its columns and the second adds to them.
TEST(LowRankGate, ColumnBlockGradientLandsInItsColumnsAndAccumulates) {
  Rng rng(502);
  const int64_t rows = 9, rank = 3, out = 6;
  Var parent = make_var(random_tensor(rng, {rows, 2 + rank + 4}), true, "parent");
  const GateInputs a = random_inputs(rng, {rows, rank}, out), b = random_inputs(rng, {rows, rank}, out);
  const auto build = [&](Tape& tape, const std::vector<Var>& in) {
    const std::vector<Var> blocks = split_columns(tape, in[0], {2, rank, 4});
    EXPECT_FALSE(blocks[1]->value.is_contiguous());
    return add(tape, low_rank_log_sigmoid_gate(tape, blocks[1], in[1], in[2], kDivisor, DType::F64),
               low_rank_log_sigmoid_gate(tape, blocks[1], in[3], in[4], 3.0, DType::F64));
  };
  expect_gradients_match(build, {parent, a.weight, a.bias, b.weight, b.bias});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c : {0, 1, 5, 6, 7, 8}) EXPECT_EQ(parent->grad.item(r * 9 + c), 0.0) << r << ", " << c;
}

// A gradient already in u, the weight and the bias is added to, not overwritten.
TEST(LowRankGate, AccumulatesOntoExistingGradients) {
  Rng rng(503);
  const GateInputs in = random_inputs(rng, {5, 4}, 7);
  const Tensor seed = random_tensor(rng, {5, 7});
  const auto backward = [&] {
    Tape tape;
    tape.backward(gate(tape, {in.u, in.weight, in.bias}), seed);
  };
  backward();
  const Tensor du = in.u->grad.clone(), dw = in.weight->grad.clone(), db = in.bias->grad.clone();
  const Tensor du0 = random_tensor(rng, du.shape()), dw0 = random_tensor(rng, dw.shape()),
               db0 = random_tensor(rng, db.shape());
  in.u->grad = du0.clone(), in.weight->grad = dw0.clone(), in.bias->grad = db0.clone();
  backward();
  for (const auto& [got, before, once] : {std::tuple{in.u->grad, du0, du}, std::tuple{in.weight->grad, dw0, dw},
                                         std::tuple{in.bias->grad, db0, db}})
    for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.item(i), before.item(i) + once.item(i)) << i;
}

// The op replaces GLA's linear(contiguous(u), W) → add_bias → log_sigmoid: the same values and gradients up to the
// order of fp64 sums (1e-12 relative).
TEST(LowRankGate, MatchesTheCompositionItReplaces) {
  Rng rng(504);
  for (const auto& [u_shape, out] : std::vector<std::pair<Shape, int64_t>>{{{2, 33, 16}, 512}, {{4, 7, 3}, 5}}) {
    SCOPED_TRACE(shape_str(u_shape) + " -> " + std::to_string(out));
    const GateInputs fused = random_inputs(rng, u_shape, out);
    const GateInputs composed{make_var(fused.u->value.clone(), true), make_var(fused.weight->value.clone(), true),
                              make_var(fused.bias->value.clone(), true)};
    Shape y_shape = u_shape;
    y_shape.back() = out;
    const Tensor seed = random_tensor(rng, y_shape);
    Tape t1, t2;
    const Var y1 = gate(t1, {fused.u, fused.weight, fused.bias});
    const Var y2 = log_sigmoid(
        t2, add_bias(t2, linear(t2, contiguous(t2, composed.u), composed.weight), composed.bias), kDivisor, DType::F64);
    t1.backward(y1, seed);
    t2.backward(y2, seed);
    for (const auto& [got, want, what] :
         {std::tuple{y1->value, y2->value, "y"}, std::tuple{fused.u->grad, composed.u->grad, "du"},
          std::tuple{fused.weight->grad, composed.weight->grad, "dW"},
          std::tuple{fused.bias->grad, composed.bias->grad, "db"}}) {
      const double scale = std::max(1.0, testing::max_abs(want));
      for (int64_t i = 0; i < want.numel(); ++i)
        ASSERT_NEAR(got.item(i), want.item(i), 1e-12 * scale) << what << " element " << i;
    }
  }
}

// fp32 runs the same loops in fp32: within fp32's rounding of sums of 16 (forward, du) and of rows (dW, db).
TEST(LowRankGate, Fp32MatchesFp64) {
  Rng rng(505);
  const GateInputs ref = random_inputs(rng, {3, 40, 16}, 64);
  const GateInputs f32{make_var(ref.u->value.to(DType::F32), true), make_var(ref.weight->value.to(DType::F32), true),
                       make_var(ref.bias->value.to(DType::F32), true)};
  const Tensor seed = random_tensor(rng, {3, 40, 64});
  Tape t1, t2;
  const Var y_ref = gate(t1, {ref.u, ref.weight, ref.bias});
  const Var y32 = gate(t2, {f32.u, f32.weight, f32.bias});
  EXPECT_EQ(y32->value.dtype(), DType::F32);
  t1.backward(y_ref, seed);
  t2.backward(y32, seed.to(DType::F32));
  for (const auto& [got, want, what] :
       {std::tuple{y32->value, y_ref->value, "y"}, std::tuple{f32.u->grad, ref.u->grad, "du"},
        std::tuple{f32.weight->grad, ref.weight->grad, "dW"}, std::tuple{f32.bias->grad, ref.bias->grad, "db"}}) {
    // The inputs' fp32 rounding (2^-24) carried through sums of up to 120 terms: 1e-5 of the largest element.
    const double tol = 1e-5 * std::max(1.0, testing::max_abs(want));
    for (int64_t i = 0; i < want.numel(); ++i) ASSERT_NEAR(got.item(i), want.item(i), tol) << what << " " << i;
  }
}

// dW and db are summed over rows in fixed blocks: the same bits on 1, 2 or 3 threads.
TEST(LowRankGate, WeightGradientBitsDoNotDependOnThreads) {
  Rng rng(506);
  const GateInputs in = random_inputs(rng, {300, 8}, 64, DType::F32);
  const Tensor seed = random_tensor(rng, {300, 64}, 1.0, DType::F32);
  const int saved_threads = omp_get_max_threads();
  std::vector<double> first_w, first_b;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    in.weight->grad = Tensor(), in.bias->grad = Tensor();
    Tape tape;
    tape.backward(gate(tape, {in.u, in.weight, in.bias}), seed);
    if (first_w.empty()) {
      first_w = in.weight->grad.to_double_vector(), first_b = in.bias->grad.to_double_vector();
    } else {
      EXPECT_EQ(in.weight->grad.to_double_vector(), first_w) << "threads " << threads;
      EXPECT_EQ(in.bias->grad.to_double_vector(), first_b) << "threads " << threads;
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST(LowRankGate, RejectsBadArguments) {
  Tape tape;
  const Var u = make_var(Tensor::zeros({2, 4}, DType::F64));
  const Var w = make_var(Tensor::zeros({3, 4}, DType::F64)), b = make_var(Tensor::zeros({3}, DType::F64));
  EXPECT_NO_THROW(low_rank_log_sigmoid_gate(tape, u, w, b, kDivisor, DType::F64));
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, make_var(Tensor::zeros({3, 5}, DType::F64)), b, kDivisor, DType::F64),
               Error);  // rank
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, w, make_var(Tensor::zeros({4}, DType::F64)), kDivisor, DType::F64),
               Error);  // bias width
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, make_var(Tensor::zeros({3, 4}, DType::F32)), b, kDivisor, DType::F64),
               Error);  // the CPU runs one dtype
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, w, b, kDivisor, DType::F32), Error);  // output dtype
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, w, b, 0.0, DType::F64), Error);        // divisor
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, nullptr, w, b, kDivisor, DType::F64), Error);
}

}  // namespace
}  // namespace hgrn
