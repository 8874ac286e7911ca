// test_hgrn2_gates.cpp: the HGRN2 gates (lower bound γ, log forget gate g, input gate k) against independent
// double-precision formulas, their stability at extreme inputs, fp64 finite differences (alone and chained the way
// the model chains them), layer 0's absence from γ's gradient, deterministic reductions, and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include <omp.h>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/hgrn2_gates.h"

namespace hgrn {
namespace {

// γ = cumsum(softmax(Γ, axis 0)) − P_0, literally as the spec writes it, in double.
std::vector<double> reference_lower_bound(const Tensor& lower_bounds) {
  const int64_t layers = lower_bounds.size(0), width = lower_bounds.size(1);
  std::vector<double> gamma(static_cast<size_t>(layers * width));
  for (int64_t d = 0; d < width; ++d) {
    double total = 0;
    for (int64_t l = 0; l < layers; ++l) total += std::exp(lower_bounds.item(l * width + d));
    const double p0 = std::exp(lower_bounds.item(d)) / total;
    double cumulative = 0;
    for (int64_t l = 0; l < layers; ++l) {
      cumulative += std::exp(lower_bounds.item(l * width + d)) / total;
      gamma[static_cast<size_t>(l * width + d)] = cumulative - p0;
    }
  }
  return gamma;
}

double reference_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

Tensor gamma_rows(const std::vector<double>& values, int64_t layers) {
  return Tensor::from_vector<double>(values, {layers, static_cast<int64_t>(values.size()) / layers});
}

// ---- lower_bound_transform ------------------------------------------------------------------------------------

TEST(LowerBound, ZeroParametersGiveLayerFractions) {
  for (DType dtype : {DType::F64, DType::F32}) {
    const int64_t layers = 6, width = 3;
    Tape tape;
    Var gamma = lower_bound_transform(tape, make_var(Tensor::zeros({layers, width}, dtype)));
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t d = 0; d < width; ++d)  // sums of equal P are exact; one rounding in the division
        EXPECT_NEAR(gamma->value.item(l * width + d), static_cast<double>(l) / layers, dtype == DType::F64 ? 1e-16 : 1e-7)
            << dtype_name(dtype) << " layer " << l;
  }
}

TEST(LowerBound, ForwardMatchesSpecFormula) {
  Rng rng(51);
  Tensor lower_bounds = testing::random_tensor(rng, {5, 7}, 2.0);
  Tape tape;
  Var gamma = lower_bound_transform(tape, make_var(lower_bounds));
  const std::vector<double> ref = reference_lower_bound(lower_bounds);
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(gamma->value.item(static_cast<int64_t>(i)), ref[i], 1e-15) << i;  // both sum ≤ 5 terms ≤ 1
}

TEST(LowerBound, MonotoneStartsAtZeroAndStaysBelowOne) {
  Rng rng(52);
  for (DType dtype : {DType::F64, DType::F32}) {
    const int64_t layers = 12, width = 9;
    // Spreads of Γ up to ~±8 keep P_0 far above the dtype's epsilon, so 1 − P_0 < 1 is representable.
    Tensor lower_bounds = testing::random_tensor(rng, {layers, width}, 2.0, dtype);
    lower_bounds.set_item(0, 12.0);  // channel 0: P_0 ≈ 1, every γ tiny
    Tape tape;
    Var gamma = lower_bound_transform(tape, make_var(lower_bounds));
    for (int64_t d = 0; d < width; ++d) {
      EXPECT_EQ(gamma->value.item(d), 0.0) << d;
      for (int64_t l = 1; l < layers; ++l) {
        EXPECT_GE(gamma->value.item(l * width + d), gamma->value.item((l - 1) * width + d)) << l << ", " << d;
        EXPECT_LT(gamma->value.item(l * width + d), 1.0) << l << ", " << d;
      }
    }
  }
}

// When P_0 is below the dtype's resolution at 1, 1 − P_0 rounds to 1; γ must still never exceed 1 or go negative
// (the gate accepts only [0, 1]), and it stays monotone.
TEST(LowerBound, ExtremeParametersStayInUnitInterval) {
  Rng rng(62);
  for (DType dtype : {DType::F64, DType::F32}) {
    const int64_t layers = 12, width = 9;
    Tensor lower_bounds = testing::random_tensor(rng, {layers, width}, 20.0, dtype);
    lower_bounds.set_item(0, -60.0);  // channel 0: P_0 ≈ e^−60 or smaller
    Tape tape;
    Var gamma = lower_bound_transform(tape, make_var(lower_bounds));
    const std::vector<double> ref = reference_lower_bound(lower_bounds);
    for (int64_t d = 0; d < width; ++d) {
      EXPECT_EQ(gamma->value.item(d), 0.0) << d;
      for (int64_t l = 1; l < layers; ++l) {
        const double value = gamma->value.item(l * width + d);
        EXPECT_GE(value, gamma->value.item((l - 1) * width + d)) << l << ", " << d;
        EXPECT_LE(value, 1.0) << l << ", " << d;
        // fp32: the softmax of a spread of ~100 in fp32 arithmetic, a few float ulps
        EXPECT_NEAR(value, ref[static_cast<size_t>(l * width + d)], dtype == DType::F64 ? 1e-15 : 1e-6) << l << ", " << d;
      }
    }
  }
}

TEST(LowerBound, GradientsMatchFiniteDifferences) {
  Rng rng(53);
  Var lower_bounds = make_var(testing::random_tensor(rng, {4, 5}), true, "lower_bounds");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return lower_bound_transform(t, in[0]); }, {lower_bounds});
}

