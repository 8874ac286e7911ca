// test_complex_gated_scan.cpp: the complex gated linear recurrence h_t = e^{g_t} e^{iθ} h_{t−1} + x_t (sequential and
// chunk forms) on the CPU: against a std::complex reference, chunk vs sequential over sequence lengths around the
// chunk with and without an initial state in fp64 and fp32, chunk-size invariance, fp64 finite-difference gradients
// of every input (θ included) for both forms and both outputs, thread-count independence, row-strided inputs and
// argument checks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <complex>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "ops/complex_gated_scan.h"
#include "ops/elementwise.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::random_tensor;

struct Sizes {
  int64_t batch, time, channels;
};

// fp64 inputs of one problem; h0 undefined means "no initial state".
struct Inputs {
  Tensor x_re, x_im, g, theta, h0;
};

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// g = logsigmoid(u) (moderate decay), θ uniform-ish in (−π, π) so that every rotation matters.
Inputs make_inputs(Rng& rng, const Sizes& s, bool with_initial) {
  Inputs in;
  in.x_re = random_tensor(rng, {s.batch, s.time, s.channels});
  in.x_im = random_tensor(rng, {s.batch, s.time, s.channels});
  in.g = Tensor::empty({s.batch, s.time, s.channels}, DType::F64);
  for (int64_t i = 0; i < in.g.numel(); ++i) in.g.set_item(i, log_sigmoid(1.0 + rng.normal()));
  in.theta = random_tensor(rng, {s.channels}, 1.5);
  if (with_initial) in.h0 = random_tensor(rng, {s.batch, 2, s.channels});
  return in;
}

Tensor rounded(const Tensor& t, DType dtype) { return t.defined() ? t.to(dtype).to(DType::F64) : Tensor(); }
Inputs rounded_to(const Inputs& in, DType dtype) {
  return {rounded(in.x_re, dtype), rounded(in.x_im, dtype), rounded(in.g, dtype), rounded(in.theta, dtype),
          rounded(in.h0, dtype)};
}

struct Result {
  Tensor output, final_state, dx_re, dx_im, dg, dtheta, dh0;
};

// Runs the scan in `dtype` and backpropagates L = <output, d_out> + <final_state, d_final> (either may be undefined).
Result run(const Inputs& in, DType dtype, ScanMode mode, int64_t chunk, const Tensor& d_out, const Tensor& d_final) {
  Tape tape;
  Var xr = make_var(in.x_re.to(dtype), true, "x_re");
  Var xi = make_var(in.x_im.to(dtype), true, "x_im");
  Var g = make_var(in.g.to(dtype), true, "g");
  Var theta = make_var(in.theta.to(dtype), true, "theta");
  Var h0 = in.h0.defined() ? make_var(in.h0.to(dtype), true, "h0") : nullptr;
  ComplexGatedScanOutputs r = complex_gated_scan(tape, xr, xi, g, theta, h0, mode, chunk);
  if (d_out.defined()) {
    if (d_final.defined()) r.final_state->grad = d_final.to(dtype);
    tape.backward(r.output, d_out.to(dtype));
  } else if (d_final.defined()) {
    tape.backward(r.final_state, d_final.to(dtype));
  }
  auto f64 = [](const Var& v) { return v && v->grad.defined() ? v->grad.to(DType::F64) : Tensor(); };
  return {r.output->value.to(DType::F64), r.final_state->value.to(DType::F64), f64(xr), f64(xi), f64(g),
          f64(theta), f64(h0)};
}

double max_rel_error(const Tensor& x, const Tensor& ref) {
  EXPECT_EQ(x.shape(), ref.shape());
  const std::vector<double> a = x.to_double_vector(), b = ref.to_double_vector();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(a[i] - b[i]);
    if (std::isnan(diff)) return diff;
    worst = std::max(worst, diff);
  }
  const double scale = max_abs(ref);
  return scale > 0 ? worst / scale : (worst > 0 ? INFINITY : 0.0);
}

