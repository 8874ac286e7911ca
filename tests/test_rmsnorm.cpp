// test_rmsnorm.cpp: RMSNorm against a double-precision formula (with and without weight), fp64 finite differences,
// thread-count-independent weight gradients, and argument errors; the fused add_rmsnorm against add followed by
// rmsnorm and fp64 finite differences, with the sum's own gradient present or absent.
#include <gtest/gtest.h>

#include <cmath>

#include <omp.h>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/activations.h"
#include "ops/linear.h"
#include "ops/rmsnorm.h"

namespace hgrn {
namespace {

// y = x / sqrt(mean(x²) + eps) · w, straight from the definition, in double.
std::vector<double> reference_rmsnorm(const Tensor& x, const Tensor* w, double eps) {
  const int64_t width = x.size(-1), rows = x.numel() / width;
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < width; ++c) ms += x.item(r * width + c) * x.item(r * width + c);
    ms /= static_cast<double>(width);
    for (int64_t c = 0; c < width; ++c)
      y[static_cast<size_t>(r * width + c)] = x.item(r * width + c) / std::sqrt(ms + eps) * (w ? w->item(c) : 1.0);
  }
  return y;
}

TEST(RmsNorm, ForwardMatchesFormulaWithAndWithoutWeight) {
  Rng rng(21);
  for (DType dtype : {DType::F64, DType::F32}) {
    // fp64: a few ulps of the reference; fp32: the float statistics and products, ~1e-6 relative.
    const double tol = dtype == DType::F64 ? 1e-13 : 2e-6;
    Tensor x = testing::random_tensor(rng, {2, 3, 8}, 2.0, dtype);
    Tensor w = testing::random_tensor(rng, {8}, 1.0, dtype);
    Tape tape;
    const std::vector<double> with_weight = rmsnorm(tape, make_var(x), make_var(w), 1e-6)->value.to_double_vector();
    const std::vector<double> weightless = rmsnorm(tape, make_var(x), nullptr, 1e-6)->value.to_double_vector();
    const std::vector<double> ref_w = reference_rmsnorm(x, &w, 1e-6), ref = reference_rmsnorm(x, nullptr, 1e-6);
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_NEAR(with_weight[i], ref_w[i], tol * std::max(1.0, std::abs(ref_w[i]))) << dtype_name(dtype) << " " << i;
      EXPECT_NEAR(weightless[i], ref[i], tol * std::max(1.0, std::abs(ref[i]))) << dtype_name(dtype) << " " << i;
    }
  }
}

TEST(RmsNorm, EpsDominatesTinyInputs) {
  // mean(x²) = 1e-12 ≪ eps = 1e-2: y ≈ x / 0.1.
  Tape tape;
  Var x = make_var(Tensor::from_vector<double>({1e-6, -1e-6}, {1, 2}));
  const std::vector<double> y = rmsnorm(tape, x, nullptr, 1e-2)->value.to_double_vector();
  EXPECT_NEAR(y[0], 1e-5 / std::sqrt(1 + 1e-10), 1e-18);
  EXPECT_NEAR(y[1], -1e-5 / std::sqrt(1 + 1e-10), 1e-18);
}

TEST(RmsNorm, GradientsMatchFiniteDifferencesWithWeight) {
  Rng rng(22);
  Var x = make_var(testing::random_tensor(rng, {2, 3, 6}), true, "x");
  Var w = make_var(testing::random_tensor(rng, {6}), true, "weight");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return rmsnorm(t, in[0], in[1], 1e-5); }, {x, w});
}

TEST(RmsNorm, GradientsMatchFiniteDifferencesWithoutWeight) {
  Rng rng(23);
  Var x = make_var(testing::random_tensor(rng, {5, 7}), true, "x");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return rmsnorm(t, in[0], nullptr, 1e-5); }, {x});
}

TEST(RmsNorm, WeightGradientAloneWhenInputIsFrozen) {
  Rng rng(24);
  Var x = make_var(testing::random_tensor(rng, {4, 5}), false, "x");
  Var w = make_var(testing::random_tensor(rng, {5}), true, "weight");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return rmsnorm(t, in[0], in[1], 1e-6); }, {x, w});
  EXPECT_FALSE(x->grad.defined());
}