TEST(LowerBound, RejectsBadShape) {
  Tape tape;
  EXPECT_THROW(lower_bound_transform(tape, make_var(Tensor::zeros({4}, DType::F32))), Error);
  EXPECT_THROW(lower_bound_transform(tape, make_var(Tensor::zeros({0, 4}, DType::F32))), Error);
}

// ---- hgrn2_forget_gate ----------------------------------------------------------------------------------------

TEST(ForgetGate, UnboundedIsLogSigmoid) {
  const std::vector<double> f = {-8, -1, 0, 0.5, 3, 12};
  Tensor gamma = gamma_rows({0, 0, 0, 0, 0, 0, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3}, 2);
  Tape tape;
  Var no_gamma = hgrn2_forget_gate(tape, make_var(Tensor::from_vector<double>(f, {6})), nullptr, 3);
  Var layer0 = hgrn2_forget_gate(tape, make_var(Tensor::from_vector<double>(f, {6})), make_var(gamma), 0);
  for (int64_t i = 0; i < 6; ++i) {
    const double ref = std::log(reference_sigmoid(f[static_cast<size_t>(i)]));
    EXPECT_NEAR(no_gamma->value.item(i), ref, 1e-15 * std::max(1.0, std::abs(ref))) << i;  // a few ulps
    EXPECT_EQ(layer0->value.item(i), no_gamma->value.item(i)) << i;
  }
}

TEST(ForgetGate, BoundedMatchesDirectFormula) {
  Rng rng(54);
  const int64_t width = 5;
  Tensor f_hat = testing::random_tensor(rng, {3, width}, 3.0);
  Tensor gamma = gamma_rows({0, 0, 0, 0, 0, 0.1, 0.5, 0.9, 0.01, 0.7, 0.2, 0.2, 0.2, 0.2, 0.2}, 3);
  Tape tape;
  Var g = hgrn2_forget_gate(tape, make_var(f_hat), make_var(gamma), 1);
  ASSERT_EQ(g->value.shape(), f_hat.shape());
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < width; ++c) {
      const double gm = gamma.item(width + c);
      const double ref = std::log(gm + (1 - gm) * reference_sigmoid(f_hat.item(r * width + c)));
      // moderate inputs, where the direct formula is itself accurate to a few ulps
      EXPECT_NEAR(g->value.item(r * width + c), ref, 1e-14 * std::max(1.0, std::abs(ref))) << r << ", " << c;
    }
}

