// test_recompute.cpp: rematerialize (selective recomputation): the value is freed at the call, back before the
// backward reads it, the gradients are those of keeping it, bit for bit; a value recomputed with another shape is
// refused; an untaped (evaluation) forward keeps everything. release_value (a residual branch's output, which no
// backward reads): freed at once, its gradient made like it and equal bit for bit; releasing it twice is an error.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"

namespace hgrn {
namespace {

struct Gradients {
  std::vector<double> dx, dw;
  bool freed_after_forward = false;
};

// y = linear(silu(x), W): linear's backward reads silu's output for dW.
Gradients silu_then_linear(const Tensor& x0, const Tensor& w0, const Tensor& dy, bool rematerialized) {
  Var x = make_var(x0.clone(), true, "x"), w = make_var(w0.clone(), true, "w");
  Tape tape;
  Var hidden = silu(tape, x);
  Var y = linear(tape, hidden, w);
  Gradients run;
  if (rematerialized) {
    rematerialize(tape, {hidden}, [x](Tape& untaped) { return std::vector<Tensor>{silu(untaped, x)->value}; });
    run.freed_after_forward = !hidden->value.defined();
  }
  tape.backward(y, dy);
  run.dx = x->grad.to_double_vector();
  run.dw = w->grad.to_double_vector();
  return run;
}

TEST(Rematerialize, FreesTheValueAndGivesTheSameGradientsBitForBit) {
  Rng rng(5);
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = testing::random_tensor(rng, {3, 7, 11}, 1.0, dtype);
    const Tensor w = testing::random_tensor(rng, {5, 11}, 0.5, dtype);
    const Tensor dy = testing::random_tensor(rng, {3, 7, 5}, 1.0, dtype);
    const Gradients kept = silu_then_linear(x, w, dy, false), recomputed = silu_then_linear(x, w, dy, true);
    EXPECT_TRUE(recomputed.freed_after_forward);
    EXPECT_EQ(kept.dx, recomputed.dx);
    EXPECT_EQ(kept.dw, recomputed.dw);
  }
}

TEST(Rematerialize, RefusesAValueOfAnotherShape) {
  Rng rng(6);
  Var x = make_var(testing::random_tensor(rng, {4, 6}), true, "x");
  Var w = make_var(testing::random_tensor(rng, {3, 6}), true, "w");
  Tape tape;
  Var hidden = silu(tape, x);
  Var y = linear(tape, hidden, w);
  rematerialize(tape, {hidden}, [](Tape&) { return std::vector<Tensor>{Tensor::zeros({4, 5}, DType::F64)}; });
  try {
    tape.backward(y, testing::random_tensor(rng, {4, 3}));
    FAIL() << "a recomputed value of the wrong shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("came back as [4, 5]"), std::string::npos) << e.what();
  }
}

TEST(Rematerialize, UntapedForwardKeepsTheValue) {
  Rng rng(7);
  Var x = make_var(testing::random_tensor(rng, {4, 6}));
  Tape untaped;
  untaped.set_enabled(false);
  Var hidden = silu(untaped, x);
  rematerialize(untaped, {hidden}, [](Tape&) -> std::vector<Tensor> { throw Error("must not run"); });
  EXPECT_TRUE(hidden->value.defined());
  EXPECT_EQ(untaped.size(), 0u);
}

// linear(add_rmsnorm(residual, delta)): the delta branch's gradient with its value kept or released after the add.
std::vector<double> branch_gradient(const Tensor& r0, const Tensor& d0, const Tensor& w0, const Tensor& dy,
                                    bool released) {
  Var residual = make_var(r0.clone(), true, "residual"), delta = make_var(d0.clone(), true, "delta");
  Var w = make_var(w0.clone(), true, "w");
  Tape tape;
  const AddRmsNormResult r = add_rmsnorm(tape, residual, delta, nullptr, 1e-6);
  Var y = linear(tape, r.normed, w);
  if (released) {
    release_value(delta);
    EXPECT_FALSE(delta->value.defined());
  }
  tape.backward(y, dy);
  EXPECT_EQ(delta->grad.shape(), d0.shape());
  EXPECT_EQ(delta->grad.dtype(), d0.dtype());
  return delta->grad.to_double_vector();
}

TEST(ReleaseValue, TheBranchGradientIsTheSameWithoutItsValue) {
  Rng rng(8);
  for (DType dtype : {DType::F64, DType::F32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor r = testing::random_tensor(rng, {2, 5, 9}, 1.0, dtype);
    const Tensor d = testing::random_tensor(rng, {2, 5, 9}, 1.0, dtype);
    const Tensor w = testing::random_tensor(rng, {4, 9}, 0.5, dtype);
    const Tensor dy = testing::random_tensor(rng, {2, 5, 4}, 1.0, dtype);
    EXPECT_EQ(branch_gradient(r, d, w, dy, false), branch_gradient(r, d, w, dy, true));
  }
}

TEST(ReleaseValue, ReleasingTwiceIsAnError) {
  Var v = make_var(Tensor::zeros({3}, DType::F32), true, "v");
  release_value(v);
  EXPECT_THROW(release_value(v), Error);
}

}  // namespace
}  // namespace hgrn
