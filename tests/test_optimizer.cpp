// test_optimizer.cpp: AdamW against a scalar re-derivation of the update, decay groups, skipped parameters,
// gradient-norm clipping, zero_grad and the checkpoint state round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "train/optimizer.h"

namespace hgrn {
namespace {

// The AdamW update for one scalar, written out independently of the optimiser's code.
struct ScalarAdamW {
  double p, m = 0.0, v = 0.0;
  void step(double g, double lr, int64_t t, bool decay, const AdamWConfig& c) {
    m = c.beta1 * m + (1.0 - c.beta1) * g;
    v = c.beta2 * v + (1.0 - c.beta2) * g * g;
    const double m_hat = m / (1.0 - std::pow(c.beta1, static_cast<double>(t)));
    const double v_hat = v / (1.0 - std::pow(c.beta2, static_cast<double>(t)));
    p -= lr * (m_hat / (std::sqrt(v_hat) + c.eps) + (decay ? c.weight_decay * p : 0.0));
  }
};

Var param_from(const std::vector<double>& values, DType dtype = DType::F64, const std::string& name = "p") {
  Tensor t = Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())});
  return make_var(dtype == DType::F64 ? t : t.to(dtype), true, name);
}

void set_grad(const Var& v, const std::vector<double>& values) {
  Tensor& g = grad_buffer(v);
  for (size_t i = 0; i < values.size(); ++i) g.set_item(static_cast<int64_t>(i), values[i]);
}

TEST(AdamW, FirstStepMatchesScalarFormula) {
  AdamWConfig config;
  config.weight_decay = 0.1;
  const std::vector<double> init = {0.5, -1.25, 2.0}, grad = {0.3, -0.02, 0.0};
  Var p = param_from(init);
  AdamW opt({{p, true}}, config);
  set_grad(p, grad);
  opt.step(1e-2);
  EXPECT_EQ(opt.step_count(), 1);
  for (size_t i = 0; i < init.size(); ++i) {
    ScalarAdamW ref{init[i]};
    ref.step(grad[i], 1e-2, 1, true, config);
    EXPECT_NEAR(p->value.item(static_cast<int64_t>(i)), ref.p, 1e-15) << "element " << i;
    EXPECT_NEAR(opt.first_moments()[0].item(static_cast<int64_t>(i)), ref.m, 1e-15);
    EXPECT_NEAR(opt.second_moments()[0].item(static_cast<int64_t>(i)), ref.v, 1e-15);
  }
  // After one bias-corrected step the Adam part is lr * g / (|g| + eps): about lr * sign(g).
  EXPECT_NEAR(p->value.item(0), 0.5 * (1 - 1e-3) - 1e-2, 1e-9);
  EXPECT_NEAR(p->value.item(1), -1.25 * (1 - 1e-3) + 1e-2, 1e-8);
  EXPECT_DOUBLE_EQ(p->value.item(2), 2.0 * (1 - 1e-3));  // zero gradient: decay only
}

TEST(AdamW, SeveralStepsMatchScalarFormulaInBothPrecisions) {
  AdamWConfig config{0.8, 0.9, 1e-6, 0.05};
  const std::vector<double> init = {0.1, -0.7, 1.5, 0.0};
  for (DType dtype : {DType::F64, DType::F32}) {
    Var decayed = param_from(init, dtype, "w");
    Var undecayed = param_from(init, dtype, "norm");
    AdamW opt({{decayed, true}, {undecayed, false}}, config);
    EXPECT_EQ(opt.first_moments()[0].dtype(), dtype);
    EXPECT_EQ(opt.second_moments()[1].dtype(), dtype);
    std::vector<ScalarAdamW> ref_decayed, ref_undecayed;
    for (double x : init) {
      ref_decayed.push_back({x});
      ref_undecayed.push_back({x});
    }
    for (int64_t t = 1; t <= 6; ++t) {
      const double lr = 1e-2 / static_cast<double>(t);
      std::vector<double> g;
      for (size_t i = 0; i < init.size(); ++i) g.push_back(std::sin(0.7 * static_cast<double>(t * 4 + i)) * (1.0 + i));
      set_grad(decayed, g);
      set_grad(undecayed, g);
      opt.step(lr);
      for (size_t i = 0; i < init.size(); ++i) {
        ref_decayed[i].step(g[i], lr, t, true, config);
        ref_undecayed[i].step(g[i], lr, t, false, config);
      }
    }
    EXPECT_EQ(opt.step_count(), 6);
    const double tol = dtype == DType::F64 ? 1e-14 : 1e-6;
    for (size_t i = 0; i < init.size(); ++i) {
      EXPECT_NEAR(decayed->value.item(static_cast<int64_t>(i)), ref_decayed[i].p, tol) << dtype_name(dtype);
      EXPECT_NEAR(undecayed->value.item(static_cast<int64_t>(i)), ref_undecayed[i].p, tol) << dtype_name(dtype);
      EXPECT_NEAR(opt.first_moments()[0].item(static_cast<int64_t>(i)), ref_decayed[i].m, tol);
      EXPECT_NEAR(opt.second_moments()[0].item(static_cast<int64_t>(i)), ref_decayed[i].v, tol);
    }
  }
}

