// test_swiglu_linear.cpp: the fused SwiGLU + down projection on the CPU: fp64 finite differences with hidden kept
// and recomputed, bit-for-bit agreement with the composition linear(swiglu(gate, up)), frozen inputs, and errors.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/linear.h"
#include "ops/swiglu_linear.h"

namespace hgrn {
namespace {

// With and without a residual added by the GEMM (its gradient is the output's).
TEST(SwigluLinear, GradientsMatchFiniteDifferences) {
  for (bool with_residual : {false, true}) {
    for (bool keep_hidden : {true, false}) {
      SCOPED_TRACE(::testing::Message() << (keep_hidden ? "hidden kept" : "hidden recomputed")
                                        << (with_residual ? ", with a residual" : ""));
      Rng rng(41);
      std::vector<Var> inputs{make_var(testing::random_tensor(rng, {2, 3, 5}, 3.0), true, "gate"),
                              make_var(testing::random_tensor(rng, {2, 3, 5}), true, "up"),
                              make_var(testing::random_tensor(rng, {4, 5}, 0.5), true, "w")};
      if (with_residual) inputs.push_back(make_var(testing::random_tensor(rng, {2, 3, 4}), true, "r"));
      testing::expect_gradients_match(
          [keep_hidden](Tape& t, const std::vector<Var>& in) {
            return swiglu_linear(t, in[0], in[1], in[2], keep_hidden, in.size() > 3 ? in[3] : nullptr);
          },
          inputs);
    }
  }
}

// Same GEMM calls and the same element-wise arithmetic as the composition, and hidden recomputed with the forward's
// expression: every value and gradient is identical, not merely close.
TEST(SwigluLinear, SameBitsAsTheComposition) {
  Rng rng(42);
  const Tensor gate = testing::random_tensor(rng, {7, 13}, 3.0, DType::F32);
  const Tensor up = testing::random_tensor(rng, {7, 13}, 1.0, DType::F32);
  const Tensor w = testing::random_tensor(rng, {6, 13}, 0.3, DType::F32);
  const Tensor dy = testing::random_tensor(rng, {7, 6}, 1.0, DType::F32);
  Tape ref_tape;
  Var rg = make_var(gate, true), ru = make_var(up, true), rw = make_var(w, true);
  Var ry = linear(ref_tape, swiglu(ref_tape, rg, ru), rw);
  ref_tape.backward(ry, dy);
  for (bool keep_hidden : {true, false}) {
    SCOPED_TRACE(keep_hidden ? "hidden kept" : "hidden recomputed");
    Tape tape;
    Var g = make_var(gate, true), u = make_var(up, true), wv = make_var(w, true);
    Var y = swiglu_linear(tape, g, u, wv, keep_hidden);
    tape.backward(y, dy);
    for (auto [got, want, what] : {std::tuple{&y->value, &ry->value, "y"}, std::tuple{&g->grad, &rg->grad, "dgate"},
                                   std::tuple{&u->grad, &ru->grad, "dup"}, std::tuple{&wv->grad, &rw->grad, "dW"}}) {
      ASSERT_EQ(got->shape(), want->shape()) << what;
      for (int64_t i = 0; i < want->numel(); ++i) ASSERT_EQ(got->item(i), want->item(i)) << what << " element " << i;
    }
  }
}

// Only the weight wants a gradient (hidden is then made by the forward kernel in the backward), or only gate and up.
TEST(SwigluLinear, FrozenInputs) {
  Rng rng(43);
  for (bool keep_hidden : {true, false}) {
    SCOPED_TRACE(keep_hidden ? "hidden kept" : "hidden recomputed");
    Var gate = make_var(testing::random_tensor(rng, {3, 4}, 3.0), false, "gate");
    Var up = make_var(testing::random_tensor(rng, {3, 4}), false, "up");
    Var w = make_var(testing::random_tensor(rng, {2, 4}, 0.5), true, "w");
    const auto f = [keep_hidden](Tape& t, const std::vector<Var>& in) {
      return swiglu_linear(t, in[0], in[1], in[2], keep_hidden);
    };
    testing::expect_gradients_match(f, {gate, up, w});
    EXPECT_FALSE(gate->grad.defined());
    EXPECT_FALSE(up->grad.defined());
    Var gate2 = make_var(testing::random_tensor(rng, {3, 4}, 3.0), true, "gate");
    Var up2 = make_var(testing::random_tensor(rng, {3, 4}), true, "up");
    Var w2 = make_var(testing::random_tensor(rng, {2, 4}, 0.5), false, "w");
    testing::expect_gradients_match(f, {gate2, up2, w2});
    EXPECT_FALSE(w2->grad.defined());
  }
}

TEST(SwigluLinear, RejectsMismatchedInputs) {
  Tape tape;
  const Var w = make_var(Tensor::zeros({2, 3}, DType::F32));
  EXPECT_THROW(swiglu_linear(tape, make_var(Tensor::zeros({2, 3}, DType::F32)),
                             make_var(Tensor::zeros({3, 2}, DType::F32)), w, false),
               Error);
  EXPECT_THROW(swiglu_linear(tape, make_var(Tensor::zeros({2, 3}, DType::F32)),
                             make_var(Tensor::zeros({2, 3}, DType::F64)), w, false),
               Error);
  EXPECT_THROW(swiglu_linear(tape, make_var(Tensor::zeros({2, 4}, DType::F32)),
                             make_var(Tensor::zeros({2, 4}, DType::F32)), w, false),
               Error);  // the weight's input width is 3
}

}  // namespace
}  // namespace hgrn
