// test_gla_recurrence.cpp: the HGRU2 recurrence (naive and chunkwise forms): hand-computed steps, chunk vs naive
// agreement in fp64 over sequence lengths with partial chunks, gate regimes in fp32 and fp64, chunk-size and
// sequence-split invariance, fp64 finite-difference gradients of both forms, q, k and v read row-strided (column
// blocks, as GLA's fused projection holds them), determinism and shape checks; the scalar decays (g [B, T, H] and [H])
// against the per-channel mode on broadcast gates, in fp32 and by finite differences, and row-strided.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "gradcheck.h"
#include "hgru2_test_support.h"
#include "ops/gla_recurrence.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::QkvBlocks;
using testing::QkvColumns;
using testing::random_tensor;

struct Sizes {
  int64_t batch, time, heads, key_dim, value_dim;
};

// fp64 inputs of one problem; s0 undefined means "no initial state".
struct Inputs {
  Tensor q, k, v, g, s0;
};

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// g = logsigmoid(u) / normalizer with u ~ N(0, 1): fla's gate_logit_normalizer regimes (all g < 0).
Tensor log_sigmoid_gate(Rng& rng, const Shape& shape, double normalizer) {
  Tensor g = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < g.numel(); ++i) g.set_item(i, log_sigmoid(rng.normal()) / normalizer);
  return g;
}

Inputs make_inputs(Rng& rng, const Sizes& s, bool with_initial_state, Tensor gate = {}) {
  const Shape keys{s.batch, s.time, s.heads * s.key_dim};
  Inputs in;
  in.q = random_tensor(rng, keys);
  in.k = random_tensor(rng, keys);
  in.v = random_tensor(rng, {s.batch, s.time, s.heads * s.value_dim});
  in.g = gate.defined() ? gate : log_sigmoid_gate(rng, keys, 1.0);
  if (with_initial_state) in.s0 = random_tensor(rng, {s.batch, s.heads, s.key_dim, s.value_dim});
  return in;
}

// Rounds every input to `dtype` and back, so that an fp64 reference sees exactly the values an fp32 run sees.
Inputs rounded_to(const Inputs& in, DType dtype) {
  auto round = [&](const Tensor& t) { return t.defined() ? t.to(dtype).to(DType::F64) : Tensor(); };
  return {round(in.q), round(in.k), round(in.v), round(in.g), round(in.s0)};
}

// Everything one call produces, converted to fp64: outputs and the gradients of all inputs.
struct Result {
  Tensor output, final_state, dq, dk, dv, dg, ds0;
};

// Runs the recurrence in `dtype` and backpropagates L = <output, d_out> + <final_state, d_final> (either cotangent
// may be undefined, which leaves that output without a gradient). A g of [H] is a constant: no dg.
Result run(const Inputs& in, int64_t heads, DType dtype, RecurrenceMode mode, int64_t chunk_size, const Tensor& d_out,
           const Tensor& d_final, double scale = 0.3) {
  Tape tape;
  Var q = make_var(in.q.to(dtype), true, "q");
  Var k = make_var(in.k.to(dtype), true, "k");
  Var v = make_var(in.v.to(dtype), true, "v");
  Var g = make_var(in.g.to(dtype), in.g.dim() != 1, "g");
  Var s0 = in.s0.defined() ? make_var(in.s0.to(dtype), true, "s0") : nullptr;
  GlaOutputs r = gla_recurrence(tape, q, k, v, g, s0, heads, scale, mode, chunk_size);
  if (d_out.defined()) {
    if (d_final.defined()) r.final_state->grad = d_final.to(dtype);
    tape.backward(r.output, d_out.to(dtype));
  } else if (d_final.defined()) {
    tape.backward(r.final_state, d_final.to(dtype));
  }
  auto f64 = [](const Var& x) { return x && x->grad.defined() ? x->grad.to(DType::F64) : Tensor(); };
  return {r.output->value.to(DType::F64), r.final_state->value.to(DType::F64), f64(q), f64(k), f64(v), f64(g),
          f64(s0)};
}

// Layouts of q, k and v as column blocks: GLA's (side by side, more columns after), the same from column 3, and one
// parent each with strides and offsets that all differ, so that an input read or a gradient written with another's
// stride or offset changes the result.
const QkvColumns kQkvLayouts[] = {
    {"fused", true, {0, 0, 0}, {0, 0, 9}},
    {"fused_from_column_3", true, {3, 0, 0}, {0, 0, 4}},
    {"one_parent_each", false, {1, 5, 3}, {4, 2, 6}},
};

// run() with q, k and v read in place as column blocks laid out as `layout` says (both cotangents given); their
// gradients are taken from the parents' gradients, which must be 0 elsewhere.
Result run_row_strided(const Inputs& in, int64_t heads, DType dtype, RecurrenceMode mode, int64_t chunk_size,
                       const QkvColumns& layout, const Tensor& d_out, const Tensor& d_final) {
  const QkvBlocks blocks(layout, in.q.size(-1), in.v.size(-1));
  Tape tape;
  std::vector<Var> parents;
  for (const Tensor& p : blocks.parents_of(in.q, in.k, in.v)) parents.push_back(make_var(p.to(dtype), true, "qkv"));
  const std::vector<Var> qkv = blocks.split(tape, parents);
  Var g = make_var(in.g.to(dtype), in.g.dim() != 1, "g");  // [H]: a constant
  Var s0 = in.s0.defined() ? make_var(in.s0.to(dtype), true, "s0") : nullptr;
  GlaOutputs r = gla_recurrence(tape, qkv[0], qkv[1], qkv[2], g, s0, heads, 0.3, mode, chunk_size);
  r.final_state->grad = d_final.to(dtype);
  tape.backward(r.output, d_out.to(dtype));
  std::vector<Tensor> grads;
  for (const Var& p : parents) grads.push_back(p->grad.to(DType::F64));
  blocks.expect_zero_outside_blocks(grads);
  return {r.output->value.to(DType::F64), r.final_state->value.to(DType::F64), blocks.block(grads, 0).clone(),
          blocks.block(grads, 1).clone(), blocks.block(grads, 2).clone(),
          g->grad.defined() ? g->grad.to(DType::F64) : Tensor(),
          s0 ? s0->grad.to(DType::F64) : Tensor()};
}