TEST(AdamW, WeightDecayOnlyTouchesDecayedParams) {
  AdamWConfig config;
  config.weight_decay = 0.5;
  Var decayed = param_from({2.0, -4.0});
  Var undecayed = param_from({2.0, -4.0});
  AdamW opt({{decayed, true}, {undecayed, false}}, config);
  set_grad(decayed, {0.0, 0.0});  // zero gradients: the Adam part of the update is exactly zero
  set_grad(undecayed, {0.0, 0.0});
  opt.step(0.1);
  EXPECT_DOUBLE_EQ(decayed->value.item(0), 2.0 * (1 - 0.05));
  EXPECT_DOUBLE_EQ(decayed->value.item(1), -4.0 * (1 - 0.05));
  EXPECT_EQ(undecayed->value.item(0), 2.0);
  EXPECT_EQ(undecayed->value.item(1), -4.0);
}

TEST(AdamW, ParamWithoutGradIsSkipped) {
  Var with_grad = param_from({1.0, 2.0});
  Var without_grad = param_from({3.0, 4.0});
  AdamW opt({{with_grad, true}, {without_grad, true}}, AdamWConfig{});
  set_grad(with_grad, {0.5, -0.5});
  opt.step(0.1);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_NE(with_grad->value.item(0), 1.0);
  EXPECT_EQ(without_grad->value.to_double_vector(), (std::vector<double>{3.0, 4.0}));  // not even decayed
  EXPECT_EQ(opt.first_moments()[1].to_double_vector(), (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(opt.second_moments()[1].to_double_vector(), (std::vector<double>{0.0, 0.0}));
  EXPECT_FALSE(without_grad->grad.defined());
}

TEST(AdamW, ZeroGradKeepsBuffers) {
  Var a = param_from({1.0, 2.0, 3.0});
  Var b = param_from({1.0});
  AdamW opt({{a, true}, {b, false}}, AdamWConfig{});
  set_grad(a, {1.0, -2.0, 3.0});
  const void* buffer = a->grad.raw_data();
  opt.zero_grad();
  ASSERT_TRUE(a->grad.defined());
  EXPECT_TRUE(a->grad_stale);  // lazily: marked zero, the old values left in place
  EXPECT_EQ(grad_buffer(a).raw_data(), buffer);
  EXPECT_EQ(a->grad.to_double_vector(), (std::vector<double>{0.0, 0.0, 0.0}));
  EXPECT_FALSE(a->grad_stale);
  EXPECT_FALSE(b->grad.defined());
  // The next step's first write overwrites the buffer...
  opt.zero_grad();
  bool accumulate = true;
  EXPECT_EQ(grad_buffer_for_write(a, &accumulate).raw_data(), buffer);
  EXPECT_FALSE(accumulate);
  EXPECT_TRUE(grad_buffer_for_write(a, &accumulate).defined());
  EXPECT_TRUE(accumulate);  // ...and a second one adds to it
}

// A gradient that zero_grad marked zero and nothing wrote since is a zero gradient to the update and the norm
// (the same bits as a zero-filled one), not last step's values.
TEST(AdamW, UnwrittenGradientAfterZeroGradCountsAsZero) {
  AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  Var lazy = param_from({0.5, -1.0, 2.0}, DType::F32, "lazy");
  Var filled = param_from({0.5, -1.0, 2.0}, DType::F32, "filled");
  AdamW opt_lazy({{lazy, true}}, config), opt_filled({{filled, true}}, config);
  set_grad(lazy, {1.0, 2.0, -3.0});
  set_grad(filled, {1.0, 2.0, -3.0});
  opt_lazy.step(1e-2);
  opt_filled.step(1e-2);
  opt_lazy.zero_grad();  // step 2: no gradient arrives
  set_grad(filled, {0.0, 0.0, 0.0});
  EXPECT_EQ(grad_norm_and_clip_factor(opt_lazy.params(), 1.0).norm, 0.0);
  opt_lazy.zero_grad();
  opt_lazy.step(1e-2);
  opt_filled.step(1e-2);
  EXPECT_EQ(lazy->value.to_double_vector(), filled->value.to_double_vector());
  EXPECT_EQ(opt_lazy.first_moments()[0].to_double_vector(), opt_filled.first_moments()[0].to_double_vector());
}

TEST(AdamW, RejectsUnsupportedParamsAndConfigs) {
  Var bf = make_var(Tensor::zeros({2}, DType::BF16), true, "bf");
  EXPECT_THROW(AdamW({{bf, true}}, AdamWConfig{}), Error);
  Var ints = make_var(Tensor::zeros({2}, DType::I32), true, "ints");
  EXPECT_THROW(AdamW({{ints, true}}, AdamWConfig{}), Error);
  EXPECT_THROW(AdamW({{nullptr, true}}, AdamWConfig{}), Error);
  Var p = param_from({1.0});
  EXPECT_THROW(AdamW({{p, true}}, AdamWConfig{1.0, 0.95, 1e-8, 0.1}), Error);
  EXPECT_THROW(AdamW({{p, true}}, AdamWConfig{0.9, 0.95, 0.0, 0.1}), Error);
  EXPECT_THROW(AdamW({{p, true}}, AdamWConfig{0.9, 0.95, 1e-8, -1.0}), Error);
  AdamW opt({{p, true}}, AdamWConfig{});
  EXPECT_THROW(opt.step(-1.0), Error);
  EXPECT_THROW(opt.step(std::nan("")), Error);
}

TEST(AdamW, LoadStateRoundTripContinuesIdentically) {
  AdamWConfig config{0.9, 0.95, 1e-8, 0.1};
  auto grads_for_step = [](int64_t t) {
    return std::vector<double>{std::cos(0.3 * t), -0.1 * t, 0.25, std::sin(1.7 * t)};
  };
  Var a = param_from({0.3, -0.2, 0.9, 1.1}, DType::F32, "a");
  AdamW original({{a, true}}, config);
  for (int64_t t = 0; t < 3; ++t) {
    set_grad(a, grads_for_step(t));
    original.step(1e-2);
  }
  // "Checkpoint": parameter values, moments and step count, copied out.
  Var b = make_var(a->value.clone(), true, "a");
  std::vector<Tensor> m = {original.first_moments()[0].clone()};
  std::vector<Tensor> v = {original.second_moments()[0].clone()};
  AdamW resumed({{b, true}}, config);
  resumed.load_state(m, v, original.step_count());
  EXPECT_EQ(resumed.step_count(), 3);
  m[0].fill(123.0);  // the optimiser holds its own copy
  for (int64_t t = 3; t < 6; ++t) {
    set_grad(a, grads_for_step(t));
    set_grad(b, grads_for_step(t));
    original.step(5e-3);
    resumed.step(5e-3);
  }
  EXPECT_EQ(a->value.to_double_vector(), b->value.to_double_vector());
  EXPECT_EQ(original.first_moments()[0].to_double_vector(), resumed.first_moments()[0].to_double_vector());
  EXPECT_EQ(original.second_moments()[0].to_double_vector(), resumed.second_moments()[0].to_double_vector());
  EXPECT_EQ(original.step_count(), resumed.step_count());
}

TEST(AdamW, LoadStateIsShapeChecked) {
  Var p = param_from({1.0, 2.0});
  AdamW opt({{p, true}}, AdamWConfig{});
  Tensor good = Tensor::zeros({2}, DType::F64);
  EXPECT_THROW(opt.load_state({Tensor::zeros({3}, DType::F64)}, {good}, 1), Error);
  EXPECT_THROW(opt.load_state({good}, {Tensor::zeros({2}, DType::F32)}, 1), Error);
  EXPECT_THROW(opt.load_state({good, good}, {good, good}, 1), Error);
  EXPECT_THROW(opt.load_state({good}, {Tensor()}, 1), Error);
  EXPECT_THROW(opt.load_state({good}, {good}, -1), Error);
  EXPECT_NO_THROW(opt.load_state({good}, {good}, 7));
  EXPECT_EQ(opt.step_count(), 7);
}

TEST(ClipGradNorm, ReturnsGlobalNormAndScalesOnlyAboveMax) {
  Var a = param_from({3.0, 4.0});
  Var b = param_from({12.0}, DType::F32);
  Var no_grad = param_from({100.0});
  std::vector<ParamRef> params = {{a, true}, {b, false}, {no_grad, true}};
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  // sqrt(9 + 16 + 144) = 13
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 0.0), 13.0);  // 0 disables clipping
  EXPECT_EQ(a->grad.to_double_vector(), (std::vector<double>{3.0, 4.0}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 13.5), 13.0);  // below the maximum: untouched
  EXPECT_EQ(b->grad.item(0), 12.0);

  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 6.5), 13.0);  // returns the norm before clipping
  const double factor = 6.5 / (13.0 + 1e-6);
  EXPECT_DOUBLE_EQ(a->grad.item(0), 3.0 * factor);
  EXPECT_DOUBLE_EQ(a->grad.item(1), 4.0 * factor);
  EXPECT_NEAR(b->grad.item(0), 12.0 * factor, 1e-6);
  EXPECT_FALSE(no_grad->grad.defined());
  EXPECT_NEAR(clip_grad_norm(params, 0.0), 6.5, 1e-5);
}

