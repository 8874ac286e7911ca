// test_mul_add_bias.cpp: the small ops of the complex HGRU's gates: sigmoid, the elementwise product and the bias
// add, against their formulas and fp64 finite differences, with argument checks.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/elementwise.h"

namespace hgrn {
namespace {

using testing::random_tensor;

TEST(Sigmoid, ForwardMatchesFormulaAndStaysFiniteAtExtremes) {
  Tape tape;
  const std::vector<double> xs = {-1000, -3, 0, 0.5, 1000};
  for (DType dtype : {DType::F64, DType::F32}) {
    Var y = sigmoid(tape, make_var(Tensor::from_vector<double>(xs, {5}).to(dtype)));
    for (size_t i = 0; i < xs.size(); ++i)
      EXPECT_NEAR(y->value.item(static_cast<int64_t>(i)), 1.0 / (1.0 + std::exp(-xs[i])), 1e-7) << xs[i];
  }
}

TEST(Sigmoid, GradientsMatchFiniteDifferences) {
  Rng rng(1);
  Var x = make_var(random_tensor(rng, {3, 5}, 3.0), true, "x");
  testing::expect_gradients_match([&](Tape& tape, const std::vector<Var>&) { return sigmoid(tape, x); }, {x});
}

TEST(Mul, GradientsMatchFiniteDifferencesAlsoForASharedInput) {
  Rng rng(2);
  Var a = make_var(random_tensor(rng, {2, 3, 4}), true, "a"), b = make_var(random_tensor(rng, {2, 3, 4}), true, "b");
  testing::expect_gradients_match([&](Tape& tape, const std::vector<Var>&) { return mul(tape, a, b); }, {a, b});
  testing::expect_gradients_match([&](Tape& tape, const std::vector<Var>&) { return mul(tape, a, a); }, {a});
  Tape tape;
  EXPECT_THROW(mul(tape, a, make_var(Tensor::zeros({2, 3, 3}, DType::F64))), Error);
}

TEST(AddBias, AddsPerColumnAndItsGradientIsTheRowSum) {
  Rng rng(3);
  Var x = make_var(random_tensor(rng, {2, 3, 4}), true, "x"), b = make_var(random_tensor(rng, {4}), true, "b");
  Tape tape;
  Var y = add_bias(tape, x, b);
  for (int64_t i = 0; i < y->value.numel(); ++i) EXPECT_EQ(y->value.item(i), x->value.item(i) + b->value.item(i % 4));
  testing::expect_gradients_match([&](Tape& t, const std::vector<Var>&) { return add_bias(t, x, b); }, {x, b});
  EXPECT_THROW(add_bias(tape, x, make_var(Tensor::zeros({3}, DType::F64))), Error);
  EXPECT_THROW(add_bias(tape, x, make_var(Tensor::zeros({4}, DType::F32))), Error);
}

}  // namespace
}  // namespace hgrn