// max|x − ref| / max(1, max|ref|): relative to the reference's largest entry, so single near-zero entries do not blow
// it up, and absolute where the whole reference is small (e.g. dg is exactly 0 for T = 1 without an initial state,
// which the chunk form reproduces only up to rounding). All test data is O(1), so this stays a relative measure.
double max_rel_error(const Tensor& x, const Tensor& ref) {
  EXPECT_EQ(x.shape(), ref.shape());
  const std::vector<double> a = x.to_double_vector(), b = ref.to_double_vector();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(a[i] - b[i]);
    if (std::isnan(diff)) return diff;  // std::max would drop it; a NaN fails every EXPECT_LE
    worst = std::max(worst, diff);
  }
  return worst / std::max(max_abs(ref), 1.0);
}

// ‖x − ref‖_rms / ‖ref‖_rms: fla's metric for reduced-precision kernels (tests/ops/test_gla.py).
double rms_rel_error(const Tensor& x, const Tensor& ref) {
  EXPECT_EQ(x.shape(), ref.shape());
  const std::vector<double> a = x.to_double_vector(), b = ref.to_double_vector();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

bool all_finite(const Tensor& t) {
  for (double x : t.to_double_vector())
    if (!std::isfinite(x)) return false;
  return true;
}

struct NamedPair {
  const char* name;
  const Tensor* value;
  const Tensor* reference;
};

std::vector<NamedPair> pairs_of(const Result& a, const Result& b) {
  std::vector<NamedPair> p{{"output", &a.output, &b.output}, {"final_state", &a.final_state, &b.final_state},
                           {"dq", &a.dq, &b.dq},             {"dk", &a.dk, &b.dk},
                           {"dv", &a.dv, &b.dv},             {"dg", &a.dg, &b.dg}};
  if (b.ds0.defined()) p.push_back({"ds0", &a.ds0, &b.ds0});
  return p;
}

// Every output and gradient of `a` within `tol` of `b` under max_rel_error.
void expect_results_match(const Result& a, const Result& b, double tol, const std::string& context) {
  EXPECT_EQ(a.ds0.defined(), b.ds0.defined()) << context;
  for (const NamedPair& p : pairs_of(a, b)) {
    ASSERT_TRUE(p.value->defined() && p.reference->defined()) << p.name << " missing, " << context;
    EXPECT_LE(max_rel_error(*p.value, *p.reference), tol) << p.name << ", " << context;
  }
}

// A problem with B·H > 1, V ≠ K and a K that is not a power of two.
constexpr Sizes kGeneralSizes{2, 0, 3, 12, 20};

Sizes with_time(Sizes s, int64_t time) {
  s.time = time;
  return s;
}

TEST(GlaRecurrence, NaiveAndChunkMatchHandComputedSteps) {
  // B = H = 1, K = 2, V = 1, T = 2: S_t[c] = e^{g_tc} S_{t−1}[c] + k_tc v_t,  o_t = s Σ_c q_tc S_t[c].
  const double s = 0.5;
  Inputs in;
  in.q = Tensor::from_vector<double>({1.0, 2.0, -1.0, 0.5}, {1, 2, 2});
  in.k = Tensor::from_vector<double>({0.3, -0.2, 0.7, 0.1}, {1, 2, 2});
  in.v = Tensor::from_vector<double>({2.0, -3.0}, {1, 2, 1});
  in.g = Tensor::from_vector<double>({-0.1, -2.0, -0.5, -0.05}, {1, 2, 2});
  in.s0 = Tensor::from_vector<double>({1.0, 4.0}, {1, 1, 2, 1});
  const double s1a = std::exp(-0.1) * 1.0 + 0.3 * 2.0, s1b = std::exp(-2.0) * 4.0 + (-0.2) * 2.0;
  const double s2a = std::exp(-0.5) * s1a + 0.7 * (-3.0), s2b = std::exp(-0.05) * s1b + 0.1 * (-3.0);
  const std::vector<double> expected_output{s * (1.0 * s1a + 2.0 * s1b), s * (-1.0 * s2a + 0.5 * s2b)};
  for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
    const Result r = run(in, 1, DType::F64, mode, 0, Tensor(), Tensor(), s);
    const std::vector<double> out = r.output.to_double_vector(), fin = r.final_state.to_double_vector();
    // Only rounding separates the kernels from the closed form: a few ulps of values of order 1.
    for (int t = 0; t < 2; ++t) EXPECT_NEAR(out[t], expected_output[t], 1e-14);
    EXPECT_NEAR(fin[0], s2a, 1e-14);
    EXPECT_NEAR(fin[1], s2b, 1e-14);
  }
}