// Clipping folded into the update (what training does): step(lr, clip_factor) on unscaled gradients gives the same
// bits as clip_grad_norm's in-place scaling followed by step(lr), in fp32 and fp64, and leaves the gradients alone;
// so does AdamW::clip_and_step, which makes both calls.
TEST(ClipGradNorm, FoldedIntoTheStepGivesTheSameBitsAsScalingInPlace) {
  constexpr double kMaxNorm = 50.0;  // the gradients' norms fall from ~80 to ~20 over the four steps
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Rng rng(91);
    const Tensor init = testing::random_tensor(rng, {300, 7}, 0.5, dtype);
    Var in_place = make_var(init.clone(), true, "in_place"), folded = make_var(init.clone(), true, "folded");
    Var combined = make_var(init.clone(), true, "combined");  // clip_and_step: the same two calls in one
    AdamW opt_in_place({{in_place, true}}, AdamWConfig{}), opt_folded({{folded, true}}, AdamWConfig{});
    AdamW opt_combined({{combined, true}}, AdamWConfig{});
    int clipped = 0;
    for (int step = 1; step <= 4; ++step) {
      const Tensor grad = testing::random_tensor(rng, {300, 7}, 3.0 / step, dtype);
      grad_buffer(in_place).copy_from(grad);
      grad_buffer(folded).copy_from(grad);
      grad_buffer(combined).copy_from(grad);
      const double norm = clip_grad_norm(opt_in_place.params(), kMaxNorm);
      opt_in_place.step(1e-2);
      const GradNorm gn = grad_norm_and_clip_factor(opt_folded.params(), kMaxNorm);
      EXPECT_EQ(gn.norm, norm);
      EXPECT_EQ(gn.clip_factor == 1.0, norm <= kMaxNorm) << "step " << step << ", norm " << norm;
      clipped += gn.clip_factor < 1.0;
      opt_folded.step(1e-2, gn.clip_factor);
      EXPECT_EQ(opt_combined.clip_and_step(1e-2, kMaxNorm)(), norm);
      EXPECT_EQ(combined->value.to_double_vector(), in_place->value.to_double_vector()) << "step " << step;
      EXPECT_EQ(folded->grad.to_double_vector(), grad.to_double_vector()) << "the gradient must not be written";
      EXPECT_EQ(folded->value.to_double_vector(), in_place->value.to_double_vector()) << "step " << step;
      EXPECT_EQ(opt_folded.second_moments()[0].to_double_vector(), opt_in_place.second_moments()[0].to_double_vector());
    }
    EXPECT_GT(clipped, 0);
    EXPECT_LT(clipped, 4);  // both kinds of step
  }
  Var p = make_var(Tensor::zeros({2}, DType::F32), true);
  grad_buffer(p);
  AdamW opt({{p, true}}, AdamWConfig{});
  EXPECT_THROW(opt.step(1e-2, 0.0), Error);
  EXPECT_THROW(opt.step(1e-2, std::nan("")), Error);
}

