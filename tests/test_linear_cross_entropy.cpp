// test_linear_cross_entropy.cpp: the fused LM head + loss on the CPU (the composition linear + cross_entropy that
// the GPU path is tested against): fp64 finite-difference gradients for a [B, T, D] input with ignored rows, and the
// same loss and counts as the two ops called one after the other.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/linear_cross_entropy.h"

namespace hgrn {
namespace {

TEST(LinearCrossEntropy, GradientsMatchFiniteDifferencesAndTheComposition) {
  Rng rng(17);
  Var x = make_var(testing::random_tensor(rng, {2, 5, 6}), true);
  Var w = make_var(testing::random_tensor(rng, {9, 6}, 0.5), true);
  Tensor targets = Tensor::from_vector<int32_t>({1, 8, -100, 0, 3, 3, 7, -100, 2, 5}, {10});
  testing::expect_gradients_match(
      [&](Tape& tape, const std::vector<Var>&) { return linear_cross_entropy(tape, x, w, targets).loss; }, {x, w}, 5,
      1e-6, 1e-6);
  Tape tape;
  tape.set_enabled(false);
  const CrossEntropyResult fused = linear_cross_entropy(tape, x, w, targets);
  const CrossEntropyResult plain =
      cross_entropy(tape, linear(tape, reshape(tape, x, {10, 6}), w), targets);
  EXPECT_EQ(fused.loss->value.item(), plain.loss->value.item());
  EXPECT_EQ(fused.num_targets, 8);
  EXPECT_EQ(fused.num_correct, plain.num_correct);
  EXPECT_THROW(linear_cross_entropy(tape, x, w, targets, -100, -1), Error);
}

}  // namespace
}  // namespace hgrn
