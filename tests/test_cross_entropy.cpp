// test_cross_entropy.cpp: cross-entropy loss and counts against an independent double computation and hand values,
// ignore_index handling, stability for large logits, fp64 finite differences, and target errors.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "ops/cross_entropy.h"

namespace hgrn {
namespace {

TEST(CrossEntropy, HandValues) {
  Tape tape;
  // Row 0: two equal logits, loss log 2, argmax (first) is 0 = target. Row 1: target 2 has the largest logit.
  Var logits = make_var(Tensor::from_vector<double>({0, 0, 0, 1, 2, 3}, {2, 3}));
  CrossEntropyResult r = cross_entropy(tape, logits, Tensor::from_vector<int64_t>({0, 2}, {2}));
  const double row1 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  EXPECT_EQ(r.loss->value.dim(), 0);
  EXPECT_EQ(r.loss->value.numel(), 1);
  EXPECT_NEAR(r.loss->value.item(), (std::log(3.0) + row1) / 2, 1e-15);
  EXPECT_EQ(r.num_targets, 2);
  EXPECT_EQ(r.num_correct, 2);
}

TEST(CrossEntropy, ForwardMatchesDoubleReferenceWithIgnoredRows) {
  Rng rng(41);
  const int64_t rows = 9, vocab = 11;
  Tensor logits = testing::random_tensor(rng, {rows, vocab}, 3.0);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 4 == 1 ? -100 : static_cast<int32_t>(rng.below(vocab));
  targets[0] = 0;
  // Make row 0 certainly correct and row 2 certainly wrong.
  logits.set_item(0, 50);
  logits.set_item(2 * vocab + (targets[2] + 1) % vocab, 50);

  double total = 0;
  int64_t count = 0, correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] == -100) continue;
    double sum = 0, best = -1e300;
    int64_t best_index = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      sum += std::exp(logits.item(r * vocab + v));
      if (logits.item(r * vocab + v) > best) best = logits.item(r * vocab + v), best_index = v;
    }
    total += std::log(sum) - logits.item(r * vocab + targets[r]);
    ++count;
    correct += best_index == targets[r];
  }
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-13 : 1e-5;  // relative; fp32 logits are rounded inputs
    Tape tape;
    CrossEntropyResult r = cross_entropy(tape, make_var(logits.to(dtype)),
                                         Tensor::from_vector<int32_t>(targets, {rows}));
    EXPECT_NEAR(r.loss->value.item(), total / count, tol * total / count) << dtype_name(dtype);
    EXPECT_EQ(r.num_targets, count);
    EXPECT_EQ(r.num_correct, correct);
  }
  EXPECT_GE(correct, 1);
  EXPECT_LT(correct, count);
}

TEST(CrossEntropy, GradientsMatchFiniteDifferences) {
  Rng rng(42);
  Var logits = make_var(testing::random_tensor(rng, {6, 5}, 2.0), true, "logits");
  Tensor targets = Tensor::from_vector<int64_t>({4, -100, 0, 2, -100, 3}, {6});
  testing::expect_gradients_match(
      [&](Tape& t, const std::vector<Var>& in) { return cross_entropy(t, in[0], targets).loss; }, {logits});
}

TEST(CrossEntropy, IgnoredRowsContributeNothing) {
  Rng rng(43);
  Tensor base = testing::random_tensor(rng, {4, 6});
  Tensor targets = Tensor::from_vector<int32_t>({1, 7, 5, 7}, {4});  // ignore_index 7 (inside the vocab range is fine)
  Tensor perturbed = base.clone();
  for (int64_t v = 0; v < 6; ++v) perturbed.set_item(1 * 6 + v, 100.0 * v), perturbed.set_item(3 * 6 + v, -40.0);

  Tape tape;
  Var a = make_var(base, true, "a"), b = make_var(perturbed, true, "b");
  CrossEntropyResult ra = cross_entropy(tape, a, targets, 7);
  tape.backward(ra.loss);
  CrossEntropyResult rb = cross_entropy(tape, b, targets, 7);
  tape.backward(rb.loss);
  EXPECT_EQ(ra.loss->value.item(), rb.loss->value.item());
  EXPECT_EQ(ra.num_targets, 2);
  for (int64_t v = 0; v < 6; ++v) {
    EXPECT_EQ(a->grad.item(1 * 6 + v), 0.0);
    EXPECT_EQ(a->grad.item(3 * 6 + v), 0.0);
    EXPECT_EQ(a->grad.item(0 * 6 + v), b->grad.item(0 * 6 + v));
    EXPECT_NE(a->grad.item(0 * 6 + v), 0.0);
  }
}

