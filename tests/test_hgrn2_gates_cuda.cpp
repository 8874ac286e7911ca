// test_hgrn2_gates_cuda.cpp: the HGRN2 gates on the GPU (lower bound γ, log forget gate g, input gate k, and the
// fused q, g, k of hgrn2_gates), forward and every gradient, against the CPU ops run in fp64 on the same inputs (for
// bf16: the inputs rounded through bf16), on odd shapes, layer 0 / layer > 0 / no bound, absent cotangents,
// accumulation and aliasing, extreme inputs (no NaN), and run-to-run bitwise identity. Skipped (never passed) without
// a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/hgrn2_gates.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::max_abs;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;
using testing::to_host_f64;

// Every element within rel·|want| (+ a floor for exact zeros): for results whose every element must keep its
// relative precision (g and k near 0, gradients spanning many orders of magnitude at extreme inputs).
void expect_elementwise_rel(const Tensor& got, const Tensor& want, double rel, double floor, const std::string& what) {
  Tensor g = to_host_f64(got), w = to_host_f64(want);
  ASSERT_EQ(g.numel(), w.numel()) << what;
  int64_t bad = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double a = g.item(i), b = w.item(i);
    if (!(std::fabs(a - b) <= rel * std::fabs(b) + floor)) {
      if (++bad <= 5) ADD_FAILURE() << what << ": element " << i << " got " << a << ", want " << b;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": elements outside rel " << rel;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// A fp64 host tensor holding exactly fp32-representable values (what an fp32 GPU tensor holds).
Tensor f32_exact(const Tensor& host) { return round_through(host, DType::F32); }

// γ rows as lower_bound_transform makes them: row 0 zero, the rest in [0.02, 0.98]; fp32-exact values.
Tensor random_gamma(Rng& rng, int64_t layers, int64_t width) {
  Tensor gamma = Tensor::zeros({layers, width}, DType::F64);
  for (int64_t l = 1; l < layers; ++l)
    for (int64_t c = 0; c < width; ++c) gamma.set_item(l * width + c, 0.02 + 0.96 * rng.uniform());
  return f32_exact(gamma);
}

// ---- lower_bound_transform --------------------------------------------------------------------------------------

TEST(Hgrn2GatesCuda, LowerBoundMatchesCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(301);
  for (int64_t layers : {1, 2, 7, 24}) {
    for (int64_t width : {96, 200, 771}) {
      SCOPED_TRACE(::testing::Message() << "L " << layers << ", D " << width);
      const Tensor lower_bounds = f32_exact(random_tensor(rng, {layers, width}, 2.0));
      const Tensor seed = f32_exact(random_tensor(rng, {layers, width}));
      Var ref_in = make_var(lower_bounds.clone(), true);
      Tape ref_tape;
      Var ref = lower_bound_transform(ref_tape, ref_in);
      ref_tape.backward(ref, seed);

      Var in = make_var(to_gpu(lower_bounds, DType::F32), true);
      Tape tape;
      Var out = lower_bound_transform(tape, in);
      ASSERT_EQ(out->value.device(), Device::CUDA);
      ASSERT_EQ(out->value.dtype(), DType::F32);
      tape.backward(out, to_gpu(seed, DType::F32));
      // fp32 softmax and ≤ 24-term sums: a few ulp.
      expect_close(out->value, ref->value, 1e-5, 1e-6, "gamma");
      // fp32, with the cancellation in dP − Σ P dP: a few ulp of the largest term.
      expect_close(in->grad, ref_in->grad, 1e-5, 1e-5 * std::max(1.0, max_abs(ref_in->grad)), "dGamma");
      EXPECT_EQ(out->value.to(Device::CPU).item(0), 0.0) << "gamma_0 must be exactly 0";
    }
  }
}

// ---- hgrn2_forget_gate ----------------------------------------------------------------------------------------------

enum class Bound { None, Layer0, Layer3 };
const char* bound_name(Bound b) { return b == Bound::None ? "no gamma" : b == Bound::Layer0 ? "layer 0" : "layer 3"; }

// The cases every [rows, F] gate test runs: both activation dtypes; rows 1, 63, 65 (as [5, 13, F]: leading axes are
// flattened into rows) and 2047; widths 96, 200 (4-channel packs) and 771 (one channel); no bound, layer 0, layer 3.
template <typename Body>
void for_each_gate_case(Body&& body) {
  for (DType act : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 63, 65, 2047}) {
      for (int64_t width : {96, 200, 771}) {
        for (Bound bound : {Bound::None, Bound::Layer0, Bound::Layer3}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(act) << ", rows " << rows << ", F " << width << ", "
                                          << bound_name(bound));
          body(act, rows == 65 ? Shape{5, 13, width} : Shape{rows, width}, width, bound);
        }
      }
    }
  }
}