void expect_results_match(const Result& a, const Result& b, double tol, const std::string& context) {
  EXPECT_EQ(a.dh0.defined(), b.dh0.defined()) << context;
  const std::vector<std::pair<const char*, std::pair<const Tensor*, const Tensor*>>> pairs{
      {"output", {&a.output, &b.output}}, {"final_state", {&a.final_state, &b.final_state}},
      {"dx_re", {&a.dx_re, &b.dx_re}},    {"dx_im", {&a.dx_im, &b.dx_im}},
      {"dg", {&a.dg, &b.dg}},             {"dtheta", {&a.dtheta, &b.dtheta}},
      {"dh0", {&a.dh0, &b.dh0}}};
  for (const auto& [name, p] : pairs) {
    if (!p.second->defined() && name == std::string("dh0")) continue;
    ASSERT_TRUE(p.first->defined() && p.second->defined()) << name << " missing, " << context;
    EXPECT_LE(max_rel_error(*p.first, *p.second), tol) << name << ", " << context;
  }
}

TEST(ComplexGatedScan, BothFormsMatchAStdComplexReference) {
  // The recurrence evaluated with std::complex, step by step, for B = 2, T = 70 (a partial second chunk), C = 3.
  const Sizes s{2, 70, 3};
  Rng rng(3);
  const Inputs in = make_inputs(rng, s, true);
  std::vector<double> want_out(static_cast<size_t>(s.batch * s.time * 2 * s.channels));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t c = 0; c < s.channels; ++c) {
      std::complex<double> h(in.h0.item(b * 2 * s.channels + c), in.h0.item(b * 2 * s.channels + s.channels + c));
      const std::complex<double> rot = std::polar(1.0, in.theta.item(c));
      for (int64_t t = 0; t < s.time; ++t) {
        const int64_t i = (b * s.time + t) * s.channels + c;
        h = std::exp(in.g.item(i)) * rot * h + std::complex<double>(in.x_re.item(i), in.x_im.item(i));
        want_out[static_cast<size_t>((b * s.time + t) * 2 * s.channels + c)] = h.real();
        want_out[static_cast<size_t>((b * s.time + t) * 2 * s.channels + s.channels + c)] = h.imag();
      }
    }
  for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
    const Result r = run(in, DType::F64, mode, 0, Tensor(), Tensor());
    const std::vector<double> got = r.output.to_double_vector();
    ASSERT_EQ(got.size(), want_out.size());
    // The same steps in another order of roundings: a few ulps of values of order 1.
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want_out[i], 1e-12) << "element " << i;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t k = 0; k < 2 * s.channels; ++k)
        EXPECT_EQ(r.final_state.item(b * 2 * s.channels + k),
                  r.output.item(((b * s.time) + s.time - 1) * 2 * s.channels + k));
  }
}

TEST(ComplexGatedScan, ZeroAngleIsTwoRealScans) {
  // θ = 0: the real and imaginary parts decouple into two copies of the real recurrence h_t = e^{g_t} h_{t−1} + x_t.
  const Sizes s{1, 5, 2};
  Rng rng(4);
  Inputs in = make_inputs(rng, s, false);
  in.theta = Tensor::zeros({s.channels}, DType::F64);
  const Result r = run(in, DType::F64, ScanMode::Sequential, 0, Tensor(), Tensor());
  for (int64_t c = 0; c < s.channels; ++c) {
    double hr = 0, hi = 0;
    for (int64_t t = 0; t < s.time; ++t) {
      const int64_t i = t * s.channels + c;
      hr = std::exp(in.g.item(i)) * hr + in.x_re.item(i);
      hi = std::exp(in.g.item(i)) * hi + in.x_im.item(i);
      EXPECT_NEAR(r.output.item(t * 2 * s.channels + c), hr, 1e-14);
      EXPECT_NEAR(r.output.item(t * 2 * s.channels + s.channels + c), hi, 1e-14);
    }
  }
}

// fp64: the forms differ only in the order of roundings (e^{ΣG}, cos(nθ) against products of per-step factors).
constexpr double kFp64FormTolerance = 1e-10;
// fp32 against the fp64 reference on the same rounded inputs, relative to the reference's largest entry: fp32
// rounding of each step compounded over at most 200 steps; a structural error is O(1).
constexpr double kFp32Tolerance = 5e-5;