TEST(CrossEntropy, AllRowsIgnoredGivesZeroLossAndZeroGradient) {
  Tape tape;
  Var logits = make_var(Tensor::from_vector<double>({1, 2, 3, 4}, {2, 2}), true, "logits");
  CrossEntropyResult r = cross_entropy(tape, logits, Tensor::from_vector<int64_t>({-100, -100}, {2}));
  EXPECT_EQ(r.loss->value.item(), 0.0);
  EXPECT_EQ(r.num_targets, 0);
  EXPECT_EQ(r.num_correct, 0);
  tape.backward(r.loss);
  ASSERT_TRUE(logits->grad.defined());
  for (double g : logits->grad.to_double_vector()) EXPECT_EQ(g, 0.0);
}

TEST(CrossEntropy, LargeLogitsAreStable) {
  Tape tape;
  Var logits = make_var(Tensor::from_vector<float>({1000, -1000, 0, 999}, {2, 2}), true, "logits");
  CrossEntropyResult r = cross_entropy(tape, logits, Tensor::from_vector<int32_t>({1, 0}, {2}));
  // Row 0: loss 2000; row 1: log(1 + e^999) − 0 = 999 + log1p(e^−999) = 999.
  EXPECT_NEAR(r.loss->value.item(), (2000.0 + 999.0) / 2, 1e-3);  // fp32 ulp at ~1500 is 1.2e-4
  tape.backward(r.loss);
  for (double g : logits->grad.to_double_vector()) EXPECT_TRUE(std::isfinite(g));
  EXPECT_NEAR(logits->grad.item(0), 0.5, 1e-7);   // (softmax − onehot) / 2 = (1 − 0) / 2
  EXPECT_NEAR(logits->grad.item(1), -0.5, 1e-7);  // (0 − 1) / 2
}

TEST(CrossEntropy, Int32AndInt64TargetsAgree) {
  Rng rng(44);
  Tensor logits = testing::random_tensor(rng, {3, 4});
  Tape tape;
  const double a = cross_entropy(tape, make_var(logits), Tensor::from_vector<int32_t>({3, 0, 1}, {3})).loss->value.item();
  const double b = cross_entropy(tape, make_var(logits), Tensor::from_vector<int64_t>({3, 0, 1}, {3})).loss->value.item();
  EXPECT_EQ(a, b);
}

TEST(CrossEntropy, RejectsBadTargetsAndShapes) {
  Tape tape;
  Var logits = make_var(Tensor::zeros({2, 3}, DType::F32));
  try {
    cross_entropy(tape, logits, Tensor::from_vector<int32_t>({0, 3}, {2}));
    FAIL() << "target 3 with vocab 3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cross_entropy(tape, logits, Tensor::from_vector<int32_t>({0, -1}, {2})), Error);  // −1 ≠ ignore_index
  EXPECT_THROW(cross_entropy(tape, logits, Tensor::from_vector<int32_t>({0, 1, 2}, {3})), Error);  // wrong length
  EXPECT_THROW(cross_entropy(tape, logits, Tensor::zeros({2}, DType::F32)), Error);                // float targets
  EXPECT_THROW(cross_entropy(tape, make_var(Tensor::zeros({6}, DType::F32)), Tensor::from_vector<int32_t>({0}, {1})),
               Error);  // logits not [N, Vocab]
}

}  // namespace
}  // namespace hgrn