TEST(GlaRecurrence, ChunkMatchesNaiveInFp64) {
  // Partial chunks (15, 63, 65, 200), exact multiples (16, 64), a single step (1); several chunks at T = 200 both with
  // the default chunk (64: 4 sub-chunks of 16, so the off-diagonal reference-point blocks run) and with 16.
  // Tolerance: both forms are exact in exact arithmetic and differ only by the order of fp64 roundings (~1e-16 per
  // operation over at most a few hundred accumulated terms); any formula error is O(1).
  const double tol = 1e-10;
  for (int64_t time : {1, 15, 16, 63, 64, 65, 200}) {
    for (bool with_initial : {false, true}) {
      const Sizes s = with_time(kGeneralSizes, time);
      Rng rng(100 + time);
      const Inputs in = make_inputs(rng, s, with_initial);
      const Tensor d_out = random_tensor(rng, in.v.shape());
      const Tensor d_final = random_tensor(rng, {s.batch, s.heads, s.key_dim, s.value_dim});
      const Result naive = run(in, s.heads, DType::F64, RecurrenceMode::Naive, 0, d_out, d_final);
      for (int64_t chunk : {0, 16}) {
        const Result chunked = run(in, s.heads, DType::F64, RecurrenceMode::Chunk, chunk, d_out, d_final);
        expect_results_match(chunked, naive, tol,
                             "T=" + std::to_string(time) + " initial=" + std::to_string(with_initial) +
                                 " chunk=" + std::to_string(chunk));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Gate regimes.

struct GateRegime {
  const char* name;
  std::function<Tensor(Rng&, const Shape&)> make_gate;
};

Tensor constant_plus_noise_gate(Rng& rng, const Shape& shape, double base, double noise) {
  Tensor g = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < g.numel(); ++i) g.set_item(i, base * (1.0 + noise * std::abs(rng.normal())));
  return g;
}

const std::vector<GateRegime> kGateRegimes{
    {"logsigmoid_over_0.1", [](Rng& r, const Shape& s) { return log_sigmoid_gate(r, s, 0.1); }},
    {"logsigmoid_over_1", [](Rng& r, const Shape& s) { return log_sigmoid_gate(r, s, 1.0); }},
    {"logsigmoid_over_10", [](Rng& r, const Shape& s) { return log_sigmoid_gate(r, s, 10.0); }},
    {"strong_decay_minus_20", [](Rng& r, const Shape& s) { return constant_plus_noise_gate(r, s, -20.0, 0.1); }},
    {"almost_no_decay_minus_1e-6", [](Rng& r, const Shape& s) { return constant_plus_noise_gate(r, s, -1e-6, 0.5); }},
};

// fp32 runs against the fp64 reference, rms_rel_error (fla's metric; its bound for reduced-precision GLA kernels is
// 5e-3). Measured here: <= 3.5e-7 for outputs, states, dq, dk, dv, dS0 of both forms in every regime; the chunk form's
// dg up to 1.1e-6 (logsigmoid/0.1) and 7.9e-6 (g ≈ −20), because its off-diagonal decays e^{G_i − G_j} come from
// differences of chunk-local cumsums that reach |G| ≈ 1300 in fp32 (an error of ~ulp(1300) ≈ 1e-4 in the exponent).
// 1e-4 keeps a >10x margin; a structural error is O(1), and before the gate-independent terms were held back from dg
// (chunk_gate_grad) the g ≈ −20 regime measured 3e2 here.
constexpr double kFp32Tolerance = 1e-4;

// Names the regime in GoogleTest's messages (instead of a byte dump).
void PrintTo(const GateRegime& regime, std::ostream* os) { *os << regime.name; }

class Hgru2GateRegimes : public ::testing::TestWithParam<GateRegime> {};

TEST_P(Hgru2GateRegimes, FiniteAndChunkAgreesWithNaiveInFp32AndFp64) {
  const GateRegime& regime = GetParam();
  // T = 130: two full chunks of 64 and a partial one of 2.
  const Sizes s{2, 130, 2, 20, 12};
  Rng rng(42);
  const Shape keys{s.batch, s.time, s.heads * s.key_dim};
  const Inputs in64 = make_inputs(rng, s, true, regime.make_gate(rng, keys));
  const Tensor d_out = random_tensor(rng, in64.v.shape());
  const Tensor d_final = random_tensor(rng, in64.s0.shape());

  // fp64: chunk equals naive to rounding (same reasoning and bound as ChunkMatchesNaiveInFp64).
  const Result naive64 = run(in64, s.heads, DType::F64, RecurrenceMode::Naive, 0, d_out, d_final);
  const Result chunk64 = run(in64, s.heads, DType::F64, RecurrenceMode::Chunk, 0, d_out, d_final);
  expect_results_match(chunk64, naive64, 1e-10, regime.name);

  // fp32: both forms against the fp64 reference on the same (rounded) inputs.
  const Inputs in32 = rounded_to(in64, DType::F32);
  const Result reference = run(in32, s.heads, DType::F64, RecurrenceMode::Naive, 0, d_out, d_final);
  for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
    const Result r32 = run(in32, s.heads, DType::F32, mode, 0, d_out, d_final);
    const std::string context = std::string(regime.name) + (mode == RecurrenceMode::Chunk ? " chunk" : " naive");
    for (const NamedPair& p : pairs_of(r32, reference)) {
      EXPECT_TRUE(all_finite(*p.value)) << p.name << ", " << context;
      EXPECT_LE(rms_rel_error(*p.value, *p.reference), kFp32Tolerance) << p.name << ", " << context;
    }
  }
  for (const NamedPair& p : pairs_of(chunk64, naive64)) EXPECT_TRUE(all_finite(*p.value)) << p.name;
}

INSTANTIATE_TEST_SUITE_P(Hgru2, Hgru2GateRegimes, ::testing::ValuesIn(kGateRegimes),
                         [](const ::testing::TestParamInfo<GateRegime>& info) {
                           std::string name = info.param.name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

TEST(Hgru2GateRegimes, StrongDecayForgetsAllButTheLastStep) {
  // With g ≈ −20 per step the state keeps e^{−20} ≈ 2e-9 of its past, so S_t = k_tᵀ v_t and o_t = s (q_t·k_t) v_t to
  // that accuracy (plus fp32 rounding ~1e-7): a 1e-5 relative bound is loose for both dtypes yet far below the O(1)
  // effect of any decay bug (and a NaN fails it too).
  const Sizes s{1, 70, 1, 4, 3};
  const double scale = 0.3;
  Rng rng(5);
  const Inputs in = make_inputs(rng, s, true, constant_plus_noise_gate(rng, {1, 70, 4}, -20.0, 0.1));
  Tensor expected_output = Tensor::zeros(in.v.shape(), DType::F64);
  for (int64_t t = 0; t < s.time; ++t) {
    double qk = 0;
    for (int64_t c = 0; c < s.key_dim; ++c) qk += in.q.item(t * s.key_dim + c) * in.k.item(t * s.key_dim + c);
    for (int64_t j = 0; j < s.value_dim; ++j)
      expected_output.set_item(t * s.value_dim + j, scale * qk * in.v.item(t * s.value_dim + j));
  }
  Tensor expected_final = Tensor::zeros(in.s0.shape(), DType::F64);
  const int64_t last = s.time - 1;
  for (int64_t c = 0; c < s.key_dim; ++c)
    for (int64_t j = 0; j < s.value_dim; ++j)
      expected_final.set_item(c * s.value_dim + j,
                              in.k.item(last * s.key_dim + c) * in.v.item(last * s.value_dim + j));
  for (DType dtype : {DType::F32, DType::F64})
    for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
      const Result r = run(in, s.heads, dtype, mode, 0, Tensor(), Tensor(), scale);
      EXPECT_LE(max_rel_error(r.output, expected_output), 1e-5) << dtype_name(dtype);
      EXPECT_LE(max_rel_error(r.final_state, expected_final), 1e-5) << dtype_name(dtype);
    }
}

TEST(Hgru2GateRegimes, AlmostNoDecayKeepsTheWholeSum) {
  // With g ≈ −1e-6 per step nothing is forgotten: S_T = S_0 + Σ_t k_tᵀ v_t up to a relative ~T·1.5e-6 ≈ 3e-4 (T = 200)
  // from the decay itself, plus fp32 rounding. 2e-3 allows that; a lost or doubled chunk contribution is O(1/NT).
  const Sizes s{1, 200, 2, 5, 3};
  Rng rng(6);
  const Inputs in = make_inputs(rng, s, true, constant_plus_noise_gate(rng, {1, 200, 10}, -1e-6, 0.5));
  Tensor expected_final = in.s0.clone();
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t t = 0; t < s.time; ++t)
      for (int64_t c = 0; c < s.key_dim; ++c)
        for (int64_t j = 0; j < s.value_dim; ++j) {
          const int64_t at = (h * s.key_dim + c) * s.value_dim + j;
          expected_final.set_item(at, expected_final.item(at) +
                                          in.k.item(t * s.heads * s.key_dim + h * s.key_dim + c) *
                                              in.v.item(t * s.heads * s.value_dim + h * s.value_dim + j));
        }
  for (DType dtype : {DType::F32, DType::F64})
    for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
      const Result r = run(in, s.heads, dtype, mode, 0, Tensor(), Tensor());
      EXPECT_LE(max_rel_error(r.final_state, expected_final), 2e-3) << dtype_name(dtype);
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Invariances.

TEST(GlaRecurrence, ChunkSizeDoesNotChangeTheResult) {
  // fp64: chunk lengths 16/32/64 (and odd ones, 5 and 100 > T) are the same computation regrouped; rounding only.
  // fp32: the same with fp32 rounding of the regrouped sums, ~1e-6 relative; 1e-4 bounds it with margin.
  const Sizes s = with_time(kGeneralSizes, 100);
  Rng rng(11);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const Tensor d_final = random_tensor(rng, in.s0.shape());
  for (DType dtype : {DType::F64, DType::F32}) {
    const double tol = dtype == DType::F64 ? 1e-10 : 1e-4;
    const Result base = run(in, s.heads, dtype, RecurrenceMode::Chunk, 16, d_out, d_final);
    for (int64_t chunk : {32, 64, 5, 100}) {
      const Result other = run(in, s.heads, dtype, RecurrenceMode::Chunk, chunk, d_out, d_final);
      for (const NamedPair& p : pairs_of(other, base))
        EXPECT_LE(rms_rel_error(*p.value, *p.reference), tol)
            << p.name << " chunk " << chunk << " " << dtype_name(dtype);
    }
  }
}

// Rows [from, to) of a [B, T, ...] tensor.
Tensor time_slice(const Tensor& x, int64_t from, int64_t to) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
  Tensor out = Tensor::empty({batch, to - from, width}, x.dtype());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = from; t < to; ++t)
      for (int64_t c = 0; c < width; ++c)
        out.set_item((b * (to - from) + (t - from)) * width + c, x.item((b * time + t) * width + c));
  return out;
}

TEST(GlaRecurrence, SplitSequenceCarryingTheStateEqualsOneCall) {
  // T = 100 as 37 + 63 steps, the first call's final_state Var being the second call's initial_state, so the
  // gradients (dS0 of the second call flowing into the final-state gradient of the first) are checked too.
  // fp64 regrouping only: 1e-10 as in ChunkMatchesNaiveInFp64.
  const Sizes s = with_time(kGeneralSizes, 100);
  const int64_t split = 37;
  Rng rng(12);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const Tensor d_final = random_tensor(rng, in.s0.shape());
  for (RecurrenceMode mode : {RecurrenceMode::Chunk, RecurrenceMode::Naive}) {
    const Result whole = run(in, s.heads, DType::F64, mode, 0, d_out, d_final);

    Tape tape;
    auto part = [&](const Tensor& x, int64_t from, int64_t to, const char* name) {
      return make_var(time_slice(x, from, to), true, name);
    };
    Var q1 = part(in.q, 0, split, "q1"), k1 = part(in.k, 0, split, "k1"), v1 = part(in.v, 0, split, "v1"),
        g1 = part(in.g, 0, split, "g1");
    Var q2 = part(in.q, split, s.time, "q2"), k2 = part(in.k, split, s.time, "k2"),
        v2 = part(in.v, split, s.time, "v2"), g2 = part(in.g, split, s.time, "g2");
    Var s0 = make_var(in.s0.clone(), true, "s0");
    GlaOutputs first = gla_recurrence(tape, q1, k1, v1, g1, s0, s.heads, 0.3, mode);
    GlaOutputs second = gla_recurrence(tape, q2, k2, v2, g2, first.final_state, s.heads, 0.3, mode);
    first.output->grad = time_slice(d_out, 0, split);
    second.final_state->grad = d_final.clone();
    tape.backward(second.output, time_slice(d_out, split, s.time));

    const double tol = 1e-10;
    EXPECT_LE(max_rel_error(first.output->value, time_slice(whole.output, 0, split)), tol);
    EXPECT_LE(max_rel_error(second.output->value, time_slice(whole.output, split, s.time)), tol);
    EXPECT_LE(max_rel_error(second.final_state->value, whole.final_state), tol);
    EXPECT_LE(max_rel_error(s0->grad, whole.ds0), tol);
    const std::vector<std::pair<Var, const Tensor*>> halves{{q1, &whole.dq}, {k1, &whole.dk}, {v1, &whole.dv},
                                                            {g1, &whole.dg}};
    const std::vector<std::pair<Var, const Tensor*>> seconds{{q2, &whole.dq}, {k2, &whole.dk}, {v2, &whole.dv},
                                                             {g2, &whole.dg}};
    for (const auto& [var, ref] : halves)
      EXPECT_LE(max_rel_error(var->grad, time_slice(*ref, 0, split)), tol) << var->name;
    for (const auto& [var, ref] : seconds)
      EXPECT_LE(max_rel_error(var->grad, time_slice(*ref, split, s.time)), tol) << var->name;
  }
}

TEST(GlaRecurrence, ChunkIsBitwiseDeterministic) {
  // Per-(batch, head) work with per-thread scratch: the same bits whatever thread runs which pair.
  const Sizes s{4, 90, 4, 16, 16};
  Rng rng(13);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const Tensor d_final = random_tensor(rng, in.s0.shape());
  const Result a = run(in, s.heads, DType::F32, RecurrenceMode::Chunk, 0, d_out, d_final);
  const Result b = run(in, s.heads, DType::F32, RecurrenceMode::Chunk, 0, d_out, d_final);
  for (const NamedPair& p : pairs_of(a, b))
    EXPECT_EQ(p.value->to_double_vector(), p.reference->to_double_vector()) << p.name;
}

TEST(GlaRecurrence, RowStridedInputsGiveTheContiguousBits) {
  // Reading q, k and v in place is addressing only: the same bits as from contiguous copies, for both forms and
  // dtypes, several heads and partial chunks, with each gradient in its own columns (the others 0).
  const Sizes s = with_time(kGeneralSizes, 70);
  Rng rng(14);
  const Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const Tensor d_final = random_tensor(rng, in.s0.shape());
  for (const QkvColumns& layout : kQkvLayouts)
    for (DType dtype : {DType::F64, DType::F32})
      for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
        SCOPED_TRACE(std::string(layout.name) + " " + dtype_name(dtype) +
                     (mode == RecurrenceMode::Chunk ? " chunk" : " naive"));
        const Result dense = run(in, s.heads, dtype, mode, 16, d_out, d_final);
        const Result strided = run_row_strided(in, s.heads, dtype, mode, 16, layout, d_out, d_final);
        for (const NamedPair& p : pairs_of(strided, dense))
          EXPECT_EQ(p.value->to_double_vector(), p.reference->to_double_vector()) << p.name;
      }
}

