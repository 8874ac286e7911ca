// test_hgru2_recurrence_cuda.cpp: the CUDA HGRU2 recurrence (kernels/gla_recurrence.cu) against the CPU chunk form
// in fp64, computed from the very values the GPU sees (q, k, v, dO rounded through the activation dtype; g, S0, dS_T
// through fp32): outputs and every gradient, for sequence lengths around the 64-step chunk (1, 15, 63, 64, 65, 200,
// 2047), key/value widths that are not multiples of the 64-wide tiles, with and without initial state and final-state
// gradient, fla's gate regimes and an extreme decay, in fp32 and bf16, scalar decays ([H], [B, T, H]: the kernels'
// scalar-decay mode) against the CPU reference's; q, k and v read row-strided (column blocks of wider tensors, as
// GLA's fused projection holds them), in both decay modes; plus accumulation into existing gradients, partial gradient
// requests, bitwise determinism, the state gradients' dtype, and the dependent launches' wait for the state pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "hgru2_test_support.h"
#include "ops/gla_recurrence.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/gla_recurrence.h"
#endif

namespace hgrn {
namespace {

using testing::compare;
using testing::max_abs;
using testing::QkvBlocks;
using testing::QkvColumns;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;
using testing::to_host_f64;

using Sizes = testing::Hgru2Shape;
using testing::kBf16;
using testing::kFp32;
using testing::Tol;

// fp64 host values of one problem; s0, d_out, d_final may be undefined (absent).
struct Problem {
  Tensor q, k, v, g, s0, d_out, d_final;
};

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// g = logsigmoid(u) / normalizer (fla's gate_logit_normalizer regimes), or with normalizer < 0 an extreme decay
// g ≈ −20 per step (−20 ± 1, never above 0).
Tensor make_gate(Rng& rng, const Shape& shape, double normalizer) {
  Tensor g = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double u = rng.normal();
    g.set_item(i, normalizer > 0 ? log_sigmoid(u) / normalizer : std::min(0.0, -20.0 + 0.5 * u));
  }
  return g;
}

Problem make_problem(Rng& rng, const Sizes& s, bool with_initial, bool with_d_out, bool with_d_final,
                     double normalizer = 1.0) {
  const Shape keys{s.batch, s.time, s.heads * s.key_dim}, values{s.batch, s.time, s.heads * s.value_dim};
  const Shape states{s.batch, s.heads, s.key_dim, s.value_dim};
  Problem p;
  p.q = random_tensor(rng, keys);
  p.k = random_tensor(rng, keys);
  p.v = random_tensor(rng, values);
  p.g = make_gate(rng, keys, normalizer);
  if (with_initial) p.s0 = random_tensor(rng, states);
  if (with_d_out) p.d_out = random_tensor(rng, values);
  if (with_d_final) p.d_final = random_tensor(rng, states);
  return p;
}

// The values a run with activation dtype `act` actually sees (q, k, v, dO in act; g, S0, dS_T in fp32), in fp64.
Problem rounded(const Problem& p, DType act) {
  auto r = [](const Tensor& t, DType dtype) { return t.defined() ? round_through(t, dtype) : Tensor(); };
  return {r(p.q, act), r(p.k, act), r(p.v, act), r(p.g, DType::F32), r(p.s0, DType::F32), r(p.d_out, act),
          r(p.d_final, DType::F32)};
}

struct Result {
  Tensor output, final_state, dq, dk, dv, dg, ds0;  // fp64 host copies (gradients undefined where none was asked)
};

// a and b hold the same bits in every result, undefined in both where no gradient was asked.
void expect_same_bits(const Result& a, const Result& b) {
  const Tensor* xs[] = {&a.output, &a.final_state, &a.dq, &a.dk, &a.dv, &a.dg, &a.ds0};
  const Tensor* ys[] = {&b.output, &b.final_state, &b.dq, &b.dk, &b.dv, &b.dg, &b.ds0};
  for (int i = 0; i < 7; ++i) {
    ASSERT_EQ(xs[i]->defined(), ys[i]->defined()) << "result " << i;
    if (!xs[i]->defined()) continue;
    ASSERT_EQ(xs[i]->numel(), ys[i]->numel()) << "result " << i;
    EXPECT_EQ(std::memcmp(xs[i]->raw_data(), ys[i]->raw_data(), xs[i]->nbytes()), 0) << "result " << i;
  }
}

// Which inputs ask for a gradient.
struct Wants {
  bool q = true, k = true, v = true, g = true, s0 = true;
};

// Runs the op with inputs on `device` (CUDA: q, k, v, dO in act, the rest fp32; CPU: everything fp64, chunk form with
// 64-step chunks, the reference) and backpropagates L = <output, dO> + <final_state, dS_T>. columns: q, k and v are
// column blocks of wider tensors laid out so (split_columns, as a fused projection's output), read and given their
// gradients in place (all three or none of them want one); their existing gradients (initial_grads) then lie in
// kExistingGradientColumns, whose strides differ from every layout's below.
// keep_states: the forward's per-chunk states are kept for the backward instead of recomputed there.
const QkvColumns kExistingGradientColumns{"existing gradients", false, {5, 1, 0}, {0, 3, 7}};
Result run(const Problem& p, int64_t heads, Device device, DType act, double scale, const Wants& wants = {},
           const Problem* initial_grads = nullptr, RecurrenceMode mode = RecurrenceMode::Chunk,
           const QkvColumns* columns = nullptr, bool keep_states = false) {
  const bool gpu = device == Device::CUDA;
  auto put = [&](const Tensor& t, DType dtype) { return gpu ? to_gpu(t, dtype) : t.clone(); };
  const DType act_dtype = gpu ? act : DType::F64, f32 = gpu ? DType::F32 : DType::F64;
  Tape tape;
  Var q, k, v;
  std::vector<Var> parents;
  const QkvBlocks blocks(columns ? *columns : QkvColumns{}, p.q.size(-1), p.v.size(-1));
  if (columns) {
    EXPECT_TRUE(wants.q == wants.k && wants.k == wants.v) << "column blocks of one parent want gradients alike";
    for (const Tensor& parent : blocks.parents_of(p.q, p.k, p.v))
      parents.push_back(make_var(put(parent, act_dtype), wants.q, "qkv"));
    const std::vector<Var> qkv = blocks.split(tape, parents);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = make_var(put(p.q, act_dtype), wants.q, "q");
    k = make_var(put(p.k, act_dtype), wants.k, "k");
    v = make_var(put(p.v, act_dtype), wants.v, "v");
  }
  Var g = make_var(put(p.g, f32), wants.g, "g");
  Var s0 = p.s0.defined() ? make_var(put(p.s0, f32), wants.s0, "s0") : nullptr;
  if (initial_grads) {  // gradients already there: the backward must add to them
    if (columns) {  // column blocks too, in tensors of their own
      const QkvBlocks elsewhere(kExistingGradientColumns, p.q.size(-1), p.v.size(-1));
      std::vector<Tensor> grads;
      for (const Tensor& parent : elsewhere.parents_of(initial_grads->q, initial_grads->k, initial_grads->v))
        grads.push_back(put(parent, act_dtype));
      q->grad = elsewhere.block(grads, 0);
      k->grad = elsewhere.block(grads, 1);
      v->grad = elsewhere.block(grads, 2);
    } else {
      q->grad = put(initial_grads->q, act_dtype);
      k->grad = put(initial_grads->k, act_dtype);
      v->grad = put(initial_grads->v, act_dtype);
    }
    g->grad = put(initial_grads->g, f32);
    if (s0) s0->grad = put(initial_grads->s0, f32);
  }
  GlaOutputs r = gla_recurrence(tape, q, k, v, g, s0, heads, scale, mode, gpu ? 0 : 64, nullptr, keep_states);
  if (r.output->requires_grad) {
    if (p.d_out.defined()) {
      if (p.d_final.defined()) r.final_state->grad = put(p.d_final, f32);
      tape.backward(r.output, put(p.d_out, act_dtype));
    } else if (p.d_final.defined()) {
      tape.backward(r.final_state, put(p.d_final, f32));
    }
  }
  auto grad = [](const Var& x) { return x && x->grad.defined() ? to_host_f64(x->grad) : Tensor(); };
  if (columns && wants.q && parents[0]->grad.defined()) {
    // q's, k's and v's gradients ended in the parents'; the spare columns got none.
    std::vector<Tensor> grads;
    for (const Var& parent : parents) grads.push_back(grad(parent));
    blocks.expect_zero_outside_blocks(grads);
    q->grad = blocks.block(grads, 0).clone();
    k->grad = blocks.block(grads, 1).clone();
    v->grad = blocks.block(grads, 2).clone();
  }
  return {to_host_f64(r.output->value), to_host_f64(r.final_state->value), grad(q), grad(k), grad(v), grad(g),
          grad(s0)};
}


void expect_matches(const Result& got, const Result& want, Tol tol, const std::string& context,
                    const Tol* dg_tol = nullptr) {
  struct Pair {
    const char* name;
    const Tensor &got, &want;
  };
  const Pair pairs[] = {{"output", got.output, want.output}, {"final_state", got.final_state, want.final_state},
                        {"dq", got.dq, want.dq},             {"dk", got.dk, want.dk},
                        {"dv", got.dv, want.dv},             {"dg", got.dg, want.dg},
                        {"ds0", got.ds0, want.ds0}};
  for (const Pair& p : pairs) {
    ASSERT_EQ(p.got.defined(), p.want.defined()) << p.name << ", " << context;
    if (!p.want.defined()) continue;
    const Tol t = (dg_tol && std::string(p.name) == "dg") ? *dg_tol : tol;
    const double scale = std::max(max_abs(p.want), 1e-30);
    const testing::Discrepancy d =
        testing::expect_close(p.got, p.want, t.rel_rms, t.max_rel * scale, std::string(p.name) + ", " + context);
    if (std::getenv("HGRN_TEST_VERBOSE"))
      std::printf("  %-11s rel_rms %.2e  max_abs/max|ref| %.2e  (%s)\n", p.name, d.rel_rms, d.max_abs / scale,
                  context.c_str());
  }
}

// fp32 dg under strong decay: dg is made of decayed terms only, whose factors 2^{G_i − G_j} come from differences of
// fp32 cumsums reaching |G| ~ 500 (c = 0.1) or ~1300 (g ≈ −20) within a chunk; their rounding (~|G|·6e-8 in the
// exponent) is a relative error of the same size, which fla's kernel shares. Measured 1.1e-5 and 2.4e-5 rel RMS.
constexpr Tol kFp32StrongDecayDg{1e-4, 2e-4};

// bf16 dg of one step under strong decay: dg is then the initial state's share alone, e^g (~1e-3 at c = 0.1) times
// O(1) terms, but the kernels form it as the difference of O(10) sums (q·dq − k·dk plus the final state's term) whose
// TF32 products err by ~2^-11 of their size. Measured (scalar decays, K = 13, V = 21): 4.9e-2 rel RMS, max 5.4% of
// max|dg|; with 65 steps or more the chunk's own terms dominate dg and kBf16 holds.
constexpr Tol kBf16StrongDecaySingleStepDg{0.1, 0.1};

Tol tol_for(DType act) { return act == DType::F32 ? kFp32 : kBf16; }

// The GPU's run of p (activations in act) against the fp64 CPU reference on the same inputs rounded to act.
void expect_gpu_matches_cpu(const Problem& p, int64_t heads, DType act, double scale, const std::string& context,
                            const Tol* dg_tol = nullptr) {
  const Result got = run(p, heads, Device::CUDA, act, scale);
  const Result want = run(rounded(p, act), heads, Device::CPU, DType::F64, scale);
  expect_matches(got, want, tol_for(act), context, dg_tol);
}

// a + b, element by element (host tensors of one shape).
Tensor plus(const Tensor& a, const Tensor& b) {
  Tensor r = a.clone();
  for (int64_t i = 0; i < r.numel(); ++i) r.set_item(i, a.item(i) + b.item(i));
  return r;
}

// The GPU's backward onto existing gradients (before's q, k, v, g and s0 as their old values, fp32 for g and s0)
// against the CPU reference's gradients plus those old values as the GPU holds them: the backward adds (+=).
void expect_accumulates_onto(const Problem& p, const Problem& before, int64_t heads, DType act, Tol tol,
                             const std::string& context, const QkvColumns* columns = nullptr) {
  const Result want = run(rounded(p, act), heads, Device::CPU, DType::F64, 0.3);
  const Result got = run(p, heads, Device::CUDA, act, 0.3, Wants{}, &before, RecurrenceMode::Chunk, columns);
  const Problem old = rounded(before, act);
  Result want_sum = want;
  want_sum.dq = plus(want.dq, old.q);
  want_sum.dk = plus(want.dk, old.k);
  want_sum.dv = plus(want.dv, old.v);
  want_sum.dg = plus(want.dg, round_through(before.g, DType::F32));
  want_sum.ds0 = plus(want.ds0, old.s0);
  expect_matches(got, want_sum, tol, context);
}

// ---------------------------------------------------------------------------------------------------------------------

TEST(GlaRecurrenceCuda, MatchesCpuReferenceAcrossShapes) {
  HGRN_SKIP_WITHOUT_GPU();
  // Lengths around the chunk (1, below a sub-chunk, partial, exact, one over) and several chunks; K, V below, at and
  // above the 64-wide tile (16, 60, 128, 200 with a partial last tile; 32, 40, 96, 128); B·H > 1 throughout.
  // B·H = 300 with one K- and one V-tile: 300 state-pass blocks, one wave at three blocks per SM but two at two on
  // GPUs of 100-149 SMs (H100, H200: 132; A100: 108), so there the bf16 state pass runs its three-block build.
  // B·H = 120 with two K- and two V-tiles (the second partial): 480 blocks, two waves at two or three per SM on 132
  // SMs but one at two V-tiles per block, so there the bf16 state pass runs its V-tile-pair build.
  const std::vector<Sizes> shapes{{2, 1, 2, 16, 32},      {2, 15, 2, 16, 32},     {2, 63, 2, 16, 32},
                                  {2, 64, 2, 16, 32},     {2, 65, 2, 16, 32},     {1, 200, 3, 60, 40},
                                  {1, 130, 2, 200, 96},   {1, 2047, 2, 128, 128}, {3, 65, 100, 64, 64},
                                  {2, 70, 60, 128, 120}};
  const double scale = 0.25;
  int variant = 0;
  for (const Sizes& s : shapes) {
    for (DType act : {DType::F32, DType::BF16}) {
      // Alternate the initial state and which output gradients flow in, so every combination occurs.
      const bool with_initial = variant % 2 == 0;
      const bool with_d_out = variant % 3 != 2, with_d_final = variant % 3 != 1;
      ++variant;
      const std::string context = s.str() + " " + dtype_name(act) + " S0=" + std::to_string(with_initial) +
                                  " dO=" + std::to_string(with_d_out) + " dS_T=" + std::to_string(with_d_final);
      SCOPED_TRACE(context);
      Rng rng(1000 + variant);
      const Problem p = make_problem(rng, s, with_initial, with_d_out, with_d_final);
      expect_gpu_matches_cpu(p, s.heads, act, scale, context);
    }
  }
}

// Layouts of q, k and v as column blocks of wider tensors, read in place: GLA's (side by side, more columns after;
// rows of whole 16 bytes, for cp.async, where H·K and H·V are multiples of 8), the same from column 3 (no row
// aligned), and one parent each, whose strides all differ (an input read, or a gradient written, with another's
// stride shows), q's and k's rows aligned, v's not; and one parent each at column 0 with odd strides (the first
// row aligned, the next not: only the stride rules cp.async out).
const QkvColumns kQkvLayouts[] = {
    {"side by side", true, {0, 0, 0}, {0, 0, 8}},
    {"side by side from column 3", true, {3, 0, 0}, {0, 0, 5}},
    {"one parent each", false, {8, 0, 3}, {8, 8, 5}},
    {"one parent each, odd strides", false, {0, 0, 0}, {1, 3, 5}},
};

// q, k and v as column blocks (kQkvLayouts) against the CPU reading the same layout: odd lengths (a single step,
// partial chunks), K and V not multiples of the 64-wide tiles (K = 200: four K-tiles, the last partial), several
// heads.
TEST(GlaRecurrenceCuda, RowStridedInputsMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<Sizes> shapes{{2, 1, 2, 16, 32},  {2, 65, 2, 16, 32},   {1, 200, 3, 60, 40},
                                  {3, 97, 5, 36, 52}, {1, 130, 2, 200, 96}, {2, 130, 4, 128, 128}};
  int variant = 0;
  for (const Sizes& s : shapes) {
    for (DType act : {DType::F32, DType::BF16}) {
      for (const QkvColumns& layout : kQkvLayouts) {
        const std::string context = s.str() + " " + dtype_name(act) + " q, k, v " + layout.name;
        SCOPED_TRACE(context);
        Rng rng(3000 + variant++);
        const Problem p = make_problem(rng, s, variant % 2 == 0, true, variant % 3 == 0);
        const Result got = run(p, s.heads, Device::CUDA, act, 0.25, {}, nullptr, RecurrenceMode::Chunk, &layout);
        const Result want = run(rounded(p, act), s.heads, Device::CPU, DType::F64, 0.25, {}, nullptr,
                                RecurrenceMode::Chunk, &layout);
        expect_matches(got, want, tol_for(act), context);
      }
    }
  }
}

// Gradients of column blocks that exist already, themselves column blocks of other tensors (kExistingGradientColumns):
// the backward adds to them in place, reading and writing them at their own strides, not the inputs'.
TEST(GlaRecurrenceCuda, RowStridedInputsAccumulateIntoExistingGradients) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 100, 3, 60, 40};
  for (DType act : {DType::F32, DType::BF16}) {
    for (const QkvColumns& layout : kQkvLayouts) {
      const std::string context = std::string(dtype_name(act)) + " q, k, v " + layout.name;
      SCOPED_TRACE(context);
      Rng rng(3500);
      const Problem p = make_problem(rng, s, true, true, true);
      Problem before = make_problem(rng, s, true, false, false);
      before.g = random_tensor(rng, p.g.shape());
      expect_accumulates_onto(p, before, s.heads, act, tol_for(act), context, &layout);
    }
  }
}