TEST(ForgetGate, StableAtExtremeInputs) {
  const std::vector<double> f_values = {-100, -30, 0, 30, 100};
  const std::vector<double> gamma_values = {0, 1e-8, 0.5, 0.999999, 1};  // 1: γ rounded up from 1 − P_0
  for (DType dtype : {DType::F64, DType::F32}) {
    for (double gm : gamma_values) {
      Tensor gamma = Tensor::full({2, 5}, gm, dtype);
      Tensor f_hat = Tensor::from_vector<double>(f_values, {5}).to(dtype);
      Tape tape;
      Var fv = make_var(f_hat, true, "f_hat"), gv = make_var(gamma, true, "gamma");
      Var g = hgrn2_forget_gate(tape, fv, gv, 1);
      Var unbounded = hgrn2_forget_gate(tape, make_var(f_hat), nullptr, 0);
      tape.backward(g);
      // The bound as the dtype holds and evaluates it: g is rounded in that dtype too.
      const double log_gamma = dtype == DType::F64 ? std::log(gamma.item(0))
                                                   : static_cast<double>(std::log(static_cast<float>(gamma.item(0))));
      for (int64_t i = 0; i < 5; ++i) {
        const double gi = g->value.item(i);
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " gamma " << gm << " f_hat " << f_values[i]);
        EXPECT_TRUE(std::isfinite(gi));
        EXPECT_LE(gi, 0.0);
        EXPECT_GE(gi, log_gamma);
        if (gm == 0) {
          EXPECT_EQ(gi, unbounded->value.item(i));  // exactly logsigmoid, not log(0 + …)
        }
        EXPECT_TRUE(std::isfinite(fv->grad.item(i)));
        EXPECT_GE(fv->grad.item(i), 0.0);  // g is increasing in f̂
        // ∂g/∂γ = (1 − σ)/λ ≤ 1/σ(f̂): finite in fp64 everywhere here; in fp32, e^100 overflows when γ = 0.
        if (dtype == DType::F64 || gm > 0) {
          EXPECT_TRUE(std::isfinite(gv->grad.item(i)));
        }
      }
    }
  }
  // Deep in the bounded regime the gate is the bound itself, not a log of a rounded sum.
  Tape tape;
  Var g = hgrn2_forget_gate(tape, make_var(Tensor::from_vector<double>({-100}, {1, 1})),
                            make_var(Tensor::from_vector<double>({0, 1e-8}, {2, 1})), 1);
  EXPECT_NEAR(g->value.item(), std::log(1e-8), 1e-12);  // + log1p(e^−100·(1 − 1e-8)/1e-8) ≈ 3.7e-36
}

// With σ(f̂) rounded to 0 the gate is log γ in exact arithmetic; the rounded log1p(−(1 − γ)) used for λ > 1/2 can land
// one ulp below the rounded log γ for many γ, and the bound must hold anyway (sweep of 20000 bounds in [0.5, 1)).
TEST(ForgetGate, NeverBelowTheBound) {
  const int64_t width = 20000;
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor gamma = Tensor::empty({2, width}, dtype);
    for (int64_t c = 0; c < width; ++c) gamma.set_item(width + c, 0.5 + 0.5 * static_cast<double>(c) / width);
    Tape tape;
    Var g = hgrn2_forget_gate(tape, make_var(Tensor::full({1, width}, -100.0, dtype)), make_var(gamma), 1);
    for (int64_t c = 0; c < width; ++c) {
      const double bound = dtype == DType::F64 ? std::log(gamma.item(width + c))
                                               : static_cast<double>(std::log(static_cast<float>(gamma.item(width + c))));
      ASSERT_GE(g->value.item(c), bound) << dtype_name(dtype) << " gamma " << gamma.item(width + c);
    }
  }
}

// g to fp64 relative precision in every regime, against long double: λ small (γ tiny, f̂ very negative), λ ≈ 1/2,
// and λ → 1 (γ close to 1 or f̂ large), where g ≈ −(1 − γ)·σ(−f̂) is tiny and a plain logaddexp cancels.
TEST(ForgetGate, BoundedKeepsRelativePrecisionInEveryRegime) {
  const std::vector<double> f_values = {-40, -10, -1, 0, 1, 10, 40};
  const std::vector<double> gamma_values = {1e-6, 0.1, 0.5, 0.9, 0.999999};
  const int64_t width = static_cast<int64_t>(f_values.size());
  for (double gm : gamma_values) {
    Tape tape;
    Var g = hgrn2_forget_gate(tape, make_var(Tensor::from_vector<double>(f_values, {width})),
                              make_var(Tensor::full({2, width}, gm, DType::F64)), 1);
    for (int64_t i = 0; i < width; ++i) {
      const long double f = f_values[static_cast<size_t>(i)], gl = gm;
      const long double sig = 1 / (1 + std::exp(-f)), sig_neg = 1 / (1 + std::exp(f));
      const long double lambda = gl + (1 - gl) * sig;
      // two cancellation-free references: log λ for small λ, log1p(−(1 − γ)σ(−f̂)) for λ near 1
      const double ref = static_cast<double>(lambda < 0.5L ? std::log(lambda) : std::log1p(-(1 - gl) * sig_neg));
      // 1e-14 relative: a few fp64 ulps through exp/log1p; a cancelling form misses by orders of magnitude
      EXPECT_NEAR(g->value.item(i), ref, 1e-14 * std::abs(ref)) << "gamma " << gm << " f_hat " << f_values[i];
    }
  }
}

