// test_activations.cpp: silu, swiglu and log_sigmoid against the double-precision formulas, extreme inputs, fp64
// finite differences and shape errors.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops/activations.h"

namespace hgrn {
namespace {

double reference_silu(double x) { return x / (1.0 + std::exp(-x)); }

TEST(Silu, ForwardMatchesFormula) {
  const std::vector<double> xs = {-20, -3, -0.5, 0, 0.25, 1, 4, 30};
  Tape tape;
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-15 : 1e-6;  // relative: rounding of exp and the product
    Var y = silu(tape, make_var(Tensor::from_vector<double>(xs, {8}).to(dtype)));
    for (size_t i = 0; i < xs.size(); ++i) {
      const double ref = reference_silu(static_cast<double>(dtype == DType::F32 ? static_cast<float>(xs[i]) : xs[i]));
      EXPECT_NEAR(y->value.item(static_cast<int64_t>(i)), ref, tol * std::max(1e-30, std::abs(ref)))
          << dtype_name(dtype) << " x=" << xs[i];
    }
  }
}

TEST(Silu, ExtremeInputsStayFinite) {
  Tape tape;
  for (DType dtype : {DType::F64, DType::F32}) {
    Var y = silu(tape, make_var(Tensor::from_vector<double>({-1000, 1000}, {2}).to(dtype)));
    EXPECT_EQ(y->value.item(0), 0.0) << dtype_name(dtype);  // −1000 · σ(−1000) underflows to (−)0, never NaN
    EXPECT_EQ(y->value.item(1), 1000.0) << dtype_name(dtype);
  }
}

TEST(Silu, GradientsMatchFiniteDifferences) {
  Rng rng(31);
  Var x = make_var(testing::random_tensor(rng, {3, 7}, 3.0), true, "x");
  testing::expect_gradients_match([](Tape& t, const std::vector<Var>& in) { return silu(t, in[0]); }, {x});
}

TEST(Swiglu, ForwardIsSiluOfGateTimesUp) {
  Rng rng(32);
  Tensor gate = testing::random_tensor(rng, {4, 5}, 3.0), up = testing::random_tensor(rng, {4, 5});
  Tape tape;
  Var y = swiglu(tape, make_var(gate), make_var(up));
  ASSERT_EQ(y->value.shape(), (Shape{4, 5}));
  for (int64_t i = 0; i < 20; ++i) {
    const double ref = reference_silu(gate.item(i)) * up.item(i);
    EXPECT_NEAR(y->value.item(i), ref, 1e-15 * std::max(1.0, std::abs(ref))) << i;  // a few ulps
  }
}

TEST(Swiglu, GradientsMatchFiniteDifferences) {
  Rng rng(33);
  Var gate = make_var(testing::random_tensor(rng, {2, 3, 4}, 3.0), true, "gate");
  Var up = make_var(testing::random_tensor(rng, {2, 3, 4}), true, "up");
  testing::expect_gradients_match([](Tape& t, const std::vector<Var>& in) { return swiglu(t, in[0], in[1]); },
                                  {gate, up});
}

TEST(Swiglu, OneInputFrozen) {
  Rng rng(34);
  Var gate = make_var(testing::random_tensor(rng, {6}), false, "gate");
  Var up = make_var(testing::random_tensor(rng, {6}), true, "up");
  testing::expect_gradients_match([](Tape& t, const std::vector<Var>& in) { return swiglu(t, in[0], in[1]); },
                                  {gate, up});
  EXPECT_FALSE(gate->grad.defined());
}

TEST(Swiglu, RejectsMismatchedInputs) {
  Tape tape;
  EXPECT_THROW(swiglu(tape, make_var(Tensor::zeros({2, 3}, DType::F32)), make_var(Tensor::zeros({3, 2}, DType::F32))),
               Error);
  EXPECT_THROW(swiglu(tape, make_var(Tensor::zeros({2}, DType::F32)), make_var(Tensor::zeros({2}, DType::F64))),
               Error);
}

TEST(LogSigmoid, ForwardMatchesFormula) {
  // log σ(x) = −log(1 + e^{−x}), straight from the definition (accurate in double for these x), divided by 16.
  const std::vector<double> xs = {-30, -3, -0.5, 0, 0.25, 1, 4, 30};
  Tape tape;
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-15 : 1e-6;  // relative: rounding of exp, log1p and the division
    Var y = log_sigmoid(tape, make_var(Tensor::from_vector<double>(xs, {8}).to(dtype)), 16.0, dtype);
    EXPECT_EQ(y->value.dtype(), dtype);
    for (size_t i = 0; i < xs.size(); ++i) {
      const double x = dtype == DType::F32 ? static_cast<float>(xs[i]) : xs[i];
      const double ref = -std::log1p(std::exp(-x)) / 16.0;
      EXPECT_NEAR(y->value.item(static_cast<int64_t>(i)), ref, tol * std::abs(ref)) << dtype_name(dtype) << " x=" << x;
    }
  }
}

TEST(LogSigmoid, ExtremeInputsStayFinite) {
  Tape tape;
  for (DType dtype : {DType::F64, DType::F32}) {
    Var y = log_sigmoid(tape, make_var(Tensor::from_vector<double>({-1000, 1000}, {2}).to(dtype)), 1.0, dtype);
    EXPECT_EQ(y->value.item(0), -1000.0) << dtype_name(dtype);  // log σ(x) → x: no log(0)
    EXPECT_EQ(y->value.item(1), 0.0) << dtype_name(dtype);      // log1p(e^{−1000}) underflows to 0
  }
}

TEST(LogSigmoid, GradientsMatchFiniteDifferences) {
  Rng rng(35);
  Var x = make_var(testing::random_tensor(rng, {3, 7}, 4.0), true, "x");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return log_sigmoid(t, in[0], 16.0, DType::F64); }, {x});
}

TEST(LogSigmoid, RejectsAnotherOutputDtypeOnTheCpuAndAZeroDivisor) {
  Tape tape;
  Var x = make_var(Tensor::zeros({2}, DType::F64));
  EXPECT_THROW(log_sigmoid(tape, x, 16.0, DType::F32), Error);
  EXPECT_THROW(log_sigmoid(tape, x, 0.0, DType::F64), Error);
}

}  // namespace
}  // namespace hgrn