// One column block passed as q and k, and as q, k and v (K = V), as the CPU form allows: its gradient is the sum of
// theirs (against the CPU reference run with distinct tensors of the same values), k's and v's own columns get none.
// The kernels write each gradient once, so the repeats take scratch of their own, added in afterwards.
TEST(GlaRecurrenceCuda, OneBlockAsSeveralInputsGetsTheirGradientsSummed) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 100, 3, 40, 40};
  for (DType act : {DType::F32, DType::BF16}) {
    for (bool as_v : {false, true}) {
      const std::string context = std::string(dtype_name(act)) + (as_v ? " one block as q, k and v" : " as q and k");
      SCOPED_TRACE(context);
      Rng rng(3600);
      Problem p = make_problem(rng, s, true, true, true);
      p.k = p.q;
      if (as_v) p.v = p.q;
      Result want = run(rounded(p, act), s.heads, Device::CPU, DType::F64, 0.3);
      want.dq = plus(want.dq, want.dk);
      want.dk = Tensor();
      if (as_v) want.dq = plus(want.dq, want.dv), want.dv = Tensor();

      const QkvBlocks blocks(kQkvLayouts[0], p.q.size(-1), p.v.size(-1));
      Tape tape;
      Var parent = make_var(to_gpu(blocks.parents_of(p.q, p.k, p.v)[0], act), true, "qkv");
      const std::vector<Var> qkv = blocks.split(tape, {parent});
      Var g = make_var(to_gpu(p.g, DType::F32), true, "g");
      Var s0 = make_var(to_gpu(p.s0, DType::F32), true, "s0");
      GlaOutputs r = gla_recurrence(tape, qkv[0], qkv[0], as_v ? qkv[0] : qkv[2], g, s0, s.heads, 0.3,
                                    RecurrenceMode::Chunk);
      r.final_state->grad = to_gpu(p.d_final, DType::F32);
      tape.backward(r.output, to_gpu(p.d_out, act));
      ASSERT_TRUE(parent->grad.defined());
      const std::vector<Tensor> grads{to_host_f64(parent->grad)};
      const Result got{to_host_f64(r.output->value),
                       to_host_f64(r.final_state->value),
                       blocks.block(grads, 0).clone(),
                       Tensor(),
                       as_v ? Tensor() : blocks.block(grads, 2).clone(),
                       to_host_f64(g->grad),
                       to_host_f64(s0->grad)};
      expect_matches(got, want, tol_for(act), context);
      EXPECT_EQ(max_abs(blocks.block(grads, 1)), 0.0) << "k's own columns";
      if (as_v) EXPECT_EQ(max_abs(blocks.block(grads, 2)), 0.0) << "v's own columns";
    }
  }
}

