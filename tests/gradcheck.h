// gradcheck.h: fp64 central finite-difference gradient checks for any op or model built on the tape.
// The check seeds the output with a random cotangent R, so it tests the full vector-Jacobian product:
// analytic dL/dx (from the op's hand-written backward) against (L(x+h) - L(x-h)) / 2h with L = <f(x), R>.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "core/random_fill.h"
#include "core/rng.h"

namespace hgrn::testing {

// A fp64 tensor of standard normal values (scaled), drawn from rng: in parallel, with the sequential draws' values
// (fill_normal), since the GPU tests draw inputs of tens of millions of elements.
inline Tensor random_tensor(Rng& rng, const Shape& shape, double scale = 1.0, DType dtype = DType::F64) {
  Tensor t = Tensor::empty(shape, DType::F64);
  fill_normal(t, scale, rng);
  return dtype == DType::F64 ? t : t.to(dtype);
}

// The largest |element| of t (any device, dtype or layout): the scale of a tolerance on the largest error relative
// to the reference's largest entry.
inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_double_vector()) m = std::max(m, std::fabs(x));
  return m;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.item(i) * b.item(i);
  return s;
}

using Builder = std::function<Var(Tape&, const std::vector<Var>&)>;
// For ops with several outputs (the recurrence: output and final state): L = sum_k <f_k(x), R_k>.
using MultiBuilder = std::function<std::vector<Var>(Tape&, const std::vector<Var>&)>;

// Checks every element of every input that requires a gradient (inputs must be fp64). `tol` bounds
// |analytic - numeric| / max(1, |numeric|).  Returns the worst error seen, for tests that want to print it.
inline double expect_gradients_match_outputs(const MultiBuilder& build, const std::vector<Var>& inputs,
                                             uint64_t seed = 1234, double h = 1e-6, double tol = 1e-6) {
  Rng rng(seed);
  Tape tape;
  for (const Var& v : inputs) v->grad = Tensor();
  std::vector<Var> outs = build(tape, inputs);
  std::vector<Tensor> cotangents;
  for (const Var& out : outs) cotangents.push_back(random_tensor(rng, out->value.shape()));
  // Every output but the first is seeded directly; backward() seeds the first and runs the tape.
  for (size_t k = 1; k < outs.size(); ++k) outs[k]->grad = cotangents[k].clone();
  tape.backward(outs[0], cotangents[0]);

  Tape no_grad;
  no_grad.set_enabled(false);
  auto loss = [&] {
    std::vector<Var> ys = build(no_grad, inputs);
    double l = 0;
    for (size_t k = 0; k < ys.size(); ++k) l += dot(ys[k]->value, cotangents[k]);
    return l;
  };
  double worst = 0;
  for (const Var& v : inputs) {
    if (!v->requires_grad) continue;
    EXPECT_EQ(v->value.dtype(), DType::F64) << "gradcheck inputs must be fp64: " << v->name;
    for (int64_t i = 0; i < v->value.numel(); ++i) {
      const double x0 = v->value.item(i);
      v->value.set_item(i, x0 + h);
      const double lp = loss();
      v->value.set_item(i, x0 - h);
      const double lm = loss();
      v->value.set_item(i, x0);
      const double numeric = (lp - lm) / (2 * h);
      const double analytic = v->grad.defined() ? v->grad.item(i) : 0.0;
      const double err = std::abs(analytic - numeric) / std::max(1.0, std::abs(numeric));
      worst = std::max(worst, err);
      EXPECT_LE(err, tol) << "gradient of '" << v->name << "' element " << i << ": analytic " << analytic
                          << ", numeric " << numeric;
      if (err > tol || std::isnan(err)) return worst;  // one report per input is enough
    }
  }
  return worst;
}

inline double expect_gradients_match(const Builder& build, const std::vector<Var>& inputs, uint64_t seed = 1234,
                                     double h = 1e-6, double tol = 1e-6) {
  return expect_gradients_match_outputs(
      [&](Tape& tape, const std::vector<Var>& in) { return std::vector<Var>{build(tape, in)}; }, inputs, seed, h,
      tol);
}

}  // namespace hgrn::testing
