// test_linear.cpp: linear and add against hand-computed values and fp64 finite differences.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/linear.h"

namespace hgrn {
namespace {

TEST(Linear, ForwardMatchesHandComputedProduct) {
  Tape tape;
  Var x = make_var(Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
  Var w = make_var(Tensor::from_vector<double>({1, 0, -1, 2, 1, 0}, {2, 3}));
  Var y = linear(tape, x, w);
  // row 0: [1-3, 2+2] = [-2, 4]; row 1: [4-6, 8+5] = [-2, 13]
  EXPECT_EQ(y->value.to_double_vector(), (std::vector<double>{-2, 4, -2, 13}));
}

TEST(Linear, GradientsMatchFiniteDifferences) {
  Rng rng(7);
  Var x = make_var(testing::random_tensor(rng, {2, 3, 5}), true, "x");
  Var w = make_var(testing::random_tensor(rng, {7, 5}), true, "w");
  testing::expect_gradients_match([](Tape& t, const std::vector<Var>& in) { return linear(t, in[0], in[1]); },
                                  {x, w});
}

TEST(Linear, TiedWeightAccumulatesBothUses) {
  Rng rng(8);
  Var x = make_var(testing::random_tensor(rng, {4, 6}), true, "x");
  Var w = make_var(testing::random_tensor(rng, {6, 6}), true, "w");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return linear(t, linear(t, in[0], in[1]), in[1]); }, {x, w});
}

TEST(Add, GradientsMatchFiniteDifferences) {
  Rng rng(9);
  Var a = make_var(testing::random_tensor(rng, {3, 4}), true, "a");
  Var b = make_var(testing::random_tensor(rng, {3, 4}), true, "b");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return add(t, in[0], in[1]); },
      {a, b}, 3, 1e-6, 1e-6);
}

TEST(Linear, RejectsMismatchedShapes) {
  Tape tape;
  Var x = make_var(Tensor::zeros({2, 3}, DType::F32));
  Var w = make_var(Tensor::zeros({4, 5}, DType::F32));
  EXPECT_THROW(linear(tape, x, w), Error);
}

}  // namespace
}  // namespace hgrn