// k = 1 − exp(g) = (1 − γ)·σ(−f̂): small and accurate for γ close to 1, in fp32 too.
TEST(InputGate, AccurateThroughBoundedGateNearOne) {
  const std::vector<double> f_values = {-5, 0, 5, 30};
  for (DType dtype : {DType::F64, DType::F32}) {
    Tensor gamma = Tensor::full({2, 4}, 0.999999, dtype);
    Tape tape;
    Var k = input_gate_from_forget(
        tape, hgrn2_forget_gate(tape, make_var(Tensor::from_vector<double>(f_values, {4}).to(dtype)), make_var(gamma), 1));
    for (int64_t i = 0; i < 4; ++i) {
      const double ref = (1 - gamma.item(i)) / (1 + std::exp(f_values[static_cast<size_t>(i)]));
      // relative: a few ulps of the dtype (fp32 ~6e-8 each); k ranges from 1e-6 down to 1e-19 here
      EXPECT_NEAR(k->value.item(i), ref, (dtype == DType::F64 ? 1e-14 : 1e-6) * ref)
          << dtype_name(dtype) << " f_hat " << f_values[i];
    }
  }
}

TEST(ForgetGate, GradientsMatchFiniteDifferencesBounded) {
  Rng rng(55);
  Var f_hat = make_var(testing::random_tensor(rng, {2, 3, 4}, 3.0), true, "f_hat");
  Tensor gamma_values = Tensor::empty({3, 4}, DType::F64);
  for (int64_t i = 0; i < 12; ++i) gamma_values.set_item(i, 0.05 + 0.9 * rng.uniform());
  Var gamma = make_var(gamma_values, true, "gamma");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return hgrn2_forget_gate(t, in[0], in[1], 2); }, {f_hat, gamma});
  // Only row 2 of gamma was used.
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(gamma->grad.item(i), 0.0) << i;
}

TEST(ForgetGate, GradientsMatchFiniteDifferencesUnbounded) {
  Rng rng(56);
  Var f_hat = make_var(testing::random_tensor(rng, {3, 5}, 3.0), true, "f_hat");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) { return hgrn2_forget_gate(t, in[0], nullptr, 0); }, {f_hat});
}

TEST(ForgetGate, LayerZeroGivesGammaNoGradient) {
  Rng rng(57);
  Var f_hat = make_var(testing::random_tensor(rng, {4, 3}), true, "f_hat");
  Var gamma = make_var(Tensor::full({3, 3}, 0.4, DType::F64), true, "gamma");
  Tape tape;
  tape.backward(hgrn2_forget_gate(tape, f_hat, gamma, 0), testing::random_tensor(rng, {4, 3}));
  ASSERT_TRUE(f_hat->grad.defined());
  if (gamma->grad.defined()) {
    for (double v : gamma->grad.to_double_vector()) EXPECT_EQ(v, 0.0);
  }

  // Through the transform as well: Γ gets nothing from a layer-0 gate.
  Var lower_bounds = make_var(testing::random_tensor(rng, {3, 3}), true, "lower_bounds");
  Tape tape2;
  Var g = hgrn2_forget_gate(tape2, f_hat, lower_bound_transform(tape2, lower_bounds), 0);
  tape2.backward(g, testing::random_tensor(rng, {4, 3}));
  if (lower_bounds->grad.defined()) {
    for (double v : lower_bounds->grad.to_double_vector()) EXPECT_EQ(v, 0.0);
  }
}

// The model's chain: Γ → γ → gates of layers 0, 1, 2 (each using its own row), summed; layer 0's row of γ is 0.
TEST(ForgetGate, ChainedThroughLowerBoundMatchesFiniteDifferences) {
  Rng rng(58);
  Var lower_bounds = make_var(testing::random_tensor(rng, {3, 4}), true, "lower_bounds");
  std::vector<Var> inputs = {lower_bounds};
  for (int l = 0; l < 3; ++l)
    inputs.push_back(make_var(testing::random_tensor(rng, {2, 2, 4}, 2.0), true, "f_hat" + std::to_string(l)));
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) {
        Var gamma = lower_bound_transform(t, in[0]);
        Var sum = hgrn2_forget_gate(t, in[1], gamma, 0);
        for (int l = 1; l < 3; ++l) sum = add(t, sum, hgrn2_forget_gate(t, in[1 + l], gamma, l));
        return sum;
      },
      inputs);
}