struct GateResult {
  Var f_hat, gamma, g;
};

// The forward and backward with cotangent `seed` on g, on the CPU in fp64 (device CPU) or on the GPU (act dtype).
GateResult run_forget_gate(const Tensor& f_hat, const Tensor& gamma, Bound bound, const Tensor& seed, Device device,
                           DType act) {
  GateResult r;
  const bool gpu = device == Device::CUDA;
  r.f_hat = make_var(gpu ? to_gpu(f_hat, act) : round_through(f_hat, act), true, "f_hat");
  if (bound != Bound::None) r.gamma = make_var(gpu ? to_gpu(gamma, DType::F32) : gamma.clone(), true, "gamma");
  Tape tape;
  r.g = hgrn2_forget_gate(tape, r.f_hat, r.gamma, bound == Bound::Layer3 ? 3 : 0);
  tape.backward(r.g, gpu ? to_gpu(seed, DType::F32) : seed);
  return r;
}

TEST(Hgrn2GatesCuda, ForgetGateMatchesCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(302);
  const int64_t layers = 5;
  for_each_gate_case([&](DType act, const Shape& shape, int64_t width, Bound bound) {
    const Tensor f_hat = random_tensor(rng, shape, 3.0);
    const Tensor gamma = random_gamma(rng, layers, width);
    const Tensor seed = f32_exact(random_tensor(rng, shape));
    GateResult ref = run_forget_gate(f_hat, gamma, bound, seed, Device::CPU, act);
    GateResult got = run_forget_gate(f_hat, gamma, bound, seed, Device::CUDA, act);
    ASSERT_EQ(got.g->value.dtype(), DType::F32) << "g is fp32 on the GPU whatever the activation dtype";

    // g is computed in fp32 from exactly the reference's inputs: a few ulp, also for bf16 activations.
    expect_close(got.g->value, ref.g->value, 1e-5, 1e-5 * std::max(1.0, max_abs(ref.g->value)), "g");
    // df_hat in the activation dtype: fp32 a few ulp; bf16 one rounding (2^-9 relative) of each element.
    const double df_tol = act == DType::F32 ? 1e-5 : 1e-2;
    expect_close(got.f_hat->grad, ref.f_hat->grad, df_tol, df_tol * max_abs(ref.f_hat->grad), "df_hat");
    if (bound == Bound::Layer3) {
      // fp32 sums over the rows in fixed blocks: error far below 1e-5 of the largest channel sum.
      ASSERT_TRUE(got.gamma->grad.defined());
      expect_close(got.gamma->grad, ref.gamma->grad, 1e-5, 1e-5 * max_abs(ref.gamma->grad), "dgamma");
    } else if (bound == Bound::Layer0) {
      EXPECT_FALSE(got.gamma->grad.defined()) << "layer 0 must not touch gamma's gradient";
    }
  });
}