// The weight gradient sums over every row; its bits must not depend on the thread count.
TEST(RmsNorm, WeightGradientBitsIndependentOfThreadCount) {
  Rng rng(25);
  const int64_t rows = 1000, width = 48;
  Tensor x = testing::random_tensor(rng, {rows, width}, 1.0, DType::F32);
  Tensor w = testing::random_tensor(rng, {width}, 1.0, DType::F32);
  Tensor dy = testing::random_tensor(rng, {rows, width}, 1.0, DType::F32);
  const int saved_threads = omp_get_max_threads();
  std::vector<double> first_dw, first_dx;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tape tape;
    Var xv = make_var(x, true, "x"), wv = make_var(w, true, "weight");
    tape.backward(rmsnorm(tape, xv, wv, 1e-6), dy);
    if (first_dw.empty()) {
      first_dw = wv->grad.to_double_vector();
      first_dx = xv->grad.to_double_vector();
    } else {
      EXPECT_EQ(wv->grad.to_double_vector(), first_dw) << "threads " << threads;
      EXPECT_EQ(xv->grad.to_double_vector(), first_dx) << "threads " << threads;
    }
  }
  omp_set_num_threads(saved_threads);
}

TEST(RmsNorm, RejectsBadArguments) {
  Tape tape;
  Var x = make_var(Tensor::zeros({2, 4}, DType::F32));
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({3}, DType::F32)), 1e-6), Error);     // width mismatch
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({1, 4}, DType::F32)), 1e-6), Error);  // weight not [D]
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({4}, DType::F64)), 1e-6), Error);     // dtype mismatch
  EXPECT_THROW(rmsnorm(tape, x, nullptr, -1.0), Error);                                       // negative eps
}

// add_rmsnorm is add followed by rmsnorm, in one op. On the CPU both paths do the same float operations in the
// same order (the sum's two gradients are added commutatively), so outputs and every gradient agree bit for bit.
TEST(AddRmsNorm, EqualsAddFollowedByRmsNorm) {
  Rng rng(26);
  for (DType dtype : {DType::F64, DType::F32}) {
    for (bool with_weight : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (with_weight ? " with weight" : " weightless"));
      const Shape shape{3, 70, 24};  // 210 rows: several fixed row blocks for the weight gradient
      Tensor r = testing::random_tensor(rng, shape, 1.0, dtype), d = testing::random_tensor(rng, shape, 0.5, dtype);
      Tensor w = testing::random_tensor(rng, {24}, 1.0, dtype);
      Tensor dy = testing::random_tensor(rng, shape, 1.0, dtype), ds = testing::random_tensor(rng, shape, 1.0, dtype);

      Tape fused_tape;
      Var fr = make_var(r, true, "residual"), fd = make_var(d, true, "delta");
      Var fw = with_weight ? make_var(w, true, "weight") : nullptr;
      AddRmsNormResult fused = add_rmsnorm(fused_tape, fr, fd, fw, 1e-6);
      fused.sum->grad = ds.clone();
      fused_tape.backward(fused.normed, dy);

      Tape tape;
      Var ur = make_var(r, true, "residual"), ud = make_var(d, true, "delta");
      Var uw = with_weight ? make_var(w, true, "weight") : nullptr;
      Var sum = add(tape, ur, ud);
      Var normed = rmsnorm(tape, sum, uw, 1e-6);
      sum->grad = ds.clone();
      tape.backward(normed, dy);

      EXPECT_EQ(fused.sum->value.to_double_vector(), sum->value.to_double_vector());
      EXPECT_EQ(fused.normed->value.to_double_vector(), normed->value.to_double_vector());
      EXPECT_EQ(fr->grad.to_double_vector(), ur->grad.to_double_vector());
      EXPECT_EQ(fd->grad.to_double_vector(), ud->grad.to_double_vector());
      if (with_weight) EXPECT_EQ(fw->grad.to_double_vector(), uw->grad.to_double_vector());
    }
  }
}

// Both outputs feed the loss: the sum's gradient is its own plus the norm's.
TEST(AddRmsNorm, GradientsMatchFiniteDifferencesThroughBothOutputs) {
  Rng rng(27);
  Var r = make_var(testing::random_tensor(rng, {2, 3, 6}), true, "residual");
  Var d = make_var(testing::random_tensor(rng, {2, 3, 6}, 0.5), true, "delta");
  Var w = make_var(testing::random_tensor(rng, {6}), true, "weight");
  testing::expect_gradients_match_outputs(
      [](Tape& t, const std::vector<Var>& in) {
        AddRmsNormResult o = add_rmsnorm(t, in[0], in[1], in[2], 1e-5);
        return std::vector<Var>{o.normed, o.sum};
      },
      {r, d, w});
}

// Only the normed output is used: the sum's gradient stays undefined and the norm's alone flows back.
TEST(AddRmsNorm, GradientsMatchFiniteDifferencesThroughNormOnly) {
  Rng rng(28);
  Var r = make_var(testing::random_tensor(rng, {5, 7}), true, "residual");
  Var d = make_var(testing::random_tensor(rng, {5, 7}), true, "delta");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return add_rmsnorm(t, in[0], in[1], nullptr, 1e-5).normed; }, {r, d});
}

