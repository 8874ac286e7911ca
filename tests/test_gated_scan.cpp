// test_gated_scan.cpp: the gated linear recurrence h_t = e^{g_t} h_{t−1} + x_t (sequential and chunk forms) on the
// CPU: hand-computed steps, chunk vs sequential over sequence lengths around the chunk with and without an initial
// state in three gate regimes in fp32 and fp64, chunk-size invariance, fp64 finite-difference gradients of every
// input for both forms and both outputs, thread-count independence, partial gradient requests, accumulation,
// row-strided inputs and argument checks.
#include <gtest/gtest.h>
#include <omp.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/gated_scan.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::random_tensor;

struct Sizes {
  int64_t batch, time, channels;
};

// fp64 inputs of one problem; h0 undefined means "no initial state".
struct Inputs {
  Tensor x, g, h0;
};

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// Gate regimes, u ~ N(0, 1): g = base·(1 + spread·|u|) (never above 0), or logsigmoid(u) for the moderate one.
struct GateRegime {
  const char* name;
  std::function<double(Rng&)> draw;
};
const std::vector<GateRegime> kGateRegimes{
    {"almost_no_decay_minus_1e-4", [](Rng& r) { return -1e-4 * (1.0 + 0.5 * std::abs(r.normal())); }},
    {"moderate_logsigmoid", [](Rng& r) { return log_sigmoid(r.normal()); }},
    {"strong_decay_minus_20", [](Rng& r) { return -20.0 * (1.0 + 0.1 * std::abs(r.normal())); }},
};
void PrintTo(const GateRegime& regime, std::ostream* os) { *os << regime.name; }

Inputs make_inputs(Rng& rng, const Sizes& s, bool with_initial, const GateRegime& regime = kGateRegimes[1]) {
  Inputs in;
  in.x = random_tensor(rng, {s.batch, s.time, s.channels});
  in.g = Tensor::empty({s.batch, s.time, s.channels}, DType::F64);
  for (int64_t i = 0; i < in.g.numel(); ++i) in.g.set_item(i, regime.draw(rng));
  if (with_initial) in.h0 = random_tensor(rng, {s.batch, s.channels});
  return in;
}

// Every value rounded to `dtype` and back, so that an fp64 reference sees exactly what a `dtype` run sees.
Tensor rounded(const Tensor& t, DType dtype) { return t.defined() ? t.to(dtype).to(DType::F64) : Tensor(); }
Inputs rounded_to(const Inputs& in, DType dtype) {
  return {rounded(in.x, dtype), rounded(in.g, dtype), rounded(in.h0, dtype)};
}

// Everything one call produces, in fp64.
struct Result {
  Tensor output, final_state, dx, dg, dh0;
};

// Runs the scan in `dtype` and backpropagates L = <output, d_out> + <final_state, d_final> (either cotangent may be
// undefined, which leaves that output without a gradient).
Result run(const Inputs& in, DType dtype, ScanMode mode, int64_t chunk, const Tensor& d_out, const Tensor& d_final) {
  Tape tape;
  Var x = make_var(in.x.to(dtype), true, "x");
  Var g = make_var(in.g.to(dtype), true, "g");
  Var h0 = in.h0.defined() ? make_var(in.h0.to(dtype), true, "h0") : nullptr;
  GatedScanOutputs r = gated_scan(tape, x, g, h0, mode, chunk);
  if (d_out.defined()) {
    if (d_final.defined()) r.final_state->grad = d_final.to(dtype);
    tape.backward(r.output, d_out.to(dtype));
  } else if (d_final.defined()) {
    tape.backward(r.final_state, d_final.to(dtype));
  }
  auto f64 = [](const Var& v) { return v && v->grad.defined() ? v->grad.to(DType::F64) : Tensor(); };
  return {r.output->value.to(DType::F64), r.final_state->value.to(DType::F64), f64(x), f64(g), f64(h0)};
}

