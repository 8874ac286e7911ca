// test_recompute.cpp: rematerialize (selective recomputation): the value is freed at the call, back before the
// backward reads it, the gradients are those of keeping it, bit for bit; a value recomputed with another shape is
// refused; an untaped (evaluation) forward keeps everything. release_value (a residual branch's output, which no
// backward reads): freed at once, its gradient made like it and equal bit for bit; releasing it twice is an error.
// release_until_producer_backward (a norm's output, written again by the norm's backward for the linears' weight
// gradients that wait for it): the same gradients bit for bit; work waits only where a producer brings the value back.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/elementwise.h"
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

// linear(rmsnorm(residual + delta)): the delta branch's gradient with its value kept or released after the add.
std::vector<double> branch_gradient(const Tensor& r0, const Tensor& d0, const Tensor& w0, const Tensor& dy,
                                    bool released) {
  Var residual = make_var(r0.clone(), true, "residual"), delta = make_var(d0.clone(), true, "delta");
  Var w = make_var(w0.clone(), true, "w");
  Tape tape;
  Var y = linear(tape, rmsnorm(tape, add(tape, residual, delta), nullptr, 1e-6), w);
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

// Two linears read a norm's output (as q, f and i read attn_norm's), summed by add or by the second taking the first
// as its residual (as o_proj takes the stream), whose handed-over gradient another norm then adds into. With the
// output released until the norm's backward, the linears' weight gradients wait for the norm to write it again:
// every gradient must equal keeping it, bit for bit (so the waiting dy must not see that add: copy on write), and
// the value must be gone between the forward and then.
struct NormRun {
  std::vector<std::vector<double>> grads;
  bool freed_after_forward = false, freed_after_backward = false;
};
NormRun norm_then_linears(const Tensor& x0, const Tensor& g0, const Tensor& w0, const Tensor& v0, const Tensor& dy,
                          bool residual, bool released) {
  Var x = make_var(x0.clone(), true, "x");
  Var g = make_var(g0.clone(), true, "norm weight");
  Var w = make_var(w0.clone(), true, "w"), v = make_var(v0.clone(), true, "v");
  Tape tape;
  const Var normed = rmsnorm(tape, x, g, 1e-6);
  Var y1 = linear(tape, normed, w);
  Var y;
  if (residual) {
    const Var other = rmsnorm(tape, y1, nullptr, 1e-6);  // its backward adds into y1's gradient after the hand-over
    y = add(tape, linear(tape, normed, v, y1), other);
  } else {
    y = add(tape, y1, linear(tape, normed, v));
  }
  NormRun run;
  if (released) {
    release_until_producer_backward(tape, normed);
    run.freed_after_forward = !normed->value.defined();
  }
  tape.backward(y, dy);
  run.freed_after_backward = !normed->value.defined();
  for (const Var& p : {x, g, w, v})
    run.grads.push_back(p->grad.defined() ? p->grad.to_double_vector() : std::vector<double>{});
  return run;
}

TEST(ReleaseUntilProducerBackward, NormOutputComesBackInTheNormsBackwardWithTheSameGradients) {
  Rng rng(9);
  for (DType dtype : {DType::F64, DType::F32}) {
    for (bool residual : {false, true}) {
      SCOPED_TRACE(detail::concat(dtype_name(dtype), residual ? " residual" : " add"));
      const Tensor x = testing::random_tensor(rng, {2, 5, 9}, 1.0, dtype);
      const Tensor g = testing::random_tensor(rng, {9}, 1.0, dtype);
      const Tensor w = testing::random_tensor(rng, {4, 9}, 0.5, dtype);
      const Tensor v = testing::random_tensor(rng, {4, 9}, 0.5, dtype);
      const Tensor dy = testing::random_tensor(rng, {2, 5, 4}, 1.0, dtype);
      const NormRun kept = norm_then_linears(x, g, w, v, dy, residual, false);
      const NormRun released = norm_then_linears(x, g, w, v, dy, residual, true);
      EXPECT_FALSE(kept.freed_after_forward);
      EXPECT_TRUE(released.freed_after_forward);
      EXPECT_TRUE(released.freed_after_backward) << "the value is freed again once the waiting work has run";
      ASSERT_EQ(kept.grads.size(), released.grads.size());
      for (size_t i = 0; i < kept.grads.size(); ++i) {
        EXPECT_FALSE(kept.grads[i].empty()) << "gradient " << i;
        EXPECT_EQ(kept.grads[i], released.grads[i]) << "gradient " << i;
      }
    }
  }
}

TEST(ReleaseUntilProducerBackward, WorkWaitsOnlyForAValueItsProducerWritesAgain) {
  Var v = make_var(Tensor::zeros({3}, DType::F32), true, "v");
  int ran = 0;
  when_value_ready(v, [&] { ++ran; });  // the value is there: runs now
  EXPECT_EQ(ran, 1);
  release_value(v);  // freed for good (a residual branch's output): nothing would ever bring it back
  try {
    when_value_ready(v, [&] { ++ran; });
    FAIL() << "work was queued for a value nothing writes again";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'v' has no value"), std::string::npos) << e.what();
  }
  Var u = make_var(Tensor::zeros({3}, DType::F32), true, "u");
  Tape tape;
  release_until_producer_backward(tape, u);
  when_value_ready(u, [&] { ran += 10; });
  EXPECT_EQ(ran, 1) << "queued, not run";
  EXPECT_THROW(restore_value(u, Tensor::zeros({4}, DType::F32)), Error) << "a value of another shape";
  restore_value(u, Tensor::zeros({3}, DType::F32));
  EXPECT_EQ(ran, 11);
  EXPECT_FALSE(u->value.defined());
}

// A consumer that can read the value as FP8 codes gets them only while it is all that waits: the producer then
// writes the codes and no value, and the work finds the value undefined. A second waiter, of either kind, makes the
// producer write the value for both; a value already there runs the work at once.
TEST(ReleaseUntilProducerBackward, CodesAreOfferedOnlyToASoleWaitingConsumer) {
  uint8_t buffer[3] = {};
  const float scale = 1.0f;
  const Fp8CodesOut codes{buffer, &scale, nullptr, Fp8Format::E4M3};
  std::vector<std::string> ran;
  const auto work = [&](const Var& v, const std::string& name) {
    return [&ran, vp = v.get(), name] { ran.push_back(name + (vp->value.defined() ? ": value" : ": codes")); };
  };
  Tape tape;
  Var alone = make_var(Tensor::zeros({3}, DType::F32), true, "alone");
  release_until_producer_backward(tape, alone);
  EXPECT_EQ(codes_to_restore(alone), nullptr) << "nothing waits yet";
  when_value_or_codes_ready(alone, codes, work(alone, "alone"));
  ASSERT_NE(codes_to_restore(alone), nullptr);
  EXPECT_EQ(codes_to_restore(alone)->codes, buffer);
  EXPECT_THROW(restore_value(alone, Tensor::zeros({4}, DType::F32)), Error) << "a value of another shape";
  restore_codes(alone);
  EXPECT_EQ(codes_to_restore(alone), nullptr) << "the request is spent";
  EXPECT_THROW(restore_codes(alone), Error) << "nothing waits any more";

  for (const bool codes_first : {true, false}) {
    Var shared = make_var(Tensor::zeros({3}, DType::F32), true, "shared");
    release_until_producer_backward(tape, shared);
    if (codes_first) when_value_or_codes_ready(shared, codes, work(shared, "codes consumer"));
    when_value_ready(shared, work(shared, "value consumer"));
    if (!codes_first) when_value_or_codes_ready(shared, codes, work(shared, "codes consumer"));
    EXPECT_EQ(codes_to_restore(shared), nullptr) << "two consumers wait";
    EXPECT_THROW(restore_codes(shared), Error);
    restore_value(shared, Tensor::zeros({3}, DType::F32));
  }
  Var kept = make_var(Tensor::zeros({3}, DType::F32), true, "kept");
  when_value_or_codes_ready(kept, codes, work(kept, "kept"));
  EXPECT_EQ(ran, (std::vector<std::string>{"alone: codes", "codes consumer: value", "value consumer: value",
                                           "value consumer: value", "codes consumer: value", "kept: value"}));
}

TEST(ReleaseValue, ReleasingTwiceIsAnError) {
  Var v = make_var(Tensor::zeros({3}, DType::F32), true, "v");
  release_value(v);
  EXPECT_THROW(release_value(v), Error);
}

}  // namespace
}  // namespace hgrn
