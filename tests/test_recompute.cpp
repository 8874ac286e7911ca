// test_recompute.cpp: rematerialize (selective recomputation): the value is freed at the call, back before the
// backward reads it, the gradients are those of keeping it, bit for bit; a value recomputed with another shape is
// refused; an untaped (evaluation) forward keeps everything.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/linear.h"
#include "ops/recompute.h"

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

}  // namespace
}  // namespace hgrn