// max|x − ref| / max|ref|: relative to the reference's largest entry, so that it stays a relative measure at every
// scale (dg under strong decay is ~e^{−20}); a reference of all zeros must be matched exactly.
double max_rel_error(const Tensor& x, const Tensor& ref) {
  EXPECT_EQ(x.shape(), ref.shape());
  const std::vector<double> a = x.to_double_vector(), b = ref.to_double_vector();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(a[i] - b[i]);
    if (std::isnan(diff)) return diff;  // a NaN fails every EXPECT_LE
    worst = std::max(worst, diff);
  }
  const double scale = max_abs(ref);
  return scale > 0 ? worst / scale : (worst > 0 ? INFINITY : 0.0);
}

struct NamedPair {
  const char* name;
  const Tensor* value;
  const Tensor* reference;
};

std::vector<NamedPair> pairs_of(const Result& a, const Result& b) {
  std::vector<NamedPair> p{{"output", &a.output, &b.output},
                           {"final_state", &a.final_state, &b.final_state},
                           {"dx", &a.dx, &b.dx},
                           {"dg", &a.dg, &b.dg}};
  if (b.dh0.defined()) p.push_back({"dh0", &a.dh0, &b.dh0});
  return p;
}

void expect_results_match(const Result& a, const Result& b, double tol, const std::string& context) {
  EXPECT_EQ(a.dh0.defined(), b.dh0.defined()) << context;
  for (const NamedPair& p : pairs_of(a, b)) {
    ASSERT_TRUE(p.value->defined() && p.reference->defined()) << p.name << " missing, " << context;
    EXPECT_LE(max_rel_error(*p.value, *p.reference), tol) << p.name << ", " << context;
  }
}