// A NaN or inf gradient makes clip_and_step skip the update: weights, moments and the step count stay as they were
// (with and without clipping), and the next finite step continues as if the skipped one had not happened.
TEST(ClipGradNorm, NonFiniteGradientSkipsTheWholeUpdate) {
  for (double max_norm : {1.0, 0.0})
    for (double bad : {std::nan(""), static_cast<double>(INFINITY)}) {
      Var p = param_from({0.5, -1.0, 2.0}, DType::F32), reference = param_from({0.5, -1.0, 2.0}, DType::F32);
      AdamW opt({{p, true}}, AdamWConfig{}), ref_opt({{reference, true}}, AdamWConfig{});
      set_grad(p, {0.1, 0.2, 0.3});
      set_grad(reference, {0.1, 0.2, 0.3});
      opt.clip_and_step(1e-2, max_norm)();
      ref_opt.clip_and_step(1e-2, max_norm)();
      const std::vector<double> weights = p->value.to_double_vector(), m = opt.first_moments()[0].to_double_vector();
      set_grad(p, {0.1, bad, 0.3});
      EXPECT_FALSE(std::isfinite(opt.clip_and_step(1e-2, max_norm)()));
      EXPECT_EQ(p->value.to_double_vector(), weights);
      EXPECT_EQ(opt.first_moments()[0].to_double_vector(), m);
      EXPECT_EQ(opt.step_count(), 1);
      set_grad(p, {-0.2, 0.1, 0.05});
      set_grad(reference, {-0.2, 0.1, 0.05});
      opt.clip_and_step(1e-2, max_norm)();
      ref_opt.clip_and_step(1e-2, max_norm)();
      EXPECT_EQ(p->value.to_double_vector(), reference->value.to_double_vector());
    }
}