TEST(ForgetGate, GammaGradientBitsIndependentOfThreadCount) {
  Rng rng(59);
  const int64_t rows = 1000, width = 40;
  Tensor f_hat = testing::random_tensor(rng, {rows, width}, 3.0, DType::F32);
  Tensor dg = testing::random_tensor(rng, {rows, width}, 1.0, DType::F32);
  Tensor gamma = Tensor::full({2, width}, 0.3, DType::F32);
  const int saved_threads = omp_get_max_threads();
  std::vector<double> first;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tape tape;
    Var gv = make_var(gamma, true, "gamma");
    tape.backward(hgrn2_forget_gate(tape, make_var(f_hat, true), gv, 1), dg);
    if (first.empty())
      first = gv->grad.to_double_vector();
    else
      EXPECT_EQ(gv->grad.to_double_vector(), first) << "threads " << threads;
  }
  omp_set_num_threads(saved_threads);
}

TEST(ForgetGate, RejectsBadArguments) {
  Tape tape;
  Var f_hat = make_var(Tensor::zeros({2, 4}, DType::F64));
  Var gamma = make_var(Tensor::full({3, 4}, 0.5, DType::F64));
  EXPECT_THROW(hgrn2_forget_gate(tape, f_hat, make_var(Tensor::full({3, 5}, 0.5, DType::F64)), 1), Error);  // width
  EXPECT_THROW(hgrn2_forget_gate(tape, f_hat, gamma, 3), Error);                                          // layer ≥ L
  EXPECT_THROW(hgrn2_forget_gate(tape, f_hat, gamma, -1), Error);                                         // layer < 0
  EXPECT_THROW(hgrn2_forget_gate(tape, f_hat, make_var(Tensor::full({3, 4}, 0.5, DType::F32)), 1), Error);  // dtype
  EXPECT_THROW(hgrn2_forget_gate(tape, f_hat, make_var(Tensor::full({3, 4}, 1.5, DType::F64)), 1), Error);  // γ > 1
  // NaN passes through (non-finite weights: the trainer meets them as a non-finite step and says so).
  const Var nan_gate = hgrn2_forget_gate(tape, f_hat, make_var(Tensor::full({3, 4}, std::nan(""), DType::F64)), 2);
  EXPECT_TRUE(std::isnan(nan_gate->value.item(0)));
}

// ---- input_gate_from_forget -----------------------------------------------------------------------------------

TEST(InputGate, ForwardIsOneMinusExp) {
  const std::vector<double> g = {-30, -2, -0.5, -1e-3, 0};
  Tape tape;
  Var k = input_gate_from_forget(tape, make_var(Tensor::from_vector<double>(g, {5})));
  for (int64_t i = 0; i < 5; ++i) {
    const double ref = 1 - std::exp(g[static_cast<size_t>(i)]);
    EXPECT_NEAR(k->value.item(i), ref, 1e-15) << i;  // 1 − exp is accurate to ~1e-16 absolute for these g
  }
}

TEST(InputGate, KeepsRelativePrecisionNearZero) {
  // 1 − exp(−1e-10) in fp32 would be 0; −expm1 keeps k ≈ 1e-10 to fp32 relative precision.
  Tape tape;
  Var k = input_gate_from_forget(tape, make_var(Tensor::from_vector<float>({-1e-10f, -1e-30f}, {2})));
  EXPECT_NEAR(k->value.item(0), 1e-10, 1e-10 * 1e-6);
  EXPECT_NEAR(k->value.item(1), 1e-30, 1e-30 * 1e-6);
}

TEST(InputGate, GradientsMatchFiniteDifferences) {
  Rng rng(60);
  Var g = make_var(testing::random_tensor(rng, {3, 4}), true, "g");
  testing::expect_gradients_match([](Tape& t, const std::vector<Var>& in) { return input_gate_from_forget(t, in[0]); },
                                  {g});
}