TEST(GatedScan, BothFormsMatchHandComputedSteps) {
  // B = 1, T = 3, C = 2 with an initial state, chunks of 2 (one whole, one partial), and the loss
  // L = Σ_t o_t·r_t + h_T·q, whose gradients follow from dh_t = r_t + e^{g_{t+1}} dh_{t+1}.
  Inputs in;
  in.x = Tensor::from_vector<double>({1.0, -2.0, 0.5, 3.0, -1.5, 0.25}, {1, 3, 2});
  in.g = Tensor::from_vector<double>({-0.1, -2.0, -0.5, -0.05, -1.0, -0.3}, {1, 3, 2});
  in.h0 = Tensor::from_vector<double>({2.0, -1.0}, {1, 2});
  const Tensor r = Tensor::from_vector<double>({0.3, -0.7, 1.1, 0.2, -0.4, 0.9}, {1, 3, 2});
  const Tensor q = Tensor::from_vector<double>({0.6, -1.3}, {1, 2});
  for (int c = 0; c < 2; ++c) {
    auto at = [&](const Tensor& t, int step) { return t.item(step * 2 + c); };
    const double h1 = std::exp(at(in.g, 0)) * in.h0.item(c) + at(in.x, 0);
    const double h2 = std::exp(at(in.g, 1)) * h1 + at(in.x, 1);
    const double h3 = std::exp(at(in.g, 2)) * h2 + at(in.x, 2);
    const double dh3 = at(r, 2) + q.item(c);
    const double dh2 = at(r, 1) + std::exp(at(in.g, 2)) * dh3;
    const double dh1 = at(r, 0) + std::exp(at(in.g, 1)) * dh2;
    const double want_out[3] = {h1, h2, h3}, want_dx[3] = {dh1, dh2, dh3};
    const double want_dg[3] = {in.h0.item(c) * std::exp(at(in.g, 0)) * dh1, h1 * std::exp(at(in.g, 1)) * dh2,
                               h2 * std::exp(at(in.g, 2)) * dh3};
    for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
      const Result got = run(in, DType::F64, mode, 2, r, q);
      // Only rounding separates the forms from the closed form: a few ulps of values of order 1.
      for (int t = 0; t < 3; ++t) {
        EXPECT_NEAR(got.output.item(t * 2 + c), want_out[t], 1e-14) << "t " << t;
        EXPECT_NEAR(got.dx.item(t * 2 + c), want_dx[t], 1e-14) << "t " << t;
        EXPECT_NEAR(got.dg.item(t * 2 + c), want_dg[t], 1e-14) << "t " << t;
      }
      EXPECT_NEAR(got.final_state.item(c), h3, 1e-14);
      EXPECT_NEAR(got.dh0.item(c), std::exp(at(in.g, 0)) * dh1, 1e-14);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Chunk vs sequential.

// fp64: both forms are exact in exact arithmetic and differ only in the order of roundings (e^{ΣG} against a product
// of e^{g}: ~1e-16·|ΣG| relative, |ΣG| <= 64·22); any formula error is O(1).
constexpr double kFp64FormTolerance = 1e-10;
// fp32 against the fp64 reference on the same (rounded) inputs, max error relative to the reference's largest entry:
// fp32 rounding of the steps and of e^{g} (~6e-8 each), compounded over at most T = 200 steps without decay. A
// structural error (a lost carry, a decay off by one step) is O(1) in every regime.
constexpr double kFp32Tolerance = 2e-5;

class GatedScanRegimes : public ::testing::TestWithParam<GateRegime> {};

TEST_P(GatedScanRegimes, ChunkMatchesSequentialInFp64AndFp32) {
  const GateRegime& regime = GetParam();
  for (int64_t time : {1, 15, 16, 63, 64, 65, 200}) {
    for (bool with_initial : {false, true}) {
      const std::string context =
          std::string(regime.name) + " T=" + std::to_string(time) + " initial=" + std::to_string(with_initial);
      const Sizes s{2, time, 5};
      Rng rng(100 + time + (with_initial ? 1000 : 0));
      const Inputs in = make_inputs(rng, s, with_initial, regime);
      const Tensor d_out = random_tensor(rng, in.x.shape());
      const Tensor d_final = random_tensor(rng, {s.batch, s.channels});
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

INSTANTIATE_TEST_SUITE_P(GatedScan, GatedScanRegimes, ::testing::ValuesIn(kGateRegimes),
                         [](const ::testing::TestParamInfo<GateRegime>& info) {
                           std::string name = info.param.name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(GatedScan, StrongDecayForgetsAllButTheLastStep) {
  // g ≈ −20: the state keeps e^{−20} ≈ 2e-9 of its past, so o_t = x_t and dx_t = do_t to ~1e-8 relative (plus fp32
  // rounding); 1e-6 is loose for both dtypes yet far below the O(1) effect of a decay bug.
  const Sizes s{1, 70, 3};
  Rng rng(5);
  const Inputs in = rounded_to(make_inputs(rng, s, true, kGateRegimes[2]), DType::F32);
  const Tensor d_out = rounded(random_tensor(rng, in.x.shape()), DType::F32);
  for (DType dtype : {DType::F32, DType::F64})
    for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
      const Result r = run(in, dtype, mode, 0, d_out, Tensor());
      EXPECT_LE(max_rel_error(r.output, in.x), 1e-6) << dtype_name(dtype);
      EXPECT_LE(max_rel_error(r.dx, d_out), 1e-6) << dtype_name(dtype);
    }
}

TEST(GatedScan, AlmostNoDecayKeepsTheWholeSum) {
  // g ≈ −1e-4 and x > 0: h_T = h0 + Σ_t x_t, less what the decay takes, which is at most
  // |h0|·|Σ_s g_s| + Σ_t x_t·|Σ_{s>t} g_s| (1 − e^{−a} <= a): a few units here against a sum of about 160, while a
  // lost chunk of 64 steps takes about 50. The bound adds 1e-4 of the sum for fp32 rounding.
  const Sizes s{1, 200, 4};
  Rng rng(6);
  Inputs in = make_inputs(rng, s, true, kGateRegimes[0]);
  for (int64_t i = 0; i < in.x.numel(); ++i) in.x.set_item(i, std::abs(in.x.item(i)));
  for (int64_t c = 0; c < s.channels; ++c) {
    double sum = in.h0.item(c), bound = 0, later_decay = 0;
    for (int64_t t = s.time - 1; t >= 0; --t) {
      sum += in.x.item(t * s.channels + c);
      bound += in.x.item(t * s.channels + c) * later_decay;
      later_decay += std::abs(in.g.item(t * s.channels + c));
    }
    bound += std::abs(in.h0.item(c)) * later_decay + 1e-4 * std::abs(sum);
    EXPECT_LE(bound, 0.05 * std::abs(sum)) << "the bound must stay far below a lost chunk's share";
    for (DType dtype : {DType::F32, DType::F64})
      for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
        const Result r = run(in, dtype, mode, 0, Tensor(), Tensor());
        EXPECT_NEAR(r.final_state.item(c), sum, bound) << dtype_name(dtype) << " channel " << c;
      }
  }
}

TEST(GatedScan, ChunkSizeDoesNotChangeTheResult) {
  // Chunks of 1, 5, 16, 64 and 300 > T regroup the same computation: fp64 rounding only (as kFp64FormTolerance).
  const Sizes s{2, 100, 6};
  Rng rng(11);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.x.shape());
  const Tensor d_final = random_tensor(rng, in.h0.shape());
  const Result base = run(in, DType::F64, ScanMode::Sequential, 0, d_out, d_final);
  for (int64_t chunk : {1, 5, 16, 64, 300})
    expect_results_match(run(in, DType::F64, ScanMode::Chunk, chunk, d_out, d_final), base, kFp64FormTolerance,
                         "chunk " + std::to_string(chunk));
}

TEST(GatedScan, ResultsDoNotDependOnTheThreadCount) {
  // B·T·C = 52000 elements, above the size where the op forks a team: 2 batches x 4 channel blocks (the last partial).
  const Sizes s{2, 130, 200};
  Rng rng(13);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.x.shape());
  const Tensor d_final = random_tensor(rng, in.h0.shape());
  const int saved_threads = omp_get_max_threads();
  for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
    std::vector<Result> results;
    for (int threads : {1, 3, 4}) {
      omp_set_num_threads(threads);
      results.push_back(run(in, DType::F32, mode, 0, d_out, d_final));
    }
    for (size_t i = 1; i < results.size(); ++i)
      for (const NamedPair& p : pairs_of(results[i], results[0]))
        EXPECT_EQ(p.value->to_double_vector(), p.reference->to_double_vector()) << p.name << " run " << i;
  }
  omp_set_num_threads(saved_threads);
}

// ---------------------------------------------------------------------------------------------------------------------
// Finite-difference gradients (fp64).

// Central differences with h = 1e-6 on O(1) functions of fp64: truncation ~h² and rounding ~1e-16/h ≈ 1e-10, so 1e-6
// has a wide margin, while a wrong term in any gradient is O(1).
constexpr double kFdStep = 1e-6;
constexpr double kFdTolerance = 1e-6;

struct GradcheckCase {
  Sizes sizes;
  int64_t chunk;
};
// Two whole chunks of 3 and a partial one of 1; and 20 steps in chunks of 8 (4 left over).
constexpr GradcheckCase kSmallCase{{2, 7, 3}, 3};
constexpr GradcheckCase kLongerCase{{1, 20, 2}, 8};

std::vector<Var> gradcheck_vars(const GradcheckCase& c, uint64_t seed) {
  Rng rng(seed);
  const Inputs in = make_inputs(rng, c.sizes, true);
  return {make_var(in.x, true, "x"), make_var(in.g, true, "g"), make_var(in.h0, true, "h0")};
}

class GatedScanGradients : public ::testing::TestWithParam<ScanMode> {};

TEST_P(GatedScanGradients, OutputGradientsMatchFiniteDifferences) {
  const ScanMode mode = GetParam();
  testing::expect_gradients_match(
      [&](Tape& t, const std::vector<Var>& in) {
        return gated_scan(t, in[0], in[1], in[2], mode, kSmallCase.chunk).output;
      },
      gradcheck_vars(kSmallCase, 21), 1234, kFdStep, kFdTolerance);
}

TEST_P(GatedScanGradients, FinalStateGradientsMatchFiniteDifferences) {
  // The output receives no gradient here, so this also covers an undefined output gradient.
  const ScanMode mode = GetParam();
  testing::expect_gradients_match(
      [&](Tape& t, const std::vector<Var>& in) {
        return gated_scan(t, in[0], in[1], in[2], mode, kSmallCase.chunk).final_state;
      },
      gradcheck_vars(kSmallCase, 22), 1234, kFdStep, kFdTolerance);
}

TEST_P(GatedScanGradients, LossOfBothOutputsMatchesFiniteDifferences) {
  const ScanMode mode = GetParam();
  for (const GradcheckCase& c : {kSmallCase, kLongerCase}) {
    testing::expect_gradients_match_outputs(
        [&](Tape& t, const std::vector<Var>& in) {
          GatedScanOutputs r = gated_scan(t, in[0], in[1], in[2], mode, c.chunk);
          return std::vector<Var>{r.output, r.final_state};
        },
        gradcheck_vars(c, 23), 77, kFdStep, kFdTolerance);
  }
}

TEST_P(GatedScanGradients, WithoutInitialStateMatchesFiniteDifferences) {
  const ScanMode mode = GetParam();
  std::vector<Var> vars = gradcheck_vars(kSmallCase, 24);
  vars.pop_back();
  testing::expect_gradients_match_outputs(
      [&](Tape& t, const std::vector<Var>& in) {
        GatedScanOutputs r = gated_scan(t, in[0], in[1], nullptr, mode, kSmallCase.chunk);
        return std::vector<Var>{r.output, r.final_state};
      },
      vars, 78, kFdStep, kFdTolerance);
}

INSTANTIATE_TEST_SUITE_P(GatedScan, GatedScanGradients, ::testing::Values(ScanMode::Sequential, ScanMode::Chunk),
                         [](const ::testing::TestParamInfo<ScanMode>& info) {
                           return info.param == ScanMode::Sequential ? std::string("Sequential")
                                                                     : std::string("Chunk");
                         });

// ---------------------------------------------------------------------------------------------------------------------
// Gradient plumbing.

TEST(GatedScan, GradientsReachOnlyInputsThatWantThem) {
  // Only g wants a gradient: x and the initial state get no buffer, and dg equals the full run's bit for bit.
  const Sizes s{2, 40, 3};
  Rng rng(31);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.x.shape());
  for (ScanMode mode : {ScanMode::Sequential, ScanMode::Chunk}) {
    const Result full = run(in, DType::F64, mode, 16, d_out, Tensor());
    Tape tape;
    Var x = make_var(in.x.clone()), h0 = make_var(in.h0.clone());
    Var g = make_var(in.g.clone(), true, "g");
    GatedScanOutputs r = gated_scan(tape, x, g, h0, mode, 16);
    tape.backward(r.output, d_out);
    EXPECT_FALSE(x->grad.defined());
    EXPECT_FALSE(h0->grad.defined());
    EXPECT_EQ(g->grad.to_double_vector(), full.dg.to_double_vector());
  }
}

TEST(GatedScan, GradientsAccumulateIntoExistingOnes) {
  const Sizes s{1, 30, 4};
  Rng rng(33);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.x.shape());
  const Tensor d_final = random_tensor(rng, in.h0.shape());
  const Result fresh = run(in, DType::F64, ScanMode::Chunk, 8, d_out, d_final);
  const Tensor px = random_tensor(rng, in.x.shape()), pg = random_tensor(rng, in.g.shape()),
               ph0 = random_tensor(rng, in.h0.shape());
  Tape tape;
  Var x = make_var(in.x.clone(), true), g = make_var(in.g.clone(), true), h0 = make_var(in.h0.clone(), true);
  x->grad = px.clone();
  g->grad = pg.clone();
  h0->grad = ph0.clone();
  GatedScanOutputs r = gated_scan(tape, x, g, h0, ScanMode::Chunk, 8);
  r.final_state->grad = d_final.clone();
  tape.backward(r.output, d_out);
  // One fp64 addition: exact up to one rounding of O(1) values.
  for (const auto& [var, prior, grad] :
       {std::tuple{x, &px, &fresh.dx}, std::tuple{g, &pg, &fresh.dg}, std::tuple{h0, &ph0, &fresh.dh0}})
    for (int64_t i = 0; i < prior->numel(); ++i)
      EXPECT_NEAR(var->grad.item(i), prior->item(i) + grad->item(i), 1e-14) << i;
}