// Saturated and degenerate inputs: f̂ = ±30 (σ underflows to e^-30), γ = 0 (a bound that rounded to 0), tiny γ,
// γ near and at 1. Every element must stay finite and keep its relative precision.
TEST(Hgrn2GatesCuda, ForgetGateExtremeInputsStayFiniteAndAccurate) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<double> f_values = {30, -30, 15, -15, 5, -5, 0, 1e-3, -1e-3, 0.7, -2.5};
  const std::vector<double> gamma_values = {0.0, 1e-6, 0.02, 0.5, 0.9999, 1.0, 0.3};
  const int64_t rows = static_cast<int64_t>(f_values.size()), width = 97;  // every f̂ meets every γ
  Tensor f_hat = Tensor::empty({rows, width}, DType::F64);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) f_hat.set_item(r * width + c, f_values[static_cast<size_t>(r + c) % f_values.size()]);
  Tensor gamma = Tensor::zeros({4, width}, DType::F64);
  for (int64_t l = 1; l < 4; ++l)
    for (int64_t c = 0; c < width; ++c) gamma.set_item(l * width + c, gamma_values[static_cast<size_t>(c) % gamma_values.size()]);
  gamma = f32_exact(gamma);
  Rng rng(303);
  const Tensor seed = f32_exact(random_tensor(rng, {rows, width}));
  for (DType act : {DType::F32, DType::BF16}) {
    for (Bound bound : {Bound::None, Bound::Layer0, Bound::Layer3}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(act) << ", " << bound_name(bound));
      GateResult ref = run_forget_gate(f_hat, gamma, bound, seed, Device::CPU, act);
      GateResult got = run_forget_gate(f_hat, gamma, bound, seed, Device::CUDA, act);
      // fp32 transcendentals of arguments up to ~60 in size: each result within ~1e-5 of itself.
      expect_elementwise_rel(got.g->value, ref.g->value, 1e-5, 1e-30, "g");
      // fp32: exp of a sum of logs (arguments up to ~60: ~4e-6 relative); bf16 adds one rounding (2^-9).
      expect_elementwise_rel(got.f_hat->grad, ref.f_hat->grad, act == DType::F32 ? 2e-5 : 5e-3, 1e-30, "df_hat");
      if (bound == Bound::Layer3) {
        // Channel sums of terms up to 1/γ = 1e6 (and e^30 where γ = 0): fp32 relative to the channel's size.
        expect_close(got.gamma->grad, ref.gamma->grad, 1e-5, 1e-5 * max_abs(ref.gamma->grad), "dgamma");
      }
    }
  }
}

// The GPU overwrites a gradient it reaches first (the other tests) and accumulates onto one that exists: seed f̂'s
// gradient and compare with the CPU.
TEST(Hgrn2GatesCuda, ForgetGateAccumulatesOntoExistingGradient) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(306);
  for (DType act : {DType::F32, DType::BF16}) {
    for (int64_t width : {200, 771}) {  // the 4-channel packs and the one-channel path
      SCOPED_TRACE(::testing::Message() << dtype_name(act) << ", F " << width);
      const Shape shape{65, width};
      const Tensor f_hat = round_through(random_tensor(rng, shape, 3.0), act);
      const Tensor gamma = random_gamma(rng, 5, width);
      const Tensor seed = f32_exact(random_tensor(rng, shape));
      const Tensor df0 = round_through(random_tensor(rng, shape, 0.5), act);
      GateResult res[2];
      for (int gpu : {0, 1}) {
        GateResult& r = res[gpu];
        r.f_hat = make_var(gpu ? to_gpu(f_hat, act) : f_hat.clone(), true, "f_hat");
        r.f_hat->grad = gpu ? to_gpu(df0, act) : df0.clone();
        r.gamma = make_var(gpu ? to_gpu(gamma, DType::F32) : gamma.clone(), true, "gamma");
        Tape tape;
        r.g = hgrn2_forget_gate(tape, r.f_hat, r.gamma, 3);
        tape.backward(r.g, gpu ? to_gpu(seed, DType::F32) : seed);
      }
      const double df_tol = act == DType::F32 ? 1e-5 : 1e-2;  // as ForgetGateMatchesCpuFp64
      expect_close(res[1].f_hat->grad, res[0].f_hat->grad, df_tol, df_tol * max_abs(res[0].f_hat->grad), "df_hat");
    }
  }
}

// ---- input_gate_from_forget ---------------------------------------------------------------------------------------