TEST(GlaRecurrenceCuda, GateRegimes) {
  HGRN_SKIP_WITHOUT_GPU();
  // fla's gate_logit_normalizer regimes: c = 0.1 (g ≈ −7 per step: strong decay), 1, 10 (g ≈ −0.07: long memory).
  const Sizes s{2, 200, 2, 60, 40};
  for (double c : {0.1, 1.0, 10.0}) {
    for (DType act : {DType::F32, DType::BF16}) {
      const std::string context = "c=" + std::to_string(c) + " " + dtype_name(act);
      SCOPED_TRACE(context);
      Rng rng(2000 + static_cast<uint64_t>(c * 10));
      const Problem p = make_problem(rng, s, true, true, true, c);
      const bool strong_fp32 = act == DType::F32 && c < 1;
      expect_gpu_matches_cpu(p, s.heads, act, 0.3, context, strong_fp32 ? &kFp32StrongDecayDg : nullptr);
    }
  }
}

// RetNet's constant decay per head (g [H], log(1 − 2^(−5−h)) as fla's chunk_retention): the kernels' scalar-decay
// mode (g read as [H]) against the CPU reference's on the same [H] decays. No gradient for g (a constant). Odd K and V,
// lengths around the chunk, K over several 64-wide tiles (200: a partial fourth) and RetNet's own head sizes.
// Tolerances: the per-channel ones (tol_for): the scalar mode's products are no less exact (bf16: q kᵀ in bf16 with
// fp32 sums, W k and Wᵀ q in TF32 as the per-channel intra blocks).
TEST(GlaRecurrenceCuda, PerHeadDecaysMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<Sizes> shapes{{2, 1, 3, 16, 32},  {2, 15, 3, 13, 21},  {2, 63, 2, 7, 9},      {2, 64, 5, 33, 65},
                                  {2, 65, 4, 32, 64}, {1, 200, 5, 60, 40}, {1, 130, 2, 200, 72}, {1, 300, 8, 128, 256}};
  int variant = 0;
  for (const Sizes& s : shapes) {
    for (DType act : {DType::F32, DType::BF16}) {
      const std::string context = s.str() + " " + dtype_name(act) + " per-head decays";
      SCOPED_TRACE(context);
      Rng rng(4000 + variant++);
      Problem p = make_problem(rng, s, variant % 2 == 0, true, true);
      p.g = Tensor::empty({s.heads}, DType::F64);
      for (int64_t h = 0; h < s.heads; ++h) p.g.set_item(h, std::log(1.0 - std::pow(2.0, -5.0 - static_cast<double>(h))));
      Wants wants;
      wants.g = false;
      const Result got = run(p, s.heads, Device::CUDA, act, 1.0 / std::sqrt(static_cast<double>(s.key_dim)), wants);
      const Result want =
          run(rounded(p, act), s.heads, Device::CPU, DType::F64, 1.0 / std::sqrt(static_cast<double>(s.key_dim)), wants);
      expect_matches(got, want, tol_for(act), context);
    }
  }
}