TEST(ComplexGatedScan, ChunkMatchesSequentialInFp64AndFp32) {
  for (int64_t time : {1, 15, 16, 63, 64, 65, 200}) {
    for (bool with_initial : {false, true}) {
      const std::string context = "T=" + std::to_string(time) + " initial=" + std::to_string(with_initial);
      const Sizes s{2, time, 5};
      Rng rng(100 + time + (with_initial ? 1000 : 0));
      const Inputs in = make_inputs(rng, s, with_initial);
      const Tensor d_out = random_tensor(rng, {s.batch, s.time, 2 * s.channels});
      const Tensor d_final = random_tensor(rng, {s.batch, 2, s.channels});
      const Result sequential = run(in, DType::F64, ScanMode::Sequential, 0, d_out, d_final);
      for (int64_t chunk : {0, 16}) {
        const Result chunked = run(in, DType::F64, ScanMode::Chunk, chunk, d_out, d_final);
        expect_results_match(chunked, sequential, kFp64FormTolerance,
                             context + " fp64 chunk=" + std::to_string(chunk));
      }
      const Inputs in32 = rounded_to(in, DType::F32);
      const Tensor d_out32 = rounded(d_out, DType::F32), d_final32 = rounded(d_final, DType::F32);
      const Result reference = run(in32, DType::F64, ScanMode::Sequential, 0, d_out32, d_final32);
      for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
        const Result r32 = run(in32, DType::F32, mode, 0, d_out32, d_final32);
        expect_results_match(r32, reference, kFp32Tolerance,
                             context + (mode == ScanMode::Chunk ? " fp32 chunk" : " fp32 sequential"));
      }
    }
  }
}

TEST(ComplexGatedScan, ChunkSizeDoesNotChangeTheResult) {
  const Sizes s{2, 100, 6};
  Rng rng(11);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, {s.batch, s.time, 2 * s.channels});
  const Tensor d_final = random_tensor(rng, in.h0.shape());
  const Result base = run(in, DType::F64, ScanMode::Sequential, 0, d_out, d_final);
  for (int64_t chunk : {1, 5, 16, 64, 300})
    expect_results_match(run(in, DType::F64, ScanMode::Chunk, chunk, d_out, d_final), base, kFp64FormTolerance,
                         "chunk " + std::to_string(chunk));
}

TEST(ComplexGatedScan, ResultsDoNotDependOnTheThreadCount) {
  // B·T·C = 52000 elements, above the size where the op forks a team: 2 batches x 4 channel blocks (the last partial).
  const Sizes s{2, 130, 200};
  Rng rng(13);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, {s.batch, s.time, 2 * s.channels});
  const Tensor d_final = random_tensor(rng, in.h0.shape());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result one = run(in, DType::F32, ScanMode::Chunk, 0, d_out, d_final);
  omp_set_num_threads(4);
  const Result four = run(in, DType::F32, ScanMode::Chunk, 0, d_out, d_final);
  omp_set_num_threads(saved);
  expect_results_match(four, one, 0.0, "threads");
}

// Every input's gradient, both forms, both outputs seeded, against central differences.
TEST(ComplexGatedScan, GradientsMatchFiniteDifferences) {
  for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk})
    for (bool with_initial : {false, true}) {
      SCOPED_TRACE(std::string(mode == ScanMode::Chunk ? "chunk" : "sequential") +
                   (with_initial ? " with h0" : " without h0"));
      const Sizes s{2, 7, 3};
      Rng rng(21);
      const Inputs in = make_inputs(rng, s, with_initial);
      std::vector<Var> vars{make_var(in.x_re.clone(), true, "x_re"), make_var(in.x_im.clone(), true, "x_im"),
                            make_var(in.g.clone(), true, "g"), make_var(in.theta.clone(), true, "theta")};
      if (with_initial) vars.push_back(make_var(in.h0.clone(), true, "h0"));
      testing::expect_gradients_match_outputs(
          [&](Tape& tape, const std::vector<Var>& v) {
            // Chunks of 3 over 7 steps: two whole chunks and a partial one.
            const ComplexGatedScanOutputs r =
                complex_gated_scan(tape, v[0], v[1], v[2], v[3], v.size() > 4 ? v[4] : nullptr, mode, 3);
            return std::vector<Var>{r.output, r.final_state};
          },
          vars, 5, 1e-6, 1e-7);
    }
}