// A non-finite guard (the step's loss) skips the update even with finite gradients, and reports a NaN norm.
TEST(ClipGradNorm, NonFiniteGuardSkipsTheUpdate) {
  for (double bad : {std::nan(""), static_cast<double>(INFINITY)}) {
    Var p = param_from({0.5, -1.0, 2.0}, DType::F32);
    AdamW opt({{p, true}}, AdamWConfig{});
    set_grad(p, {0.1, 0.2, 0.3});
    EXPECT_TRUE(std::isfinite(opt.clip_and_step(1e-2, 1.0, nullptr, {Tensor::full({}, 2.5, DType::F32)})()));
    const std::vector<double> weights = p->value.to_double_vector(), m = opt.first_moments()[0].to_double_vector();
    set_grad(p, {0.1, 0.2, 0.3});
    EXPECT_TRUE(std::isnan(opt.clip_and_step(1e-2, 1.0, nullptr, {Tensor::full({}, 1.0, DType::F64),
                                                                    Tensor::full({}, bad, DType::F64)})()));
    EXPECT_EQ(p->value.to_double_vector(), weights);
    EXPECT_EQ(opt.first_moments()[0].to_double_vector(), m);
    EXPECT_EQ(opt.step_count(), 1);
  }
}

TEST(ClipGradNorm, LargeGradientIsDeterministic) {
  // Big enough to take the chunked, threaded path; the same gradient must give the same bits every time.
  const int64_t n = 300000;
  Tensor values = Tensor::empty({n}, DType::F32);
  double expected = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<float>(std::sin(0.001 * static_cast<double>(i)));
    values.set_item(i, x);
    expected += x * x;
  }
  Var p = make_var(Tensor::zeros({n}, DType::F32), true, "big");
  grad_buffer(p).copy_from(values);
  const double first = clip_grad_norm({{p, true}}, 0.0);
  EXPECT_NEAR(first, std::sqrt(expected), 1e-9 * std::sqrt(expected));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(clip_grad_norm({{p, true}}, 0.0), first);
}