// One log decay per head and step (g [B, T, H]): the kernels' scalar-decay mode (dg summed over each K-tile's channels
// in bwd_dqk, then over the K-tiles where K > 64) against the CPU reference's; fla's gate regimes, odd K and V, K of
// one, two and four (a partial) 64-wide tiles, fp32 and bf16 (tolerances as PerHeadDecaysMatchCpuReference); then the
// gradient added to an existing one and asked for alone, with one K-tile and with two; then kept states and two runs
// give the same bits.
TEST(GlaRecurrenceCuda, PerStepScalarDecaysMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<Sizes> shapes{{2, 1, 3, 13, 21},    {2, 65, 2, 7, 9},      {1, 200, 5, 60, 40},
                                  {2, 130, 4, 128, 128}, {1, 130, 2, 200, 96}, {2, 64, 3, 64, 64}};
  int variant = 0;
  for (const Sizes& s : shapes) {
    for (double c : {0.1, 1.0, 10.0}) {
      for (DType act : {DType::F32, DType::BF16}) {
        const std::string context = s.str() + " c=" + std::to_string(c) + " " + dtype_name(act) + " g [B, T, H]";
        SCOPED_TRACE(context);
        Rng rng(5000 + variant++);
        Problem p = make_problem(rng, s, variant % 2 == 0, true, variant % 3 != 0);
        p.g = make_gate(rng, {s.batch, s.time, s.heads}, c);
        const bool strong_fp32 = act == DType::F32 && c < 1;
        const bool strong_bf16_single_step = act == DType::BF16 && c < 1 && s.time == 1;
        expect_gpu_matches_cpu(p, s.heads, act, 0.3, context,
                               strong_fp32               ? &kFp32StrongDecayDg
                               : strong_bf16_single_step ? &kBf16StrongDecaySingleStepDg
                                                         : nullptr);
      }
    }
  }
  for (int64_t key : {33, 100}) {  // one K-tile (dg written by bwd_dqk) and two (summed after it)
    SCOPED_TRACE("K=" + std::to_string(key));
    const Sizes s{2, 100, 3, key, 20};
    Rng rng(5100 + key);
    Problem p = make_problem(rng, s, true, true, true);
    p.g = make_gate(rng, {s.batch, s.time, s.heads}, 1.0);
    const Result want = run(rounded(p, DType::F32), s.heads, Device::CPU, DType::F64, 0.3);
    Problem before = make_problem(rng, s, true, false, false);
    before.g = random_tensor(rng, p.g.shape());
    const Result got = run(p, s.heads, Device::CUDA, DType::F32, 0.3, Wants{}, &before);
    Tensor want_dg = want.dg.clone();
    const Tensor before_dg = round_through(before.g, DType::F32);
    for (int64_t i = 0; i < want_dg.numel(); ++i) want_dg.set_item(i, want.dg.item(i) + before_dg.item(i));
    testing::expect_close(got.dg, want_dg, kFp32.rel_rms, kFp32.max_rel * max_abs(want_dg), "dg added to another");
    const Result alone = run(p, s.heads, Device::CUDA, DType::F32, 0.3, Wants{false, false, false, true, false});
    EXPECT_FALSE(alone.dq.defined() || alone.dk.defined() || alone.dv.defined() || alone.ds0.defined());
    testing::expect_close(alone.dg, want.dg, kFp32.rel_rms, kFp32.max_rel * max_abs(want.dg), "dg alone");
  }
  // Fixed-order sums and the forward's own state pass: kept or recomputed states, and a second run, give the same bits.
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string("bits ") + dtype_name(act));
    const Sizes s{2, 130, 2, 100, 72};
    Rng rng(5200);
    Problem p = make_problem(rng, s, true, true, true);
    p.g = make_gate(rng, {s.batch, s.time, s.heads}, 1.0);
    const Result a = run(p, s.heads, Device::CUDA, act, 0.3);
    const Result b = run(p, s.heads, Device::CUDA, act, 0.3, Wants{}, nullptr, RecurrenceMode::Chunk, nullptr, true);
    const Result c = run(p, s.heads, Device::CUDA, act, 0.3);
    for (const Result* other : {&b, &c}) {
      expect_same_bits(a, *other);
    }
  }
}