TEST(Hgrn2GatesCuda, InputGateMatchesCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(304);
  for (DType g_dtype : {DType::F32, DType::BF16}) {
    for (DType k_dtype : {DType::F32, DType::BF16}) {
      for (const Shape& shape : {Shape{1, 96}, Shape{63, 771}, Shape{2047, 200}}) {
        SCOPED_TRACE(::testing::Message() << "g " << dtype_name(g_dtype) << ", k " << dtype_name(k_dtype) << ", "
                                        << shape_str(shape));
        // Log decays from about −3e-4 to −3000, and the edges: 0, −1e-7 (k ≈ 1e-7 needs expm1), −30, −100.
        Tensor g = random_tensor(rng, shape, 2.0);
        for (int64_t i = 0; i < g.numel(); ++i) g.set_item(i, -std::exp(g.item(i)));
        const std::vector<double> edges = {0.0, -1e-7, -30.0, -100.0};
        for (size_t e = 0; e < edges.size() && static_cast<int64_t>(e) < g.numel(); ++e)
          g.set_item(static_cast<int64_t>(e), edges[e]);
        g = round_through(g, g_dtype);
        const Tensor dk = round_through(random_tensor(rng, shape), k_dtype);

        Var ref_g = make_var(g.clone(), true);
        Tape ref_tape;
        Var ref_k = input_gate_from_forget(ref_tape, ref_g);
        ref_tape.backward(ref_k, dk);

        Var gpu_g = make_var(to_gpu(g, g_dtype), true);
        Tape tape;
        Var k = input_gate_from_forget(tape, gpu_g, k_dtype);
        ASSERT_EQ(k->value.dtype(), k_dtype);
        tape.backward(k, to_gpu(dk, k_dtype));
        ASSERT_EQ(gpu_g->grad.dtype(), g_dtype);

        if (k_dtype == DType::F32)  // expm1f: ~1 ulp relative everywhere, also for k ≈ 1e-7
          expect_elementwise_rel(k->value, ref_k->value, 1e-5, 1e-30, "k");
        else  // k in [0, 1] rounded once to bf16 (2^-9 relative)
          expect_close(k->value, ref_k->value, 1e-2, 1e-2, "k");
        // dg in g's dtype: fp32 a few ulp; bf16 one rounding per element.
        const double dg_tol = g_dtype == DType::F32 ? 1e-5 : 1e-2;
        expect_close(gpu_g->grad, ref_g->grad, dg_tol, dg_tol * max_abs(ref_g->grad), "dg");
      }
    }
  }
}

TEST(Hgrn2GatesCuda, InputGateOneArgumentFormKeepsGsDtype) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  Var g = make_var(Tensor::full({3, 5}, -0.5, DType::F32, Device::CUDA));
  EXPECT_EQ(input_gate_from_forget(tape, g)->value.dtype(), DType::F32);
  EXPECT_EQ(input_gate_from_forget(tape, g, DType::BF16)->value.dtype(), DType::BF16);
}

// Runs on any machine: the CPU keeps one dtype per op.
TEST(Hgrn2GatesCuda, CpuInputGateRejectsAnotherOutputDtype) {
  Tape tape;
  Var g = make_var(Tensor::full({2, 3}, -0.5, DType::F64));
  EXPECT_THROW(input_gate_from_forget(tape, g, DType::F32), Error);
  EXPECT_EQ(input_gate_from_forget(tape, g, DType::F64)->value.dtype(), DType::F64);
}

// ---- hgrn2_gates: a layer's q, g, k fused -------------------------------------------------------------------------

// Which cotangents reach the outputs, and whether q̂'s and f̂'s gradients exist before the backward (accumulate).
// blocks: q̂ and f̂ are column blocks of one tensor [q̂ | f̂ | 8 more columns] (split_columns, as the model's fused
// projection makes them), read and given their gradients row-strided on the GPU; the 8 columns get none (zeros).
struct Cotangents {
  bool dq = true, dg = true, dk = true, existing_grads = false, alias = false, blocks = false;
};

struct FusedResult {
  Var q_hat, f_hat, gamma;
  Hgrn2Gates out;
};

