// test_linear.cpp: linear and add against hand-computed values and fp64 finite differences; linear's residual
// (the addend of its GEMM) and the gradient hand-over it uses, including a weight gradient queued on the handed-over
// buffer while another op adds into the residual's gradient.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"

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
  Var w2 = make_var(Tensor::zeros({4, 3}, DType::F32));
  EXPECT_THROW(linear(tape, x, w2, make_var(Tensor::zeros({2, 5}, DType::F32))), Error);  // residual not [2, 4]
  EXPECT_THROW(linear(tape, x, w2, make_var(Tensor::zeros({2, 4}, DType::F64))), Error);  // nor fp32
}

TEST(Linear, ResidualIsAddedToTheProduct) {
  Tape tape;
  Var x = make_var(Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
  Var w = make_var(Tensor::from_vector<double>({1, 0, -1, 2, 1, 0}, {2, 3}));
  Var r = make_var(Tensor::from_vector<double>({10, 20, 30, 40}, {2, 2}));
  Var y = linear(tape, x, w, r);
  EXPECT_EQ(y->value.to_double_vector(), (std::vector<double>{8, 24, 28, 53}));
  EXPECT_EQ(r->value.to_double_vector(), (std::vector<double>{10, 20, 30, 40})) << "the residual is only read";
}

TEST(Linear, ResidualGradientsMatchFiniteDifferences) {
  Rng rng(10);
  Var x = make_var(testing::random_tensor(rng, {2, 3, 5}), true, "x");
  Var w = make_var(testing::random_tensor(rng, {7, 5}), true, "w");
  Var r = make_var(testing::random_tensor(rng, {2, 3, 7}), true, "r");
  // The residual a leaf (its gradient added into a buffer), and an op output (the buffer handed over).
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return linear(t, in[0], in[1], in[2]); }, {x, w, r});
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) {
        const Var stream = linear(t, in[0], in[1], in[2]);
        return linear(t, in[0], in[1], stream);
      },
      {x, w, r});
}

// The pre-norm pattern of the model: the output of a norm, released until the norm's backward, feeds a linear whose
// residual another norm also reads. The linear's weight gradient is queued with dy until the first norm's backward,
// while the second norm's backward adds into the residual's gradient, which is dy's buffer handed over: the add must
// not reach the queued dy (copy on write), or dW would be wrong.
TEST(Linear, HandedOverGradientIsCopiedBeforeAWriteWhileAQueuedWeightGradientHoldsIt) {
  Rng rng(11);
  Var x0 = make_var(testing::random_tensor(rng, {4, 6}), true, "x0");
  Var w0 = make_var(testing::random_tensor(rng, {6, 6}, 0.5), true, "w0");
  Var w = make_var(testing::random_tensor(rng, {6, 6}, 0.5), true, "w");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) {
        const Var normed = rmsnorm(t, in[0], nullptr, 1e-6);  // its backward runs last
        const Var stream = linear(t, in[0], in[1]);            // an op output: its gradient is handed a buffer
        const Var other = rmsnorm(t, stream, nullptr, 1e-6);   // adds into stream's gradient before normed's backward
        const Var out = linear(t, normed, in[2], stream);
        release_until_producer_backward(t, normed);
        return add(t, out, other);
      },
      {x0, w0, w});
}

TEST(HandOverGradient, MovesAFreshBufferAndCopiesItOnlyWhileHeldElsewhere) {
  Tape tape;
  Var a = make_var(Tensor::from_vector<double>({1, 2}, {2}), true, "a");
  Var from = add(tape, a, a), to = add(tape, a, a);  // two op outputs
  from->grad = Tensor::from_vector<double>({3, 4}, {2});
  const void* buffer = from->grad.raw_data();
  hand_over_gradient(from, to);
  EXPECT_FALSE(from->grad.defined());
  EXPECT_EQ(to->grad.raw_data(), buffer) << "moved, not copied";
  bool accumulate = false;
  EXPECT_EQ(grad_buffer_for_write(to, &accumulate).raw_data(), buffer) << "nothing else holds it: written in place";
  EXPECT_TRUE(accumulate);

  Var to2 = add(tape, a, a);
  from->grad = Tensor::from_vector<double>({5, 6}, {2});
  const Tensor held = from->grad;  // as a queued weight gradient holds dy
  hand_over_gradient(from, to2);
  Tensor& written = grad_buffer_for_write(to2, &accumulate);
  EXPECT_NE(written.raw_data(), held.raw_data()) << "copied before the write";
  EXPECT_TRUE(accumulate);
  written.set_item(0, 100);
  EXPECT_EQ(held.to_double_vector(), (std::vector<double>{5, 6}));
  EXPECT_EQ(written.to_double_vector(), (std::vector<double>{100, 6}));

  // A gradient already there is added to; a leaf gets its own buffer.
  from->grad = Tensor::from_vector<double>({1, 1}, {2});
  hand_over_gradient(from, to2);
  EXPECT_EQ(to2->grad.to_double_vector(), (std::vector<double>{101, 7}));
  from->grad = Tensor::from_vector<double>({2, 3}, {2});
  hand_over_gradient(from, a);
  EXPECT_EQ(a->grad.to_double_vector(), (std::vector<double>{2, 3}));
}

}  // namespace
}  // namespace hgrn