TEST(GatedScan, RowStridedInputsMatchContiguousOnes) {
  // x and g as column blocks of wider tensors (split_columns): the op reads them through contiguous copies and the
  // gradients land in the parents' columns; the same arithmetic as contiguous inputs, so the same bits.
  const Sizes s{2, 20, 3};
  Rng rng(34);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.x.shape());
  const Result want = run(in, DType::F64, ScanMode::Chunk, 8, d_out, Tensor());
  auto wide = [&](const Tensor& t) {
    Tensor w = Tensor::full({s.batch, s.time, s.channels + 4}, 0.5, DType::F64);
    w.columns(2, s.channels).copy_from(t);
    return w;
  };
  Tape tape;
  Var px = make_var(wide(in.x), true, "x_parent"), pg = make_var(wide(in.g), true, "g_parent");
  Var x = split_columns(tape, px, {2, s.channels, 2})[1];
  Var g = split_columns(tape, pg, {2, s.channels, 2})[1];
  Var h0 = make_var(in.h0.clone(), true);
  GatedScanOutputs r = gated_scan(tape, x, g, h0, ScanMode::Chunk, 8);
  tape.backward(r.output, d_out);
  EXPECT_EQ(r.output->value.to_double_vector(), want.output.to_double_vector());
  EXPECT_EQ(px->grad.columns(2, s.channels).clone().to_double_vector(), want.dx.to_double_vector());
  EXPECT_EQ(pg->grad.columns(2, s.channels).clone().to_double_vector(), want.dg.to_double_vector());
  EXPECT_EQ(max_abs(px->grad.columns(0, 2).clone()), 0.0);
  EXPECT_EQ(max_abs(pg->grad.columns(s.channels + 2, 2).clone()), 0.0);
}

