// test_rotary_embedding.cpp: the rotary position embedding against the formula written out here, the property RetNet
// relies on (a query at t and a key at s meet through t − s only), the state shift as a rotation of the state's key
// axis, fp64 finite differences (row-strided input included) and argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/rotary_embedding.h"

namespace hgrn {
namespace {

// Element (i, i + K/2) of a head at position p: rotated by p · 10000^(−2i/K), straight from the definition.
double rotated(double x0, double x1, double position, int64_t i, int64_t K, bool second) {
  const double angle = position * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(K));
  return second ? x0 * std::sin(angle) + x1 * std::cos(angle) : x0 * std::cos(angle) - x1 * std::sin(angle);
}

TEST(RotaryEmbedding, ForwardMatchesFormula) {
  Rng rng(81);
  const int64_t B = 2, T = 5, H = 3, K = 6, first = 7;
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-14 : 2e-6;  // fp32: the angle's and the products' rounding
    const Tensor x = testing::random_tensor(rng, {B, T, H * K}, 1.0, dtype);
    Tape tape;
    const Tensor y = rotary_embedding(tape, make_var(x), H, first)->value;
    EXPECT_EQ(y.dtype(), dtype);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < K; ++i) {
            const int64_t base = (b * T + t) * H * K + h * K, pair = i % (K / 2);
            const double want = rotated(x.item(base + pair), x.item(base + pair + K / 2),
                                        static_cast<double>(first + t), pair, K, i >= K / 2);
            EXPECT_NEAR(y.item(base + i), want, tol) << dtype_name(dtype) << " b" << b << " t" << t << " h" << h
                                                     << " i" << i;
          }
  }
}

TEST(RotaryEmbedding, QueryKeyProductsDependOnlyOnTheDistance) {
  // ⟨rot(q, t), rot(k, s)⟩ = ⟨rot(q, t + c), rot(k, s + c)⟩ for any shift c: what lets RetNet's recurrence restart
  // positions at 0 after shifting its state.
  Rng rng(82);
  const Tensor q = testing::random_tensor(rng, {1, 1, 8}), k = testing::random_tensor(rng, {1, 1, 8});
  Tape tape;
  const auto product = [&](int64_t t, int64_t s) {
    return testing::dot(rotary_embedding(tape, make_var(q), 1, t)->value, rotary_embedding(tape, make_var(k), 1, s)->value);
  };
  EXPECT_NEAR(product(9, 4), product(5, 0), 1e-13);
  EXPECT_NEAR(product(9, 4), product(1005, 1000), 1e-11);
  EXPECT_GT(std::abs(product(9, 4) - product(9, 5)), 1e-3);  // and it does depend on the distance
}

TEST(RotaryEmbedding, StateShiftRotatesEveryColumnOfTheKeyAxis) {
  Rng rng(83);
  const int64_t B = 2, H = 2, K = 4, V = 3, shift = -11;
  const Tensor s = testing::random_tensor(rng, {B, H, K, V});
  Tape tape;
  const Tensor y = rotary_state_shift(tape, make_var(s), shift)->value;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t v = 0; v < V; ++v) {
        const int64_t pair = i % (K / 2), at = bh * K * V;
        const double want = rotated(s.item(at + pair * V + v), s.item(at + (pair + K / 2) * V + v),
                                    static_cast<double>(shift), pair, K, i >= K / 2);
        EXPECT_NEAR(y.item(at + i * V + v), want, 1e-14) << bh << " " << i << " " << v;
      }
  // A shift and its opposite give the state back.
  const Tensor back = rotary_state_shift(tape, make_var(y), -shift)->value;
  for (int64_t e = 0; e < s.numel(); ++e) EXPECT_NEAR(back.item(e), s.item(e), 1e-14);
}