// The scalar-decay mode with q, k and v as column blocks (kQkvLayouts), against the CPU reading the same layout: g
// [B, T, H] (with dg; K of one tile and of four, the last partial) and [H] (a constant), fp32 and bf16; then g
// [B, T, H]'s run adding into existing gradients that are column blocks of other tensors (kExistingGradientColumns).
// The kernels' scalar paths read q and k, and write dq, dk and dv, at the strides the per-channel paths use.
TEST(GlaRecurrenceCuda, RowStridedInputsWithScalarDecaysMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<Sizes> shapes{{2, 65, 2, 16, 32}, {3, 97, 5, 36, 52}, {1, 130, 2, 200, 96}};
  int variant = 0;
  for (const Sizes& s : shapes) {
    for (bool per_head : {false, true}) {
      for (DType act : {DType::F32, DType::BF16}) {
        for (const QkvColumns& layout : kQkvLayouts) {
          const std::string context = s.str() + " " + dtype_name(act) + (per_head ? " g [H]" : " g [B, T, H]") +
                                      " q, k, v " + layout.name;
          SCOPED_TRACE(context);
          Rng rng(5300 + variant++);
          Problem p = make_problem(rng, s, variant % 2 == 0, true, variant % 3 != 0);
          Wants wants;
          if (per_head) {
            p.g = Tensor::empty({s.heads}, DType::F64);
            for (int64_t h = 0; h < s.heads; ++h) p.g.set_item(h, -0.05 - 0.3 * static_cast<double>(h));
            wants.g = false;
          } else {
            p.g = make_gate(rng, {s.batch, s.time, s.heads}, 1.0);
          }
          const Result got = run(p, s.heads, Device::CUDA, act, 0.25, wants, nullptr, RecurrenceMode::Chunk, &layout);
          const Result want = run(rounded(p, act), s.heads, Device::CPU, DType::F64, 0.25, wants, nullptr,
                                  RecurrenceMode::Chunk, &layout);
          expect_matches(got, want, tol_for(act), context);
        }
      }
    }
  }
  const Sizes s{2, 100, 3, 60, 40};
  for (DType act : {DType::F32, DType::BF16}) {
    for (const QkvColumns& layout : kQkvLayouts) {
      const std::string context = std::string(dtype_name(act)) + " g [B, T, H], existing gradients, " + layout.name;
      SCOPED_TRACE(context);
      Rng rng(5400);
      Problem p = make_problem(rng, s, true, true, true);
      p.g = make_gate(rng, {s.batch, s.time, s.heads}, 1.0);
      Problem before = make_problem(rng, s, true, false, false);
      before.g = random_tensor(rng, p.g.shape());
      expect_accumulates_onto(p, before, s.heads, act, tol_for(act), context, &layout);
    }
  }
}