TEST(ComplexGatedScan, OnlyTheFinalStateOrOnlyTheOutputMayCarryAGradient) {
  const Sizes s{1, 20, 4};
  Rng rng(22);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, {s.batch, s.time, 2 * s.channels});
  const Tensor d_final = random_tensor(rng, in.h0.shape());
  const Tensor zero_out = Tensor::zeros(d_out.shape(), DType::F64), zero_final = Tensor::zeros(d_final.shape(), DType::F64);
  for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
    expect_results_match(run(in, DType::F64, mode, 8, Tensor(), d_final),
                         run(in, DType::F64, mode, 8, zero_out, d_final), 0.0, "final only");
    expect_results_match(run(in, DType::F64, mode, 8, d_out, Tensor()),
                         run(in, DType::F64, mode, 8, d_out, zero_final), 0.0, "output only");
  }
}

TEST(ComplexGatedScan, ReadsColumnBlocksOfAFusedProjection) {
  // x_re, x_im and g as column blocks of one [B, T, 3C] tensor (row-strided): the same values and gradients as
  // contiguous inputs.
  const Sizes s{2, 9, 4};
  Rng rng(23);
  const Inputs in = make_inputs(rng, s, false);
  const Tensor d_out = random_tensor(rng, {s.batch, s.time, 2 * s.channels});
  const Result want = run(in, DType::F64, ScanMode::Chunk, 4, d_out, Tensor());
  Tensor whole = Tensor::empty({s.batch, s.time, 3 * s.channels}, DType::F64);
  for (int64_t r = 0; r < s.batch * s.time; ++r)
    for (int64_t c = 0; c < s.channels; ++c) {
      whole.set_item(r * 3 * s.channels + c, in.x_re.item(r * s.channels + c));
      whole.set_item(r * 3 * s.channels + s.channels + c, in.x_im.item(r * s.channels + c));
      whole.set_item(r * 3 * s.channels + 2 * s.channels + c, in.g.item(r * s.channels + c));
    }
  Tape tape;
  Var w = make_var(whole, true, "whole");
  Var theta = make_var(in.theta.clone(), true, "theta");
  const std::vector<Var> blocks = split_columns(tape, w, {s.channels, s.channels, s.channels});
  const ComplexGatedScanOutputs r =
      complex_gated_scan(tape, blocks[0], blocks[1], blocks[2], theta, nullptr, ScanMode::Chunk, 4);
  tape.backward(r.output, d_out);
  EXPECT_LE(max_rel_error(r.output->value, want.output), 0.0);
  EXPECT_LE(max_rel_error(theta->grad, want.dtheta), 0.0);
  for (int64_t row = 0; row < s.batch * s.time; ++row)
    for (int64_t c = 0; c < s.channels; ++c) {
      EXPECT_EQ(w->grad.item(row * 3 * s.channels + c), want.dx_re.item(row * s.channels + c));
      EXPECT_EQ(w->grad.item(row * 3 * s.channels + s.channels + c), want.dx_im.item(row * s.channels + c));
      EXPECT_EQ(w->grad.item(row * 3 * s.channels + 2 * s.channels + c), want.dg.item(row * s.channels + c));
    }
}

TEST(ComplexGatedScan, RefusesMismatchedArguments) {
  Tape tape;
  const auto v = [](const Shape& shape, DType dtype = DType::F64) { return make_var(Tensor::zeros(shape, dtype)); };
  const Var x = v({1, 4, 3}), theta = v({3});
  EXPECT_NO_THROW(complex_gated_scan(tape, x, x, x, theta, nullptr));
  EXPECT_THROW(complex_gated_scan(tape, x, v({1, 4, 2}), x, theta, nullptr), Error);       // x_im shape
  EXPECT_THROW(complex_gated_scan(tape, x, x, v({1, 3, 3}), theta, nullptr), Error);       // g shape
  EXPECT_THROW(complex_gated_scan(tape, x, x, x, v({4}), nullptr), Error);                 // theta width
  EXPECT_THROW(complex_gated_scan(tape, x, x, x, theta, v({1, 3})), Error);                // state [B, 2, C]
  EXPECT_THROW(complex_gated_scan(tape, x, x, x, v({3}, DType::F32), nullptr), Error);     // mixed dtypes
  EXPECT_THROW(complex_gated_scan(tape, x, x, x, theta, nullptr, ScanMode::Chunk, -1), Error);
  EXPECT_THROW(complex_gated_scan(tape, v({4, 3}), v({4, 3}), v({4, 3}), theta, nullptr), Error);  // not 3-D
}

}  // namespace
}  // namespace hgrn