// The fused op on the CPU in fp64 (inputs and act-dtype cotangents rounded through act) or on the GPU. alias: q̂ is f̂.
FusedResult run_fused(const Tensor& q_hat, const Tensor& f_hat, const Tensor& gamma, Bound bound, const Tensor& dq,
                      const Tensor& dg, const Tensor& dk, const Tensor& dq0, const Tensor& df0, const Cotangents& c,
                      Device device, DType act) {
  FusedResult r;
  const bool gpu = device == Device::CUDA;
  const auto act_var = [&](const Tensor& t) { return gpu ? to_gpu(t, act) : round_through(t, act); };
  Tape tape;
  Var parent;
  const int64_t width = f_hat.size(-1);
  if (c.blocks) {
    Shape extra = f_hat.shape();
    extra.back() = 8;
    parent = make_var(act_var(testing::concat_columns({q_hat, f_hat, Tensor::full(extra, 1.0, DType::F64)})), true);
    const std::vector<Var> blocks = split_columns(tape, parent, {width, width, 8});
    r.q_hat = blocks[0];
    r.f_hat = blocks[1];
  } else {
    r.f_hat = make_var(act_var(f_hat), true, "f_hat");
    r.q_hat = c.alias ? r.f_hat : make_var(act_var(q_hat), true, "q_hat");
  }
  if (c.existing_grads) {
    r.f_hat->grad = act_var(df0);
    if (!c.alias) r.q_hat->grad = act_var(dq0);
  }
  if (bound != Bound::None) r.gamma = make_var(gpu ? to_gpu(gamma, DType::F32) : gamma.clone(), true, "gamma");
  r.out = hgrn2_gates(tape, r.q_hat, r.f_hat, r.gamma, bound == Bound::Layer3 ? 3 : 0);
  const Tensor dg_value = gpu ? to_gpu(dg, DType::F32) : dg.clone();
  // One cotangent seeds the backward, the others are set directly.
  Var seeded;
  Tensor seed;
  if (c.dq) seeded = r.out.q, seed = act_var(dq);
  if (c.dk) {
    if (seeded)
      r.out.k->grad = act_var(dk);
    else
      seeded = r.out.k, seed = act_var(dk);
  }
  if (c.dg) {
    if (seeded)
      r.out.g->grad = dg_value;
    else
      seeded = r.out.g, seed = dg_value;
  }
  tape.backward(seeded, seed);
  if (c.blocks) {  // the blocks' gradients ended in the parent's: read them back from there
    if (!parent->grad.defined()) {
      ADD_FAILURE() << "the split's parent got no gradient";
      return r;
    }
    const Tensor extra = to_host_f64(parent->grad.columns(2 * width, 8).clone());
    for (int64_t i = 0; i < extra.numel(); ++i) EXPECT_EQ(extra.item(i), 0.0) << "a column no block gradient reached";
    if (c.dq) r.q_hat->grad = parent->grad.columns(0, width).clone();
    if (c.dg || c.dk) r.f_hat->grad = parent->grad.columns(width, width).clone();
  }
  return r;
}

void expect_fused_match(const FusedResult& got, const FusedResult& ref, const Cotangents& c, Bound bound, DType act) {
  // Values: g fp32 from the reference's inputs (a few ulp); q and k stored in the act dtype (bf16: one rounding).
  const double tol = act == DType::F32 ? 1e-5 : 1e-2;
  expect_close(got.out.g->value, ref.out.g->value, 1e-5, 1e-5 * std::max(1.0, max_abs(ref.out.g->value)), "g");
  expect_close(got.out.q->value, ref.out.q->value, tol, tol * max_abs(ref.out.q->value), "q");
  expect_close(got.out.k->value, ref.out.k->value, tol, tol, "k");
  // Gradients in the act dtype: fp32 a few ulp of fp32 arithmetic, bf16 one rounding of each element.
  const bool f_grad = c.dg || c.dk || c.existing_grads || c.alias;
  ASSERT_EQ(got.f_hat->grad.defined(), f_grad);
  if (f_grad) expect_close(got.f_hat->grad, ref.f_hat->grad, tol, tol * max_abs(ref.f_hat->grad), "df_hat");
  if (!c.alias) {
    ASSERT_EQ(got.q_hat->grad.defined(), c.dq || c.existing_grads);
    if (c.dq || c.existing_grads)
      expect_close(got.q_hat->grad, ref.q_hat->grad, tol, tol * max_abs(ref.q_hat->grad), "dq_hat");
  }
  if (bound == Bound::Layer3 && (c.dg || c.dk)) {
    // fp32 sums over the rows in fixed blocks: error far below 1e-5 of the largest channel sum.
    ASSERT_TRUE(got.gamma->grad.defined());
    expect_close(got.gamma->grad, ref.gamma->grad, 1e-5, 1e-5 * max_abs(ref.gamma->grad), "dgamma");
  } else if (got.gamma) {
    EXPECT_FALSE(got.gamma->grad.defined()) << "gamma's gradient must stay untouched";
  }
}