// g → k chained to f̂ and γ, as in the mixer.
TEST(InputGate, ChainedWithForgetGateMatchesFiniteDifferences) {
  Rng rng(61);
  Var f_hat = make_var(testing::random_tensor(rng, {3, 4}, 2.0), true, "f_hat");
  Var gamma = make_var(Tensor::full({2, 4}, 0.25, DType::F64), true, "gamma");
  testing::expect_gradients_match(
      [](Tape& t, const std::vector<Var>& in) {
        return input_gate_from_forget(t, hgrn2_forget_gate(t, in[0], in[1], 1));
      },
      {f_hat, gamma});
}

// ---- hgrn2_gates: a layer's q, g, k in one op ------------------------------------------------------------------------

// All three outputs with their own cotangents, bounded and layer 0; q̂ and f̂ the same tensor too (gradients add).
TEST(Hgrn2Gates, GradientsMatchFiniteDifferences) {
  Rng rng(62);
  for (int64_t layer : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "layer " << layer);
    Var q_hat = make_var(testing::random_tensor(rng, {2, 3, 4}, 3.0), true, "q_hat");
    Var f_hat = make_var(testing::random_tensor(rng, {2, 3, 4}, 3.0), true, "f_hat");
    Tensor gamma_values = Tensor::empty({3, 4}, DType::F64);
    for (int64_t i = 0; i < 12; ++i) gamma_values.set_item(i, 0.05 + 0.9 * rng.uniform());
    Var gamma = make_var(gamma_values, true, "gamma");
    testing::expect_gradients_match_outputs(
        [layer](Tape& t, const std::vector<Var>& in) {
          const Hgrn2Gates r = hgrn2_gates(t, in[0], in[1], in[2], layer);
          return std::vector<Var>{r.q, r.g, r.k};
        },
        {q_hat, f_hat, gamma});
  }
  Var x = make_var(testing::random_tensor(rng, {3, 5}, 2.0), true, "x");
  testing::expect_gradients_match_outputs(
      [](Tape& t, const std::vector<Var>& in) {
        const Hgrn2Gates r = hgrn2_gates(t, in[0], in[0], nullptr, 0);
        return std::vector<Var>{r.q, r.g, r.k};
      },
      {x});
}

TEST(Hgrn2Gates, ForwardIsSiluForgetGateAndInputGate) {
  Rng rng(63);
  Var q_hat = make_var(testing::random_tensor(rng, {5, 6}, 3.0));
  Var f_hat = make_var(testing::random_tensor(rng, {5, 6}, 3.0));
  Var gamma = make_var(Tensor::full({2, 6}, 0.3, DType::F64));
  Tape tape;
  const Hgrn2Gates r = hgrn2_gates(tape, q_hat, f_hat, gamma, 1);
  for (int64_t i = 0; i < 30; ++i) {
    const double q = q_hat->value.item(i), f = f_hat->value.item(i);
    const double lambda = 0.3 + 0.7 / (1 + std::exp(-f));
    EXPECT_NEAR(r.q->value.item(i), q / (1 + std::exp(-q)), 1e-15) << i;
    EXPECT_NEAR(r.g->value.item(i), std::log(lambda), 1e-15) << i;
    EXPECT_NEAR(r.k->value.item(i), 1 - lambda, 1e-15) << i;
  }
}

TEST(Hgrn2Gates, RejectsBadArguments) {
  Tape tape;
  Var f_hat = make_var(Tensor::zeros({2, 4}, DType::F64));
  Var gamma = make_var(Tensor::full({3, 4}, 0.5, DType::F64));
  EXPECT_THROW(hgrn2_gates(tape, nullptr, f_hat, gamma, 1), Error);
  EXPECT_THROW(hgrn2_gates(tape, make_var(Tensor::zeros({2, 5}, DType::F64)), f_hat, gamma, 1), Error);  // shape
  EXPECT_THROW(hgrn2_gates(tape, make_var(Tensor::zeros({2, 4}, DType::F32)), f_hat, gamma, 1), Error);  // dtype
  EXPECT_THROW(hgrn2_gates(tape, f_hat, f_hat, gamma, 3), Error);                                        // layer ≥ L
  EXPECT_THROW(hgrn2_gates(tape, f_hat, f_hat, make_var(Tensor::full({3, 4}, 1.5, DType::F64)), 1), Error);  // γ > 1
}

}  // namespace
}  // namespace hgrn