TEST(GlaRecurrence, ScalarDecaysWithRowStridedInputsGiveTheContiguousBits) {
  // The scalar-decay mode reads q, k and v (and writes their gradients) in place as the per-channel one does: the
  // same bits as from contiguous copies, g [B, T, H] (with dg) and [H] (a constant), both forms and dtypes.
  const Sizes s = with_time(kGeneralSizes, 70);
  Rng rng(16);
  Inputs in = make_inputs(rng, s, true);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const Tensor d_final = random_tensor(rng, in.s0.shape());
  const Tensor per_step = log_sigmoid_gate(rng, {s.batch, s.time, s.heads}, 1.0);
  Tensor per_head = Tensor::empty({s.heads}, DType::F64);
  for (int64_t h = 0; h < s.heads; ++h) per_head.set_item(h, -0.05 - 0.4 * static_cast<double>(h));
  for (const Tensor& g : {per_step, per_head}) {
    in.g = g;
    for (const QkvColumns& layout : kQkvLayouts)
      for (DType dtype : {DType::F64, DType::F32})
        for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
          SCOPED_TRACE(std::string(g.dim() == 1 ? "g [H] " : "g [B, T, H] ") + layout.name + " " +
                       dtype_name(dtype) + (mode == RecurrenceMode::Chunk ? " chunk" : " naive"));
          const Result dense = run(in, s.heads, dtype, mode, 16, d_out, d_final);
          const Result strided = run_row_strided(in, s.heads, dtype, mode, 16, layout, d_out, d_final);
          for (const NamedPair& p : pairs_of(strided, dense)) {
            ASSERT_EQ(p.value->defined(), p.reference->defined()) << p.name;
            if (!p.reference->defined()) continue;  // dg of a constant g
            EXPECT_EQ(p.value->to_double_vector(), p.reference->to_double_vector()) << p.name;
          }
          EXPECT_EQ(dense.dg.defined(), g.dim() != 1);
        }
  }
}