TEST(GlaRecurrenceCuda, DependentKernelsWaitForTheStatePass) {
  HGRN_SKIP_WITHOUT_GPU();
  // On Hopper, fwd_output and bwd_dv launch as programmatic dependents of the state pass before them and do their
  // state-free work before waiting for it. One sequence of 128 chunks: the pass walks them one after another (hundreds
  // of microseconds), while the dependents' 128 blocks reach the states within a few: a read before the pass has
  // written them would take the allocator's leftovers (NaN under HGRN_POISON_CUDA_ALLOC) instead. Long memory (c = 10)
  // and an initial state, so that every chunk's state matters to its output.
  const Sizes s{1, 8192, 1, 64, 64};
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    Rng rng(3100);
    const Problem p = make_problem(rng, s, true, true, true, 10.0);
    expect_gpu_matches_cpu(p, s.heads, act, 0.25, std::string("128 chunks ") + dtype_name(act));
  }
}

TEST(GlaRecurrenceCuda, ExtremeDecayStaysFiniteAndAccurate) {
  HGRN_SKIP_WITHOUT_GPU();
  // g ≈ −20 per step: every decay over more than one step underflows, cumulative gates reach ~−1300 within a chunk.
  // No NaN/Inf may appear (expect_close fails on any). The outputs and dq, dk, dv are dominated by the undecayed
  // diagonal terms and keep the usual tolerances; dg (only decayed terms, ~e^−20 relative to the rest) gets
  // kFp32StrongDecayDg in fp32.
  const Sizes s{2, 130, 2, 60, 40};
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    Rng rng(3000);
    const Problem p = make_problem(rng, s, true, true, true, /*normalizer=*/-1);
    const Tol dg_tol = act == DType::F32 ? kFp32StrongDecayDg : kBf16;
    expect_gpu_matches_cpu(p, s.heads, act, 0.3, std::string("extreme decay ") + dtype_name(act), &dg_tol);
  }
}