// ZeRO-1: two optimisers, each updating one range of the same parameter, do exactly what one optimiser over the
// whole parameter does; their moments are the ranges' (1-D), load_state takes whole moments and keeps the range,
// and clipping measures the ranges and adds the parts through total_over_ranks.
TEST(AdamW, ElementRangesSplitTheUpdateExactly) {
  AdamWConfig config;
  const std::vector<double> init = {0.5, -1.25, 2.0, 0.75, -0.1}, grad = {0.3, -0.02, 0.0, 1.5, -0.7};
  Var whole = param_from(init), split = param_from(init);
  AdamW full({{whole, true}}, config);
  AdamW low({{split, true, 0, 2}}, config), high({{split, true, 2, 3}}, config);
  EXPECT_EQ(low.first_moments()[0].shape(), (Shape{2}));
  EXPECT_EQ(high.second_moments()[0].shape(), (Shape{3}));
  for (int step = 0; step < 3; ++step) {
    set_grad(whole, grad);
    set_grad(split, grad);
    const double norm_full = clip_grad_norm(full.params(), 0.5);
    // Each part measures its own range; total_over_ranks sees the part and returns the sum of both.
    const double low_part = std::pow(0.3, 2) + std::pow(-0.02, 2);
    const double high_part = std::pow(1.5, 2) + std::pow(-0.7, 2);
    double seen_low = -1, seen_high = -1;
    const double norm_low = clip_grad_norm(low.params(), 0.5, [&](double part) { return (seen_low = part) + high_part; });
    const double norm_high =
        clip_grad_norm(high.params(), 0.5, [&](double part) { return low_part + (seen_high = part); });
    EXPECT_NEAR(seen_low, low_part, 1e-15);
    EXPECT_NEAR(seen_high, high_part, 1e-15);
    EXPECT_NEAR(norm_low, norm_full, 1e-12);
    EXPECT_NEAR(norm_high, norm_full, 1e-12);
    full.step(1e-2);
    low.step(1e-2);
    high.step(1e-2);
  }
  for (int64_t i = 0; i < 5; ++i) EXPECT_NEAR(split->value.item(i), whole->value.item(i), 1e-12) << i;  // the norms differ in the last bit
  // Whole-parameter moments in, the range kept.
  Tensor m = Tensor::from_vector<double>({1, 2, 3, 4, 5}, {5}), v = Tensor::from_vector<double>({6, 7, 8, 9, 10}, {5});
  high.load_state({m}, {v}, 3);
  EXPECT_EQ(high.first_moments()[0].to_double_vector(), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(high.second_moments()[0].to_double_vector(), (std::vector<double>{8, 9, 10}));
  EXPECT_THROW(AdamW({{param_from(init), true, 3, 3}}, config), Error);  // past the end
}

TEST(MakeParamGroups, AssignsDecayByGroup) {
  std::vector<std::pair<ParamSpec, Var>> named;
  const std::vector<std::pair<ParamGroup, bool>> groups = {
      {ParamGroup::Embedding, false}, {ParamGroup::LowerBound, false}, {ParamGroup::Norm, false},
      {ParamGroup::Mixer, true},      {ParamGroup::MixerVector, false}, {ParamGroup::Mlp, true},
      {ParamGroup::LmHead, true}};
  for (const auto& [group, decays] : groups)
    named.push_back({ParamSpec{param_group_name(group), {2}, group, ParamInit::Zeros},
                     make_var(Tensor::zeros({2}, DType::F32), true, param_group_name(group))});

  const std::vector<ParamRef> without = make_param_groups(named, false);
  const std::vector<ParamRef> with = make_param_groups(named, true);
  ASSERT_EQ(without.size(), groups.size());
  ASSERT_EQ(with.size(), groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    EXPECT_EQ(without[i].param, named[i].second) << "order and identity are kept";
    EXPECT_EQ(without[i].decay, groups[i].second) << param_group_name(groups[i].first);
    const bool expected_with = groups[i].first == ParamGroup::Embedding ? true : groups[i].second;
    EXPECT_EQ(with[i].decay, expected_with) << param_group_name(groups[i].first);
  }
}

}  // namespace
}  // namespace hgrn