// Only the sum is used (the normed output's gradient stays undefined): a plain add's gradient, none for the weight.
TEST(AddRmsNorm, GradientsMatchFiniteDifferencesThroughSumOnly) {
  Rng rng(29);
  Var r = make_var(testing::random_tensor(rng, {4, 5}), true, "residual");
  Var d = make_var(testing::random_tensor(rng, {4, 5}), true, "delta");
  Var w = make_var(testing::random_tensor(rng, {5}), true, "weight");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return add_rmsnorm(t, in[0], in[1], in[2], 1e-5).sum; }, {r, d, w});
  EXPECT_FALSE(w->grad.defined());
}

TEST(AddRmsNorm, FrozenResidualAndOneTensorAsBothInputs) {
  Rng rng(30);
  Var r = make_var(testing::random_tensor(rng, {3, 8}), false, "residual");
  Var d = make_var(testing::random_tensor(rng, {3, 8}), true, "delta");
  Var w = make_var(testing::random_tensor(rng, {8}), true, "weight");
  testing::expect_gradients_match_outputs(
      [](Tape& t, const std::vector<Var>& in) {
        AddRmsNormResult o = add_rmsnorm(t, in[0], in[1], in[2], 1e-6);
        return std::vector<Var>{o.normed, o.sum};
      },
      {r, d, w});
  EXPECT_FALSE(r->grad.defined());
  // x + x: both gradients land in one buffer.
  testing::expect_gradients_match_outputs(
      [](Tape& t, const std::vector<Var>& in) {
        AddRmsNormResult o = add_rmsnorm(t, in[0], in[0], in[1], 1e-6);
        return std::vector<Var>{o.normed, o.sum};
      },
      {d, w});
}

// When residual and delta are both op outputs (the model's residual stream and branch output), add_rmsnorm gives them
// one gradient buffer, written once. Here the residual also feeds a linear recorded before the add, whose backward
// runs after the add's and adds into the residual's gradient: the residual must get its own copy first, so that the
// delta's gradient stays the add's. Finite differences check every leaf's gradient.
TEST(AddRmsNorm, ResidualAndDeltaShareOneGradientUntilOneIsAddedTo) {
  Rng rng(31);
  Var a = make_var(testing::random_tensor(rng, {3, 8}), true, "a");
  Var b = make_var(testing::random_tensor(rng, {3, 8}), true, "b");
  Var v = make_var(testing::random_tensor(rng, {8, 8}, 0.5), true, "v");
  Var w = make_var(testing::random_tensor(rng, {8}), true, "weight");
  Var r, d;  // the first (taped) build's residual and delta
  testing::expect_gradients_match_outputs(
      [&](Tape& t, const std::vector<Var>& in) {
        Var residual = silu(t, in[0]), delta = silu(t, in[1]);
        Var side = linear(t, residual, in[2]);
        AddRmsNormResult o = add_rmsnorm(t, residual, delta, in[3], 1e-6);
        if (!r) r = residual, d = delta;
        return std::vector<Var>{o.normed, side};
      },
      {a, b, v, w});
  ASSERT_TRUE(r && d && r->grad.defined() && d->grad.defined());
  EXPECT_TRUE(d->grad_shared) << "the delta's gradient is the buffer the add wrote";
  EXPECT_FALSE(r->grad_shared) << "the residual's was copied before the linear added to it";
  EXPECT_NE(r->grad.raw_data(), d->grad.raw_data());
}

TEST(AddRmsNorm, RejectsBadArguments) {
  Tape tape;
  Var x = make_var(Tensor::zeros({2, 4}, DType::F32));
  Var w = make_var(Tensor::zeros({4}, DType::F32));
  EXPECT_THROW(add_rmsnorm(tape, x, make_var(Tensor::zeros({4, 2}, DType::F32)), w, 1e-6), Error);  // shapes
  EXPECT_THROW(add_rmsnorm(tape, x, make_var(Tensor::zeros({2, 4}, DType::F64)), w, 1e-6), Error);  // dtypes
  EXPECT_THROW(add_rmsnorm(tape, x, x, make_var(Tensor::zeros({3}, DType::F32)), 1e-6), Error);     // width
  EXPECT_THROW(add_rmsnorm(tape, x, nullptr, w, 1e-6), Error);                                       // null
  EXPECT_THROW(add_rmsnorm(tape, x, x, w, -1.0), Error);                                             // eps
}

}  // namespace
}  // namespace hgrn