TEST(GlaRecurrenceCuda, AccumulatesIntoExistingGradientsAndHonoursRequests) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 100, 2, 60, 40};
  const DType act = DType::F32;
  Rng rng(4000);
  const Problem p = make_problem(rng, s, true, true, true);
  // Existing gradients: the backward adds to them (+=), as every hgrn backward does.
  Problem before = make_problem(rng, s, true, false, false);
  before.g = random_tensor(rng, p.g.shape());
  expect_accumulates_onto(p, before, s.heads, act, kFp32, "accumulation");

  // Only some inputs want a gradient: the others get none, and the wanted ones are unchanged.
  const Result want = run(rounded(p, act), s.heads, Device::CPU, DType::F64, 0.3);
  for (const Wants& w : {Wants{false, false, true, false, false}, Wants{false, false, false, true, false},
                         Wants{true, false, false, false, true}, Wants{false, false, false, false, true}}) {
    const Result part = run(p, s.heads, Device::CUDA, act, 0.3, w);
    EXPECT_EQ(part.dq.defined(), w.q);
    EXPECT_EQ(part.dk.defined(), w.k);
    EXPECT_EQ(part.dv.defined(), w.v);
    EXPECT_EQ(part.dg.defined(), w.g);
    EXPECT_EQ(part.ds0.defined(), w.s0);
    if (w.q) testing::expect_close(part.dq, want.dq, kFp32.rel_rms, kFp32.max_rel * max_abs(want.dq), "dq alone");
    if (w.v) testing::expect_close(part.dv, want.dv, kFp32.rel_rms, kFp32.max_rel * max_abs(want.dv), "dv alone");
    if (w.g) testing::expect_close(part.dg, want.dg, kFp32.rel_rms, kFp32.max_rel * max_abs(want.dg), "dg alone");
    if (w.s0)
      testing::expect_close(part.ds0, want.ds0, kFp32.rel_rms, kFp32.max_rel * max_abs(want.ds0), "ds0 alone");
  }
}

