// test_gated_rmsnorm_linear.cpp: swiglu_linear with a normalised up operand (UpNorm: fla's FusedRMSNormGated then
// the output projection) on the CPU: fp64 finite differences (whole rows and per-head groups, a gate read as a column
// block, a residual, hidden kept and recomputed, a frozen norm weight) and bit-for-bit agreement with the
// composition rmsnorm then swiglu_linear.
#include <gtest/gtest.h>

#include <tuple>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu_linear.h"

namespace hgrn {
namespace {

TEST(GatedRmsnormLinear, GradientsMatchFiniteDifferences) {
  for (int64_t group_width : {0, 3}) {
    for (bool keep_hidden : {true, false}) {
      for (bool gate_block : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "group width " << group_width << (keep_hidden ? ", hidden kept" : "")
                                          << (gate_block ? ", gate a column block" : ""));
        Rng rng(51 + group_width);
        // gate [2, 3, 6] (or the first 6 of 8 columns), o [2, 3, 6], W [4, 6], norm weight [6] or [3], residual.
        std::vector<Var> inputs{make_var(testing::random_tensor(rng, {2, 3, gate_block ? 8 : 6}, 3.0), true, "gate"),
                                make_var(testing::random_tensor(rng, {2, 3, 6}), true, "o"),
                                make_var(testing::random_tensor(rng, {4, 6}, 0.5), true, "w"),
                                make_var(testing::random_tensor(rng, {group_width ? group_width : 6}, 0.3), true,
                                         "norm weight"),
                                make_var(testing::random_tensor(rng, {2, 3, 4}), true, "r")};
        double* nw = inputs[3]->value.data<double>();  // weights near 1, as trained norms have
        for (int64_t i = 0; i < inputs[3]->value.numel(); ++i) nw[i] += 1.0;
        testing::expect_gradients_match(
            [&](Tape& t, const std::vector<Var>& in) {
              const Var gate = gate_block ? split_columns(t, in[0], {6, 2})[0] : in[0];
              const UpNorm norm{in[3], 1e-5, group_width};
              return swiglu_linear(t, gate, in[1], in[2], keep_hidden, in[4], &norm);
            },
            inputs);
      }
    }
  }
}

// Only the projection's weight wants a gradient (hidden is then made again by the forward), or all but the norm's.
TEST(GatedRmsnormLinear, FrozenInputs) {
  Rng rng(52);
  for (bool keep_hidden : {true, false}) {
    SCOPED_TRACE(keep_hidden ? "hidden kept" : "hidden recomputed");
    const auto f = [keep_hidden](Tape& t, const std::vector<Var>& in) {
      const UpNorm norm{in[3], 1e-6, 0};
      return swiglu_linear(t, in[0], in[1], in[2], keep_hidden, nullptr, &norm);
    };
    Var gate = make_var(testing::random_tensor(rng, {3, 4}, 3.0), false, "gate");
    Var o = make_var(testing::random_tensor(rng, {3, 4}), false, "o");
    Var w = make_var(testing::random_tensor(rng, {2, 4}, 0.5), true, "w");
    Var nw = make_var(testing::random_tensor(rng, {4}), false, "norm weight");
    testing::expect_gradients_match(f, {gate, o, w, nw});
    EXPECT_FALSE(gate->grad.defined());
    EXPECT_FALSE(o->grad.defined());
    EXPECT_FALSE(nw->grad.defined());
    Var gate2 = make_var(testing::random_tensor(rng, {3, 4}, 3.0), true, "gate");
    Var o2 = make_var(testing::random_tensor(rng, {3, 4}), true, "o");
    testing::expect_gradients_match(f, {gate2, o2, w, nw});
    EXPECT_FALSE(nw->grad.defined());
  }
}

// The normalised up operand gives the values and gradients of rmsnorm followed by swiglu_linear, bit for bit.
TEST(GatedRmsnormLinear, SameBitsAsTheComposition) {
  for (int64_t group_width : {0, 5}) {
    SCOPED_TRACE(::testing::Message() << "group width " << group_width);
    Rng rng(53);
    const Tensor gate = testing::random_tensor(rng, {7, 15}, 3.0, DType::F32);
    const Tensor o = testing::random_tensor(rng, {7, 15}, 1.0, DType::F32);
    const Tensor nw = testing::random_tensor(rng, {group_width ? group_width : 15}, 1.0, DType::F32);
    const Tensor w = testing::random_tensor(rng, {6, 15}, 0.3, DType::F32);
    const Tensor dy = testing::random_tensor(rng, {7, 6}, 1.0, DType::F32);
    Tape ref_tape;
    Var rg = make_var(gate, true), ro = make_var(o, true), rn = make_var(nw, true), rw = make_var(w, true);
    Var ry = swiglu_linear(ref_tape, rg, rmsnorm(ref_tape, ro, rn, 1e-6, group_width), rw, true);
    ref_tape.backward(ry, dy);
    for (bool keep_hidden : {true, false}) {
      SCOPED_TRACE(keep_hidden ? "hidden kept" : "hidden recomputed");
      Tape tape;
      Var g = make_var(gate, true), ov = make_var(o, true), n = make_var(nw, true), wv = make_var(w, true);
      const UpNorm norm{n, 1e-6, group_width};
      Var y = swiglu_linear(tape, g, ov, wv, keep_hidden, nullptr, &norm);
      tape.backward(y, dy);
      for (auto [got, want, what] :
           {std::tuple{&y->value, &ry->value, "y"}, std::tuple{&g->grad, &rg->grad, "dgate"},
            std::tuple{&ov->grad, &ro->grad, "do"}, std::tuple{&n->grad, &rn->grad, "dnorm"},
            std::tuple{&wv->grad, &rw->grad, "dW"}}) {
        ASSERT_EQ(got->shape(), want->shape()) << what;
        for (int64_t i = 0; i < want->numel(); ++i) ASSERT_EQ(got->item(i), want->item(i)) << what << " element " << i;
      }
    }
  }
}

TEST(GatedRmsnormLinear, RejectsMismatchedInputs) {
  Tape tape;
  const Var w = make_var(Tensor::zeros({2, 4}, DType::F32));
  const Var gate = make_var(Tensor::zeros({3, 4}, DType::F32)), o = make_var(Tensor::zeros({3, 4}, DType::F32));
  const UpNorm wrong_weight{make_var(Tensor::full({3}, 1.0, DType::F32)), 1e-6, 0};
  EXPECT_THROW(swiglu_linear(tape, gate, o, w, false, nullptr, &wrong_weight), Error);
  const UpNorm wrong_group{make_var(Tensor::full({3}, 1.0, DType::F32)), 1e-6, 3};  // 3 does not divide 4
  EXPECT_THROW(swiglu_linear(tape, gate, o, w, false, nullptr, &wrong_group), Error);
  const UpNorm negative_eps{make_var(Tensor::full({4}, 1.0, DType::F32)), -1.0, 0};
  EXPECT_THROW(swiglu_linear(tape, gate, o, w, false, nullptr, &negative_eps), Error);
}

}  // namespace
}  // namespace hgrn