TEST(Hgrn2GatesCuda, FusedGatesMatchCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(307);
  const int64_t layers = 5;
  for_each_gate_case([&](DType act, const Shape& shape, int64_t width, Bound bound) {
    const Tensor q_hat = random_tensor(rng, shape, 3.0), f_hat = random_tensor(rng, shape, 3.0);
    const Tensor gamma = random_gamma(rng, layers, width);
    const Tensor dq = random_tensor(rng, shape), dg = f32_exact(random_tensor(rng, shape));
    const Tensor dk = random_tensor(rng, shape);
    const Cotangents all;
    FusedResult ref = run_fused(q_hat, f_hat, gamma, bound, dq, dg, dk, {}, {}, all, Device::CPU, act);
    FusedResult got = run_fused(q_hat, f_hat, gamma, bound, dq, dg, dk, {}, {}, all, Device::CUDA, act);
    ASSERT_EQ(got.out.g->value.dtype(), DType::F32);
    ASSERT_EQ(got.out.q->value.dtype(), act);
    ASSERT_EQ(got.out.k->value.dtype(), act);
    expect_fused_match(got, ref, all, bound, act);
  });
}

// q̂ and f̂ as column blocks of one tensor (the fused projection's output): read and written row-strided on the GPU.
TEST(Hgrn2GatesCuda, FusedGatesOnColumnBlocksMatchCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(309);
  Cotangents blocks;
  blocks.blocks = true;
  for_each_gate_case([&](DType act, const Shape& shape, int64_t width, Bound bound) {
    const Tensor q_hat = random_tensor(rng, shape, 3.0), f_hat = random_tensor(rng, shape, 3.0);
    const Tensor gamma = random_gamma(rng, 5, width);
    const Tensor dq = random_tensor(rng, shape), dg = f32_exact(random_tensor(rng, shape));
    const Tensor dk = random_tensor(rng, shape);
    FusedResult ref = run_fused(q_hat, f_hat, gamma, bound, dq, dg, dk, {}, {}, blocks, Device::CPU, act);
    FusedResult got = run_fused(q_hat, f_hat, gamma, bound, dq, dg, dk, {}, {}, blocks, Device::CUDA, act);
    ASSERT_EQ(got.q_hat->value.row_stride(), 2 * width + 8);
    expect_fused_match(got, ref, blocks, bound, act);
  });
}

// Some cotangents absent (their part counts as zero, an output nobody needs leaves its input's gradient alone),
// gradients that exist already (accumulated onto), and q̂ = f̂ (the two gradients add in one buffer).
TEST(Hgrn2GatesCuda, FusedGatesPartialCotangentsAccumulationAndAliasing) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(308);
  std::vector<Cotangents> cases(7);
  cases[0].dq = false, cases[0].dg = false;                       // dk only
  cases[1].dg = false, cases[1].dk = false;                       // dq only
  cases[2].dq = false, cases[2].dk = false;                       // dg only
  cases[3].dq = false;                                            // dg and dk
  cases[4].existing_grads = true;                                 // all three, accumulated
  cases[5].alias = true;                                          // q̂ is f̂
  cases[6].alias = true, cases[6].existing_grads = true, cases[6].dg = false;
  for (DType act : {DType::F32, DType::BF16}) {
    for (int64_t width : {200, 771}) {  // the 4-channel packs and the one-channel path
      for (size_t i = 0; i < cases.size(); ++i) {
        SCOPED_TRACE(::testing::Message() << dtype_name(act) << ", F " << width << ", case " << i);
        const Shape shape{65, width};
        const Tensor q_hat = random_tensor(rng, shape, 3.0), f_hat = random_tensor(rng, shape, 3.0);
        const Tensor gamma = random_gamma(rng, 5, width);
        const Tensor dq = random_tensor(rng, shape), dg = f32_exact(random_tensor(rng, shape));
        const Tensor dk = random_tensor(rng, shape);
        const Tensor dq0 = random_tensor(rng, shape, 0.5), df0 = random_tensor(rng, shape, 0.5);
        FusedResult ref = run_fused(q_hat, f_hat, gamma, Bound::Layer3, dq, dg, dk, dq0, df0, cases[i], Device::CPU, act);
        FusedResult got = run_fused(q_hat, f_hat, gamma, Bound::Layer3, dq, dg, dk, dq0, df0, cases[i], Device::CUDA, act);
        expect_fused_match(got, ref, cases[i], Bound::Layer3, act);
      }
    }
  }
}