TEST(GatedScan, NoTapeEntryWithoutGradients) {
  Tape tape;
  Rng rng(32);
  const Inputs in = make_inputs(rng, {1, 5, 2}, false);
  GatedScanOutputs r = gated_scan(tape, make_var(in.x), make_var(in.g), nullptr);
  EXPECT_EQ(tape.size(), 0u);
  EXPECT_FALSE(r.output->requires_grad);
  EXPECT_EQ(r.output->value.shape(), (Shape{1, 5, 2}));
  EXPECT_EQ(r.final_state->value.shape(), (Shape{1, 2}));
}

TEST(GatedScan, RejectsBadArguments) {
  Tape tape;
  auto zeros = [](const Shape& shape, DType dtype = DType::F32) { return make_var(Tensor::zeros(shape, dtype)); };
  const Var x = zeros({2, 5, 3}), g = zeros({2, 5, 3});
  EXPECT_NO_THROW(gated_scan(tape, x, g, zeros({2, 3})));
  EXPECT_THROW(gated_scan(tape, x, nullptr, nullptr), Error);                          // g missing
  EXPECT_THROW(gated_scan(tape, zeros({2, 15}), zeros({2, 15}), nullptr), Error);      // not [B, T, C]
  EXPECT_THROW(gated_scan(tape, x, zeros({2, 5, 4}), nullptr), Error);                 // g's shape
  EXPECT_THROW(gated_scan(tape, x, g, zeros({2, 4})), Error);                          // initial state's shape
  EXPECT_THROW(gated_scan(tape, x, zeros({2, 5, 3}, DType::F64), nullptr), Error);     // dtypes mixed on the CPU
  EXPECT_THROW(gated_scan(tape, x, g, zeros({2, 3}, DType::F64)), Error);
  EXPECT_THROW(gated_scan(tape, x, g, nullptr, ScanMode::Chunk, -1), Error);           // negative chunk
  EXPECT_THROW(gated_scan(tape, zeros({2, 0, 3}), zeros({2, 0, 3}), nullptr), Error);  // empty
}

}  // namespace
}  // namespace hgrn