TEST(GlaRecurrence, OneRowStridedBlockAsQAndKGetsBothGradients) {
  // The same column block passed as q and k: its gradient is asked for twice, the second adding to the first. The
  // same bits as with one contiguous tensor passed twice; k's own columns stay without a gradient.
  const Sizes s = with_time(kGeneralSizes, 40);
  Rng rng(15);
  const Inputs in = make_inputs(rng, s, false);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const QkvBlocks blocks(kQkvLayouts[0], in.q.size(-1), in.v.size(-1));
  for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
    SCOPED_TRACE(mode == RecurrenceMode::Chunk ? "chunk" : "naive");
    Tape dense_tape;
    Var x = make_var(in.q.clone(), true, "x"), v = make_var(in.v.clone(), true, "v");
    GlaOutputs dense = gla_recurrence(dense_tape, x, x, v, make_var(in.g), nullptr, s.heads, 0.3, mode);
    dense_tape.backward(dense.output, d_out);

    Tape tape;
    Var parent = make_var(blocks.parents_of(in.q, in.k, in.v)[0], true, "qkv");
    const std::vector<Var> qkv = blocks.split(tape, {parent});
    GlaOutputs strided = gla_recurrence(tape, qkv[0], qkv[0], qkv[2], make_var(in.g), nullptr, s.heads, 0.3, mode);
    tape.backward(strided.output, d_out);
    EXPECT_EQ(strided.output->value.to_double_vector(), dense.output->value.to_double_vector());
    EXPECT_EQ(blocks.block({parent->grad}, 0).clone().to_double_vector(), x->grad.to_double_vector());
    EXPECT_EQ(blocks.block({parent->grad}, 2).clone().to_double_vector(), v->grad.to_double_vector());
    EXPECT_EQ(max_abs(blocks.block({parent->grad}, 1)), 0.0);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Finite-difference gradients (fp64).

struct GradcheckCase {
  Sizes sizes;
  int64_t chunk_size;
};

std::vector<Var> gradcheck_vars(const GradcheckCase& c, uint64_t seed) {
  Rng rng(seed);
  const Inputs in = make_inputs(rng, c.sizes, true);
  return {make_var(in.q, true, "q"), make_var(in.k, true, "k"), make_var(in.v, true, "v"), make_var(in.g, true, "g"),
          make_var(in.s0, true, "s0")};
}

GlaOutputs call(Tape& t, const std::vector<Var>& in, const GradcheckCase& c, RecurrenceMode mode) {
  return gla_recurrence(t, in[0], in[1], in[2], in[3], in[4], c.sizes.heads, 0.7, mode, c.chunk_size);
}

// L = <output, R_o> + <final_state, R_s>: both outputs feed the loss.
void expect_two_output_gradients_match(const GradcheckCase& c, RecurrenceMode mode, const std::vector<Var>& inputs,
                                       double h, double tol) {
  testing::expect_gradients_match_outputs(
      [&](Tape& tape, const std::vector<Var>& in) {
        GlaOutputs r = call(tape, in, c, mode);
        return std::vector<Var>{r.output, r.final_state};
      },
      inputs, 77, h, tol);
}

// Central differences with h = 1e-6 on O(1) functions of fp64: truncation ~h² and rounding ~1e-16/h ≈ 1e-10, so 1e-6
// (gradcheck.h's default) has a wide margin, while a wrong term in any gradient is O(1).
constexpr double kFdStep = 1e-6;
constexpr double kFdTolerance = 1e-6;

// B = 2, T = 7, H = 2, K = 3, V = 2, chunks of 3: two full chunks and a partial one of 1 row.
constexpr GradcheckCase kSmallCase{{2, 7, 2, 3, 2}, 3};
// T = 40 in chunks of 32: the first chunk has two sub-chunks of 16 (the reference-point blocks), the second is partial.
constexpr GradcheckCase kSubChunkCase{{1, 40, 1, 3, 2}, 32};

class Hgru2Gradients : public ::testing::TestWithParam<RecurrenceMode> {};

TEST_P(Hgru2Gradients, OutputGradientsMatchFiniteDifferences) {
  const RecurrenceMode mode = GetParam();
  testing::expect_gradients_match(
      [&](Tape& t, const std::vector<Var>& in) { return call(t, in, kSmallCase, mode).output; },
      gradcheck_vars(kSmallCase, 21), 1234, kFdStep, kFdTolerance);
}

TEST_P(Hgru2Gradients, FinalStateGradientsMatchFiniteDifferences) {
  // The output receives no gradient here, so this also covers an undefined output gradient.
  const RecurrenceMode mode = GetParam();
  testing::expect_gradients_match(
      [&](Tape& t, const std::vector<Var>& in) { return call(t, in, kSmallCase, mode).final_state; },
      gradcheck_vars(kSmallCase, 22), 1234, kFdStep, kFdTolerance);
}

TEST_P(Hgru2Gradients, LossOfOutputAndFinalStateMatchesFiniteDifferences) {
  expect_two_output_gradients_match(kSmallCase, GetParam(), gradcheck_vars(kSmallCase, 23), kFdStep, kFdTolerance);
}

TEST_P(Hgru2Gradients, SubChunkBlocksMatchFiniteDifferences) {
  expect_two_output_gradients_match(kSubChunkCase, GetParam(), gradcheck_vars(kSubChunkCase, 24), kFdStep,
                                    kFdTolerance);
}

TEST_P(Hgru2Gradients, RowStridedInputsMatchFiniteDifferences) {
  // q, k and v as column blocks of one parent (from column 3): the gradient is the parent's, 0 in the spare columns.
  const RecurrenceMode mode = GetParam();
  const GradcheckCase& c = kSmallCase;
  const QkvBlocks blocks(kQkvLayouts[1], c.sizes.heads * c.sizes.key_dim, c.sizes.heads * c.sizes.value_dim);
  const std::vector<Var> in = gradcheck_vars(c, 25);
  const std::vector<Tensor> parents = blocks.parents_of(in[0]->value, in[1]->value, in[2]->value);
  ASSERT_EQ(parents.size(), 1u);
  testing::expect_gradients_match_outputs(
      [&](Tape& tape, const std::vector<Var>& x) {
        const std::vector<Var> qkv = blocks.split(tape, {x[0]});
        GlaOutputs r = gla_recurrence(tape, qkv[0], qkv[1], qkv[2], x[1], x[2], c.sizes.heads, 0.7, mode,
                                      c.chunk_size);
        return std::vector<Var>{r.output, r.final_state};
      },
      {make_var(parents[0], true, "qkv"), in[3], in[4]}, 77, kFdStep, kFdTolerance);
}

INSTANTIATE_TEST_SUITE_P(Hgru2, Hgru2Gradients, ::testing::Values(RecurrenceMode::Naive, RecurrenceMode::Chunk),
                         [](const ::testing::TestParamInfo<RecurrenceMode>& info) {
                           return info.param == RecurrenceMode::Naive ? std::string("Naive") : std::string("Chunk");
                         });

TEST(GlaRecurrence, GradientsReachOnlyInputsThatWantThem) {
  // Only g wants a gradient (no initial state): the others stay without a gradient buffer, and dg still matches the
  // full-gradient run exactly (same kernel, same arithmetic).
  const Sizes s{1, 20, 2, 3, 4};
  Rng rng(31);
  const Inputs in = make_inputs(rng, s, false);
  const Tensor d_out = random_tensor(rng, in.v.shape());
  const Result full = run(in, s.heads, DType::F64, RecurrenceMode::Chunk, 0, d_out, Tensor());
  Tape tape;
  Var q = make_var(in.q.clone()), k = make_var(in.k.clone()), v = make_var(in.v.clone());
  Var g = make_var(in.g.clone(), true, "g");
  GlaOutputs r = gla_recurrence(tape, q, k, v, g, nullptr, s.heads, 0.3, RecurrenceMode::Chunk);
  tape.backward(r.output, d_out);
  EXPECT_FALSE(q->grad.defined());
  EXPECT_FALSE(k->grad.defined());
  EXPECT_FALSE(v->grad.defined());
  EXPECT_EQ(g->grad.to_double_vector(), full.dg.to_double_vector());
}

TEST(GlaRecurrence, NoTapeEntryWithoutGradients) {
  Tape tape;
  Rng rng(32);
  const Inputs in = make_inputs(rng, {1, 5, 1, 2, 2}, false);
  GlaOutputs r = gla_recurrence(tape, make_var(in.q), make_var(in.k), make_var(in.v), make_var(in.g), nullptr, 1,
                                    1.0, RecurrenceMode::Chunk);
  EXPECT_EQ(tape.size(), 0u);
  EXPECT_FALSE(r.output->requires_grad);
  EXPECT_EQ(r.output->value.shape(), (Shape{1, 5, 2}));
  EXPECT_EQ(r.final_state->value.shape(), (Shape{1, 1, 2, 2}));
}

// ---------------------------------------------------------------------------------------------------------------------
// Scalar decays: g [B, T, H] (one log decay per head and step) and [H] (one per head, RetNet's case) run the scalar
// mode, which must compute the per-channel mode's function on g broadcast over the key channels.

// g [B, T, H] or [H] broadcast to [B, T, H·K].
Tensor broadcast_to_channels(const Tensor& g, const Sizes& s) {
  Tensor full = Tensor::empty({s.batch, s.time, s.heads * s.key_dim}, DType::F64);
  const std::vector<double> values = g.to_double_vector();
  for (int64_t e = 0; e < full.numel(); ++e) {
    const int64_t row = e / (s.heads * s.key_dim), h = e / s.key_dim % s.heads;
    full.set_item(e, g.dim() == 1 ? values[h] : values[row * s.heads + h]);
  }
  return full;
}

// A per-channel dg [B, T, H·K] summed over each head's channels: the gradient of the scalar g it was broadcast from.
Tensor sum_over_channels(const Tensor& dg, const Sizes& s) {
  Tensor sum = Tensor::zeros({s.batch, s.time, s.heads}, DType::F64);
  const std::vector<double> values = dg.to_double_vector();
  std::vector<double> acc(static_cast<size_t>(sum.numel()), 0.0);
  for (size_t e = 0; e < values.size(); ++e) acc[e / static_cast<size_t>(s.key_dim)] += values[e];
  for (int64_t i = 0; i < sum.numel(); ++i) sum.set_item(i, acc[static_cast<size_t>(i)]);
  return sum;
}

// The per-head decays RetNet uses, log(1 − 2^(−5−h)), plus one strong decay.
Tensor per_head_decays(int64_t heads) {
  Tensor g = Tensor::empty({heads}, DType::F64);
  for (int64_t h = 0; h < heads; ++h)
    g.set_item(h, h == heads - 1 ? -2.0 : std::log(1.0 - std::pow(2.0, -5.0 - static_cast<double>(h))));
  return g;
}

TEST(GlaRecurrence, ScalarDecaysEqualTheBroadcastPerChannelGates) {
  // Odd K and V; lengths around the sub-chunk and the chunk, with partial chunks. The two modes differ only in the
  // order of fp64 roundings (a decay factored out of a channel sum, an exp of G_i − G_j instead of a product of step
  // decays or reference factors), so they agree to a few ulps of these O(1) values; a formula error is O(1).
  const double tol = 1e-12;
  for (int64_t time : {1, 15, 16, 63, 64, 65, 200}) {
    const Sizes s{2, time, 3, 5, 7};
    Rng rng(500 + time);
    Inputs in = make_inputs(rng, s, /*with_initial_state=*/true);
    const Tensor d_out = random_tensor(rng, in.v.shape()), d_final = random_tensor(rng, in.s0.shape());
    const Tensor per_step = log_sigmoid_gate(rng, {s.batch, s.time, s.heads}, 1.0);
    for (const Tensor& scalar_g : {per_step, per_head_decays(s.heads)}) {
      const bool constant = scalar_g.dim() == 1;
      for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
        for (int64_t chunk : {0, 16}) {
          const std::string context = "T=" + std::to_string(time) + (constant ? " g [H]" : " g [B, T, H]") +
                                      (mode == RecurrenceMode::Chunk ? " chunk=" + std::to_string(chunk) : " naive");
          Inputs scalar = in, channels = in;
          scalar.g = scalar_g;
          channels.g = broadcast_to_channels(scalar_g, s);
          if (constant) {  // a constant takes no gradient: run without one
            Result r[2];
            for (int which = 0; which < 2; ++which) {
              const Inputs& x = which == 0 ? scalar : channels;
              Tape tape;
              Var q = make_var(x.q.clone(), true, "q"), k = make_var(x.k.clone(), true, "k");
              Var v = make_var(x.v.clone(), true, "v"), s0 = make_var(x.s0.clone(), true, "s0");
              GlaOutputs out = gla_recurrence(tape, q, k, v, make_var(x.g.clone()), s0, s.heads, 0.3, mode, chunk);
              out.final_state->grad = d_final.clone();
              tape.backward(out.output, d_out);
              r[which] = {out.output->value, out.final_state->value, q->grad, k->grad, v->grad, Tensor(), s0->grad};
            }
            r[1].dg = r[0].dg = Tensor::zeros({1}, DType::F64);
            expect_results_match(r[0], r[1], tol, context);
          } else {
            const Result a = run(scalar, s.heads, DType::F64, mode, chunk, d_out, d_final);
            Result b = run(channels, s.heads, DType::F64, mode, chunk, d_out, d_final);
            b.dg = sum_over_channels(b.dg, s);
            expect_results_match(a, b, tol, context);
          }
        }
      }
    }
  }
}