TEST(RotaryEmbedding, GradientsMatchFiniteDifferencesAlsoForAColumnBlock) {
  Rng rng(84);
  Var x = make_var(testing::random_tensor(rng, {2, 3, 8}), true, "x");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return rotary_embedding(t, in[0], 2, 5); }, {x});
  // The middle column block of a wider tensor (row-strided, as the fused projection's q and k), its gradient
  // written into its columns of the whole.
  Var whole = make_var(testing::random_tensor(rng, {2, 3, 14}), true, "whole");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) {
        const std::vector<Var> blocks = split_columns(t, in[0], {3, 8, 3});
        return rotary_embedding(t, blocks[1], 2, 0);
      },
      {whole});
  Var state = make_var(testing::random_tensor(rng, {2, 2, 4, 3}), true, "state");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return rotary_state_shift(t, in[0], -70); }, {state});
}

// Rotating over the input's own columns (RetNet's q and k in the projection's output) gives the out-of-place
// rotation's values and gradients bit for bit, and fp64 finite differences hold through it back to the projection.
TEST(RotaryEmbedding, InPlaceGivesTheOutOfPlaceBitsAndGradients) {
  Rng rng(85);
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = testing::random_tensor(rng, {2, 5, 6}).to(dtype);
    const Tensor wq = testing::random_tensor(rng, {8, 6}).to(dtype), wv = testing::random_tensor(rng, {3, 6}).to(dtype);
    const Tensor dy = testing::random_tensor(rng, {2, 5, 8}).to(dtype);
    const auto run = [&](bool in_place) {
      Tape t;
      Var xs = make_var(x.clone(), true, "x"), q_w = make_var(wq.clone(), true, "wq"), v_w = make_var(wv.clone(), true, "wv");
      const std::vector<Var> blocks = linear_columns(t, xs, {q_w, v_w});
      Var y = in_place ? rotary_embedding_in_place(t, blocks[0], 2, 3) : rotary_embedding(t, blocks[0], 2, 3);
      Tensor y_value = Tensor::empty(y->value.shape(), dtype);
      y_value.copy_from(y->value);
      if (in_place) EXPECT_EQ(y->value.raw_data(), blocks[0]->value.raw_data()) << "not a view of the input";
      t.backward(y, dy);
      return std::vector<Tensor>{y_value, xs->grad, q_w->grad};
    };
    const std::vector<Tensor> copied = run(false), in_place = run(true);
    for (size_t i = 0; i < copied.size(); ++i) {
      ASSERT_EQ(copied[i].nbytes(), in_place[i].nbytes());
      EXPECT_EQ(std::memcmp(copied[i].raw_data(), in_place[i].raw_data(), copied[i].nbytes()), 0) << "result " << i;
    }
  }
  Var x = make_var(testing::random_tensor(rng, {2, 3, 6}), true, "x");
  Var wq = make_var(testing::random_tensor(rng, {8, 6}), true, "wq"), wv = make_var(testing::random_tensor(rng, {3, 6}), true, "wv");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) {
        const std::vector<Var> blocks = linear_columns(t, in[0], {in[1], in[2]});
        return rotary_embedding_in_place(t, blocks[0], 2, 7);
      },
      {x, wq, wv});
}

TEST(RotaryEmbedding, RejectsOddHeadWidthsAndBadShapes) {
  Tape tape;
  EXPECT_THROW(rotary_embedding(tape, make_var(Tensor::zeros({1, 2, 6}, DType::F32)), 2, 0), Error);  // K = 3
  EXPECT_THROW(rotary_embedding(tape, make_var(Tensor::zeros({1, 2, 8}, DType::F32)), 3, 0), Error);  // 8 / 3
  EXPECT_THROW(rotary_embedding(tape, make_var(Tensor::zeros({2, 8}, DType::F32)), 2, 0), Error);     // not 3-D
  EXPECT_THROW(rotary_state_shift(tape, make_var(Tensor::zeros({1, 2, 3, 4}, DType::F32)), 1), Error);  // K = 3
}

}  // namespace
}  // namespace hgrn