// ---- the chain the model runs, and determinism ------------------------------------------------------------------------

// γ = lower_bound(Γ); q, g, k = hgrn2_gates(q̂, f̂, γ, ℓ) in the activation dtype; cotangents on q, g and k.
struct Chain {
  Var lower_bounds, q_hat, f_hat;
  Hgrn2Gates out;
};
Chain run_chain(const Tensor& lower_bounds, const Tensor& q_hat, const Tensor& f_hat, const Tensor& dq,
                const Tensor& dg, const Tensor& dk, Device device, DType act) {
  const bool gpu = device == Device::CUDA;
  const auto act_var = [&](const Tensor& t) { return gpu ? to_gpu(t, act) : round_through(t, act); };
  Chain c;
  c.lower_bounds = make_var(gpu ? to_gpu(lower_bounds, DType::F32) : lower_bounds.clone(), true, "Gamma");
  c.q_hat = make_var(act_var(q_hat), true, "q_hat");
  c.f_hat = make_var(act_var(f_hat), true, "f_hat");
  Tape tape;
  Var gamma = lower_bound_transform(tape, c.lower_bounds);
  c.out = hgrn2_gates(tape, c.q_hat, c.f_hat, gamma, 2);
  c.out.g->grad = gpu ? to_gpu(dg, DType::F32) : dg.clone();
  c.out.q->grad = act_var(dq);
  tape.backward(c.out.k, act_var(dk));
  return c;
}

TEST(Hgrn2GatesCuda, ModelChainMatchesCpuAndIsBitwiseReproducible) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(305);
  const int64_t layers = 4, rows = 2047, width = 771;
  const Tensor lower_bounds = f32_exact(random_tensor(rng, {layers, width}));
  const Tensor q_hat = random_tensor(rng, {rows, width}, 3.0);
  const Tensor f_hat = random_tensor(rng, {rows, width}, 3.0);
  const Tensor dq = random_tensor(rng, {rows, width});
  const Tensor dg = f32_exact(random_tensor(rng, {rows, width}));
  const Tensor dk = random_tensor(rng, {rows, width});
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    Chain ref = run_chain(lower_bounds, q_hat, f_hat, dq, dg, dk, Device::CPU, act);
    Chain a = run_chain(lower_bounds, q_hat, f_hat, dq, dg, dk, Device::CUDA, act);
    Chain b = run_chain(lower_bounds, q_hat, f_hat, dq, dg, dk, Device::CUDA, act);
    const double tol = act == DType::F32 ? 1e-5 : 1e-2;  // q, k and the input gradients are in the activation dtype
    expect_close(a.out.g->value, ref.out.g->value, 1e-5, 1e-5 * max_abs(ref.out.g->value), "g");
    expect_close(a.out.k->value, ref.out.k->value, tol, tol, "k");
    expect_close(a.out.q->value, ref.out.q->value, tol, tol * max_abs(ref.out.q->value), "q");
    expect_close(a.f_hat->grad, ref.f_hat->grad, tol, tol * max_abs(ref.f_hat->grad), "df_hat");
    expect_close(a.q_hat->grad, ref.q_hat->grad, tol, tol * max_abs(ref.q_hat->grad), "dq_hat");
    // dΓ: fp32 row sums through the softmax backward (dk enters rounded to the act dtype on both sides).
    expect_close(a.lower_bounds->grad, ref.lower_bounds->grad, 1e-4, 1e-4 * max_abs(ref.lower_bounds->grad), "dGamma");
    EXPECT_TRUE(same_bits(a.out.g->value, b.out.g->value)) << "g";
    EXPECT_TRUE(same_bits(a.out.k->value, b.out.k->value)) << "k";
    EXPECT_TRUE(same_bits(a.out.q->value, b.out.q->value)) << "q";
    EXPECT_TRUE(same_bits(a.f_hat->grad, b.f_hat->grad)) << "df_hat";
    EXPECT_TRUE(same_bits(a.q_hat->grad, b.q_hat->grad)) << "dq_hat";
    EXPECT_TRUE(same_bits(a.lower_bounds->grad, b.lower_bounds->grad)) << "dGamma";
  }
}

}  // namespace
}  // namespace hgrn