TEST(GlaRecurrence, ScalarDecaysInFp32MatchTheFp64Reference) {
  // fla's gate regimes as one decay per head and step: fp32 against fp64 on the same rounded inputs, both forms (the
  // bound and its reasoning as in Hgru2GateRegimes).
  const Sizes s{2, 130, 2, 9, 11};
  for (const GateRegime& regime : kGateRegimes) {
    Rng rng(600);
    const Inputs in64 = make_inputs(rng, s, true, regime.make_gate(rng, {s.batch, s.time, s.heads}));
    const Tensor d_out = random_tensor(rng, in64.v.shape()), d_final = random_tensor(rng, in64.s0.shape());
    const Inputs in32 = rounded_to(in64, DType::F32);
    const Result reference = run(in32, s.heads, DType::F64, RecurrenceMode::Naive, 0, d_out, d_final);
    for (RecurrenceMode mode : {RecurrenceMode::Naive, RecurrenceMode::Chunk}) {
      const Result r32 = run(in32, s.heads, DType::F32, mode, 0, d_out, d_final);
      const std::string context = std::string(regime.name) + (mode == RecurrenceMode::Chunk ? " chunk" : " naive");
      for (const NamedPair& p : pairs_of(r32, reference)) {
        EXPECT_TRUE(all_finite(*p.value)) << p.name << ", " << context;
        EXPECT_LE(rms_rel_error(*p.value, *p.reference), kFp32Tolerance) << p.name << ", " << context;
      }
    }
  }
}

