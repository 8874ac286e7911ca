// test_rmsnorm.cpp: RMSNorm against a double-precision formula (with and without weight), fp64 finite differences,
// thread-count-independent weight gradients, and argument errors.
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

TEST(RmsNorm, GroupsAreNormalisedEachOnItsOwn) {
  // group_width 4 over a last axis of 12: three heads per row, each the plain RMSNorm of its 4 features.
  Rng rng(26);
  Tensor x = testing::random_tensor(rng, {2, 3, 12}, 2.0);
  Tensor w = testing::random_tensor(rng, {4});
  Tape tape;
  const std::vector<double> y = rmsnorm(tape, make_var(x), make_var(w), 1e-6, 4)->value.to_double_vector();
  const std::vector<double> ref = reference_rmsnorm(x.reshape({18, 4}), &w, 1e-6);
  ASSERT_EQ(y.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(y[i], ref[i], 1e-13 * std::max(1.0, std::abs(ref[i]))) << i;
}

TEST(RmsNorm, GroupedGradientsMatchFiniteDifferences) {
  Rng rng(27);
  Var x = make_var(testing::random_tensor(rng, {2, 3, 10}), true, "x");
  Var w = make_var(testing::random_tensor(rng, {5}), true, "weight");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return rmsnorm(t, in[0], in[1], 1e-5, 5); }, {x, w});
}

TEST(RmsNorm, RejectsBadArguments) {
  Tape tape;
  Var x = make_var(Tensor::zeros({2, 4}, DType::F32));
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({3}, DType::F32)), 1e-6), Error);     // width mismatch
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({1, 4}, DType::F32)), 1e-6), Error);  // weight not [D]
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({4}, DType::F64)), 1e-6), Error);     // dtype mismatch
  EXPECT_THROW(rmsnorm(tape, x, nullptr, -1.0), Error);                                       // negative eps
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({3}, DType::F32)), 1e-6, 3), Error);  // 3 does not divide 4
  EXPECT_THROW(rmsnorm(tape, x, make_var(Tensor::zeros({4}, DType::F32)), 1e-6, 2), Error);  // weight not [group]
}

}  // namespace
}  // namespace hgrn