TEST(GlaRecurrenceCuda, BitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  // No atomics and fixed-order sums: two runs give the same bits; the naive mode runs the same kernels on the GPU.
  const Sizes s{2, 300, 2, 128, 128};
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    Rng rng(5000);
    const Problem p = make_problem(rng, s, true, true, true);
    const Result a = run(p, s.heads, Device::CUDA, act, 0.3);
    const Result b = run(p, s.heads, Device::CUDA, act, 0.3);
    const Result c = run(p, s.heads, Device::CUDA, act, 0.3, Wants{}, nullptr, RecurrenceMode::Naive);
    for (const Result* other : {&b, &c}) {
      expect_same_bits(a, *other);
    }
  }
}

TEST(GlaRecurrenceCuda, KeptStatesGiveTheRecomputedBits) {
  HGRN_SKIP_WITHOUT_GPU();
  // The backward either recomputes the per-chunk states with the forward's own state pass or reads the forward's
  // (keep_states): the same bits by construction, so every result must match bit for bit. Odd shapes: a partial last
  // chunk, a single step, K and V not multiples of 64; and with only v asking for a gradient (no states read).
  const Sizes shapes[] = {{2, 300, 2, 128, 128}, {1, 1, 3, 40, 24}, {3, 130, 1, 72, 136}};
  for (DType act : {DType::F32, DType::BF16})
    for (const Sizes& s : shapes)
      for (bool only_v : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(act)) + " T=" + std::to_string(s.time) + (only_v ? " only v" : ""));
        Rng rng(5100 + s.time);
        const Problem p = make_problem(rng, s, true, true, true);
        Wants wants;
        if (only_v) wants = Wants{false, false, true, false, false};
        const Result recomputed = run(p, s.heads, Device::CUDA, act, 0.3, wants);
        const Result kept =
            run(p, s.heads, Device::CUDA, act, 0.3, wants, nullptr, RecurrenceMode::Chunk, nullptr, true);
        expect_same_bits(recomputed, kept);
        EXPECT_TRUE(kept.dv.defined());
        EXPECT_EQ(kept.dq.defined(), !only_v);
      }
}

// Where no gradient of g is formed, the state gradients dS_e are stored in the activation dtype
// (gla_cuda_state_gradients_dtype): every product reads them rounded to it, so dq, dk, dv and dS0 keep the bits of
// the fp32 dS_e that a run forming dg uses. Per-channel and per-step scalar gates, odd shapes (a partial last chunk,
// K and V not multiples of 64), bf16 (fp32 activations keep fp32 state gradients: nothing to compare).
TEST(GlaRecurrenceCuda, StateGradientsInTheActivationDtypeKeepTheBits) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  GlaCudaBackwardArgs args;
  args.act = DType::BF16;
  EXPECT_EQ(gla_cuda_state_gradients_dtype(args), DType::BF16);
  float dg = 0.0f;
  args.dg = &dg;
  EXPECT_EQ(gla_cuda_state_gradients_dtype(args), DType::F32);
  args.dg = nullptr;
  args.act = DType::F32;
  EXPECT_EQ(gla_cuda_state_gradients_dtype(args), DType::F32);
#endif
  const Sizes shapes[] = {{2, 300, 2, 128, 128}, {3, 130, 1, 72, 136}, {2, 65, 2, 7, 9}};
  for (bool scalar : {false, true})
    for (const Sizes& s : shapes) {
      SCOPED_TRACE(std::string(scalar ? "g [B, T, H]" : "g per channel") + " T=" + std::to_string(s.time));
      Rng rng(5300 + s.time);
      Problem p = make_problem(rng, s, true, true, true);
      if (scalar) p.g = make_gate(rng, {s.batch, s.time, s.heads}, 1.0);
      const Result with_dg = run(p, s.heads, Device::CUDA, DType::BF16, 0.3);
      const Result without = run(p, s.heads, Device::CUDA, DType::BF16, 0.3, Wants{true, true, true, false, true});
      ASSERT_TRUE(with_dg.dg.defined());
      ASSERT_FALSE(without.dg.defined());
      Result same = with_dg;
      same.dg = Tensor();
      expect_same_bits(same, without);
    }
}

TEST(GlaRecurrenceCuda, RejectsWrongDtypes) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  const Shape keys{1, 4, 8};
  auto gpu = [](const Shape& shape, DType dtype) { return make_var(Tensor::zeros(shape, dtype, Device::CUDA)); };
  // g must be fp32 on the GPU even for bf16 activations.
  EXPECT_THROW(gla_recurrence(tape, gpu(keys, DType::BF16), gpu(keys, DType::BF16), gpu(keys, DType::BF16),
                                gpu(keys, DType::BF16), nullptr, 2, 1.0, RecurrenceMode::Chunk),
               Error);
  // Inputs on different devices.
  EXPECT_THROW(gla_recurrence(tape, gpu(keys, DType::F32), gpu(keys, DType::F32), gpu(keys, DType::F32),
                                make_var(Tensor::zeros(keys, DType::F32)), nullptr, 2, 1.0, RecurrenceMode::Chunk),
               Error);
}

}  // namespace
}  // namespace hgrn