// Finite differences of the scalar mode: g [B, T, H] with its gradient, and g [H] as a constant (q, k, v, s0 only).
class ScalarDecayGradients : public ::testing::TestWithParam<RecurrenceMode> {};

std::vector<Var> scalar_gradcheck_vars(const GradcheckCase& c, uint64_t seed) {
  std::vector<Var> vars = gradcheck_vars(c, seed);
  Rng rng(seed + 1000);
  vars[3] = make_var(log_sigmoid_gate(rng, {c.sizes.batch, c.sizes.time, c.sizes.heads}, 1.0), true, "g");
  return vars;
}

TEST_P(ScalarDecayGradients, PerStepDecaysMatchFiniteDifferences) {
  for (const GradcheckCase& c : {kSmallCase, kSubChunkCase})
    expect_two_output_gradients_match(c, GetParam(), scalar_gradcheck_vars(c, 25), kFdStep, kFdTolerance);
}

TEST_P(ScalarDecayGradients, PerHeadDecaysMatchFiniteDifferences) {
  const RecurrenceMode mode = GetParam();
  for (const GradcheckCase& c : {kSmallCase, kSubChunkCase}) {
    std::vector<Var> vars = gradcheck_vars(c, 26);
    vars.erase(vars.begin() + 3);  // q, k, v, s0
    const Var decays = make_var(per_head_decays(c.sizes.heads));
    testing::expect_gradients_match_outputs(
        [&](Tape& tape, const std::vector<Var>& in) {
          GlaOutputs r =
              gla_recurrence(tape, in[0], in[1], in[2], decays, in[3], c.sizes.heads, 0.7, mode, c.chunk_size);
          return std::vector<Var>{r.output, r.final_state};
        },
        vars, 78, kFdStep, kFdTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(Scalar, ScalarDecayGradients,
                         ::testing::Values(RecurrenceMode::Naive, RecurrenceMode::Chunk),
                         [](const ::testing::TestParamInfo<RecurrenceMode>& info) {
                           return info.param == RecurrenceMode::Naive ? std::string("Naive") : std::string("Chunk");
                         });

TEST(GlaRecurrence, ScalarDecayRejections) {
  Tape tape;
  Rng rng(92);
  const Sizes s{1, 5, 3, 2, 2};
  const Inputs in = make_inputs(rng, s, false);
  // A constant takes no gradient.
  EXPECT_THROW(gla_recurrence(tape, make_var(in.q), make_var(in.k), make_var(in.v),
                              make_var(per_head_decays(s.heads), true, "g"), nullptr, s.heads, 0.3,
                              RecurrenceMode::Chunk),
               Error);
  // Neither [B, T, H] with another batch, length or head count.
  for (const Shape& shape : {Shape{2, 5, 3}, Shape{1, 4, 3}, Shape{1, 5, 2}, Shape{1, 5}, Shape{2}})
    EXPECT_THROW(gla_recurrence(tape, make_var(in.q), make_var(in.k), make_var(in.v),
                                make_var(Tensor::zeros(shape, DType::F64)), nullptr, s.heads, 0.3,
                                RecurrenceMode::Chunk),
                 Error)
        << shape_str(shape);
}

// ---------------------------------------------------------------------------------------------------------------------
// Shape and argument checks.

TEST(GlaRecurrence, RejectsBadShapes) {
  Tape tape;
  auto zeros = [](const Shape& shape, DType dtype = DType::F32) { return make_var(Tensor::zeros(shape, dtype)); };
  // B = 2, T = 5, H = 2, K = 3, V = 4.
  const Var q = zeros({2, 5, 6}), k = zeros({2, 5, 6}), v = zeros({2, 5, 8}), g = zeros({2, 5, 6});
  const Var s0 = zeros({2, 2, 3, 4});
  const auto mode = RecurrenceMode::Chunk;
  EXPECT_NO_THROW(gla_recurrence(tape, q, k, v, g, s0, 2, 1.0, mode));
  EXPECT_THROW(gla_recurrence(tape, zeros({2, 30}), k, v, g, s0, 2, 1.0, mode), Error);        // q not 3-D
  EXPECT_THROW(gla_recurrence(tape, q, zeros({2, 5, 4}), v, g, s0, 2, 1.0, mode), Error);     // k ≠ q
  EXPECT_THROW(gla_recurrence(tape, q, k, v, zeros({2, 4, 6}), s0, 2, 1.0, mode), Error);     // g ≠ q
  EXPECT_NO_THROW(gla_recurrence(tape, q, k, v, zeros({2}), s0, 2, 1.0, mode));                // g per head
  EXPECT_NO_THROW(gla_recurrence(tape, q, k, v, zeros({2, 5, 2}), s0, 2, 1.0, mode));          // per head and step
  EXPECT_THROW(gla_recurrence(tape, q, k, v, zeros({3}), s0, 2, 1.0, mode), Error);            // 3 decays, 2 heads
  EXPECT_THROW(gla_recurrence(tape, q, k, zeros({1, 5, 8}), g, s0, 2, 1.0, mode), Error);     // v's batch
  EXPECT_THROW(gla_recurrence(tape, q, k, zeros({2, 6, 8}), g, s0, 2, 1.0, mode), Error);     // v's time
  EXPECT_THROW(gla_recurrence(tape, q, k, zeros({2, 5, 7}), g, s0, 2, 1.0, mode), Error);     // H ∤ v's width
  EXPECT_THROW(gla_recurrence(tape, q, k, v, g, s0, 4, 1.0, mode), Error);                    // H ∤ q's width
  EXPECT_THROW(gla_recurrence(tape, q, k, v, g, s0, 0, 1.0, mode), Error);                    // no heads
  EXPECT_THROW(gla_recurrence(tape, q, k, v, g, zeros({2, 2, 4, 3}), 2, 1.0, mode), Error);   // state [K, V] swapped
  EXPECT_THROW(gla_recurrence(tape, q, k, v, g, zeros({1, 2, 3, 4}), 2, 1.0, mode), Error);   // state's batch
  EXPECT_THROW(gla_recurrence(tape, q, k, v, zeros({2, 5, 6}, DType::F64), s0, 2, 1.0, mode), Error);  // dtype mix
  EXPECT_THROW(gla_recurrence(tape, q, k, v, g, s0, 2, 1.0, mode, -1), Error);                // chunk_size < 0
  EXPECT_THROW(gla_recurrence(tape, zeros({2, 0, 6}), zeros({2, 0, 6}), zeros({2, 0, 8}), zeros({2, 0, 6}), s0, 2,
                                1.0, mode),
               Error);  // empty sequence
}

}  // namespace
}  // namespace hgrn
