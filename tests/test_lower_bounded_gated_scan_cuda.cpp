// test_lower_bounded_gated_scan_cuda.cpp: the fused CUDA op lower_bounded_gated_scan (gates and scan from î and f̂,
// kernels/lower_bounded_gated_scan.cu) against its CPU reference, the composition hgrn2_forget_gate,
// input_gate_from_forget, swiglu and gated_scan in fp64, computed from the very values the GPU sees (î, f̂ and dO
// rounded through the activation dtype; γ, h0, dh_T through fp32): output, final state and the gradients of î, f̂,
// γ and h0, for sequence lengths around the 64-step chunk, odd channel counts, fp32 and bf16, layer 0 (unbounded),
// a bounded layer and no bounds at all; column blocks of one projection's output with their gradients in the parent,
// accumulation into existing gradients, and bitwise run-to-run identity. The GPU tests skip (never pass) without a
// GPU; the CPU test checks that the op is the composition there.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/hgrn2_gates.h"
#include "ops/lower_bounded_gated_scan.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;
using testing::to_host_f64;

constexpr int64_t kLayers = 3;

struct Sizes {
  int64_t batch, time, channels;
  std::string str() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(time) + " C=" + std::to_string(channels);
  }
};

// fp64 host values of one problem; h0, d_out, d_final may be undefined (absent). gamma [kLayers, C].
struct Problem {
  Tensor i_hat, f_hat, gamma, h0, d_out, d_final;
};

// f̂: logits around 2 with a wide spread, so that both of the gate's branches (λ above and below 1/2) occur; γ in
// [0.05, 0.95] (row 0 is 0, as lower_bound_transform makes it).
Problem make_problem(Rng& rng, const Sizes& s, bool with_initial, bool with_d_out, bool with_d_final) {
  const Shape seq{s.batch, s.time, s.channels}, state{s.batch, s.channels};
  Problem p;
  p.i_hat = random_tensor(rng, seq);
  p.f_hat = Tensor::empty(seq, DType::F64);
  for (int64_t i = 0; i < p.f_hat.numel(); ++i) p.f_hat.set_item(i, 2.0 + 2.0 * rng.normal());
  p.gamma = Tensor::zeros({kLayers, s.channels}, DType::F64);
  for (int64_t i = s.channels; i < p.gamma.numel(); ++i) p.gamma.set_item(i, 0.05 + 0.9 * rng.uniform());
  if (with_initial) p.h0 = random_tensor(rng, state);
  if (with_d_out) p.d_out = random_tensor(rng, seq);
  if (with_d_final) p.d_final = random_tensor(rng, state);
  return p;
}

Problem rounded(const Problem& p, DType act) {
  auto r = [](const Tensor& t, DType dtype) { return t.defined() ? round_through(t, dtype) : Tensor(); };
  return {r(p.i_hat, act), r(p.f_hat, act), r(p.gamma, DType::F32), r(p.h0, DType::F32), r(p.d_out, act),
          r(p.d_final, DType::F32)};
}

struct Result {
  Tensor output, final_state, di, df, dgamma, dh0;  // fp64 host copies (gradients undefined where none came)
};

struct Options {
  int64_t layer = 1;
  bool with_gamma = true;
  int64_t column_offset = -1;  // >= 0: î and f̂ are column blocks [offset | î | f̂ | pad] of one parent whose rows
                               // are a multiple of 8 elements apart (so that the offset decides the alignment)
  const Problem* initial_grads = nullptr;  // gradients already there, which the backward must add to
};

// Runs the op on `device` (CUDA: î, f̂, dO in act, the rest fp32; CPU: everything fp64 in the sequential form, the
// reference) and backpropagates L = <output, dO> + <final_state, dh_T>.
Result run(const Problem& p, Device device, DType act, const Options& o = {}) {
  const bool gpu = device == Device::CUDA;
  auto put = [&](const Tensor& t, DType dtype) { return gpu ? to_gpu(t, dtype) : t.clone(); };
  const DType act_dtype = gpu ? act : DType::F64, f32 = gpu ? DType::F32 : DType::F64;
  Tape tape;
  Var i_hat, f_hat, parent;
  const int64_t C = p.i_hat.size(-1);
  if (o.column_offset >= 0) {
    const auto pad = [&](int64_t n) { return Tensor::full({p.i_hat.size(0), p.i_hat.size(1), n}, 0.5, DType::F64); };
    const int64_t right = 8 + (8 - (o.column_offset + 2 * C) % 8) % 8;
    parent = make_var(put(testing::concat_columns({pad(o.column_offset), p.i_hat, p.f_hat, pad(right)}), act_dtype),
                      true, "parent");
    const std::vector<Var> blocks = split_columns(tape, parent, {o.column_offset, C, C, right});
    i_hat = blocks[1];
    f_hat = blocks[2];
  } else {
    i_hat = make_var(put(p.i_hat, act_dtype), true, "i_hat");
    f_hat = make_var(put(p.f_hat, act_dtype), true, "f_hat");
  }
  Var gamma = o.with_gamma ? make_var(put(p.gamma, f32), true, "gamma") : nullptr;
  Var h0 = p.h0.defined() ? make_var(put(p.h0, f32), true, "h0") : nullptr;
  if (o.initial_grads) {
    i_hat->grad = put(o.initial_grads->i_hat, act_dtype);
    f_hat->grad = put(o.initial_grads->f_hat, act_dtype);
    if (gamma) gamma->grad = put(o.initial_grads->gamma, f32);
    if (h0) h0->grad = put(o.initial_grads->h0, f32);
  }
  GatedScanOutputs r =
      lower_bounded_gated_scan(tape, i_hat, f_hat, gamma, o.layer, h0, gpu ? ScanMode::Chunk : ScanMode::Sequential);
  if (p.d_out.defined()) {
    if (p.d_final.defined()) r.final_state->grad = put(p.d_final, f32);
    tape.backward(r.output, put(p.d_out, act_dtype));
  } else if (p.d_final.defined()) {
    tape.backward(r.final_state, put(p.d_final, f32));
  }
  auto grad = [](const Var& v) { return v && v->grad.defined() ? to_host_f64(v->grad) : Tensor(); };
  Result result{to_host_f64(r.output->value), to_host_f64(r.final_state->value), Tensor(), Tensor(), grad(gamma),
                grad(h0)};
  if (parent) {
    // The blocks' gradients land in the parent's; the other columns get none.
    EXPECT_TRUE(parent->grad.defined());
    if (!parent->grad.defined()) return result;
    const Tensor whole = to_host_f64(parent->grad);
    const int64_t width = whole.size(-1);
    for (int64_t row = 0; row < whole.numel() / width; ++row)
      for (int64_t c = 0; c < width; ++c) {
        if (c < o.column_offset || c >= o.column_offset + 2 * C) {
          EXPECT_EQ(whole.item(row * width + c), 0.0) << "parent column " << c << " of row " << row;
        }
      }
    result.di = whole.columns(o.column_offset, C).clone();
    result.df = whole.columns(o.column_offset + C, C).clone();
  } else {
    result.di = grad(i_hat);
    result.df = grad(f_hat);
  }
  return result;
}

struct Tol {
  double rel_rms, max_rel;  // relative RMS error; max abs error relative to the reference's largest entry
};
// fp32 arithmetic throughout: the gates' sigmoids (expf and a 2-ulp division), silu, the steps and the chunk
// carries (products of 64 decays), compounded over the few tens of steps a decay near 0.9 remembers.
constexpr Tol kFp32{2e-5, 5e-5};
// γ's gradient is a sum over B·T terms of both signs: its fp32 rounding is relative to the terms, not the sum.
constexpr Tol kSum{3e-4, 1e-3};
// Stored in bf16 (o, dî, df̂): at most 2^-9 relative, RMS ~2^-9/√3.
constexpr Tol kBf16Stored{2.5e-3, 4e-3};
// df̂ and dγ in bf16 also read h_{t−1} from o stored in bf16 (2^-9 relative each), in (h_{t−1} − silu(î)) dh, where
// the difference can cancel; dγ's sum of such terms carries that rounding, not fp32's.
constexpr Tol kBf16FromOutput{5e-3, 8e-3};

void expect_matches(const Result& got, const Result& want, DType act, const std::string& context) {
  struct Pair {
    const char* name;
    const Tensor &got, &want;
    Tol tol;
  };
  const Tol stored = act == DType::BF16 ? kBf16Stored : kFp32;
  const Pair pairs[] = {{"output", got.output, want.output, stored},
                        {"final_state", got.final_state, want.final_state, kFp32},
                        {"di", got.di, want.di, stored},
                        {"df", got.df, want.df, act == DType::BF16 ? kBf16FromOutput : kFp32},
                        {"dgamma", got.dgamma, want.dgamma, act == DType::BF16 ? kBf16FromOutput : kSum},
                        {"dh0", got.dh0, want.dh0, kFp32}};
  for (const Pair& p : pairs) {
    ASSERT_EQ(p.got.defined(), p.want.defined()) << p.name << ", " << context;
    if (!p.want.defined()) continue;
    // A reference below fp32's range (dh0 through 1000 decaying steps) underflows to 0 or denormals in fp32, which is
    // right: such results are held to an absolute bound at the bottom of fp32's normal range.
    constexpr double kFp32Underflow = 1e-37;
    if (max_abs(p.want) < kFp32Underflow) {
      const testing::Discrepancy d = testing::compare(p.got, p.want);
      EXPECT_EQ(d.non_finite, 0) << p.name << ", " << context;
      EXPECT_LE(d.max_abs, kFp32Underflow) << p.name << ", " << context << ": reference below fp32's range";
      continue;
    }
    const double scale = max_abs(p.want);
    const testing::Discrepancy d = testing::expect_close(p.got, p.want, p.tol.rel_rms, p.tol.max_rel * scale,
                                                         std::string(p.name) + ", " + context);
    if (std::getenv("HGRN_TEST_VERBOSE"))
      std::printf("  %-11s rel_rms %.2e  max_abs/max|ref| %.2e  (%s)\n", p.name, d.rel_rms, d.max_abs / scale,
                  context.c_str());
  }
}

void expect_gpu_matches_cpu(const Problem& p, DType act, const Options& o, const std::string& context) {
  const Result got = run(p, Device::CUDA, act, o);
  Options reference = o;
  reference.column_offset = -1;
  const Result want = run(rounded(p, act), Device::CPU, DType::F64, reference);
  expect_matches(got, want, act, context);
}

// ---------------------------------------------------------------------------------------------------------------------

TEST(LowerBoundedGatedScan, CpuIsTheComposition) {
  Rng rng(5);
  const Problem p = make_problem(rng, {2, 70, 5}, true, true, true);
  const Result fused = run(p, Device::CPU, DType::F64);
  Tape tape;
  const Var i_hat = make_var(p.i_hat.clone(), true), f_hat = make_var(p.f_hat.clone(), true);
  const Var gamma = make_var(p.gamma.clone(), true), h0 = make_var(p.h0.clone(), true);
  const Var g = hgrn2_forget_gate(tape, f_hat, gamma, 1);
  const Var u = swiglu(tape, i_hat, input_gate_from_forget(tape, g));
  GatedScanOutputs r = gated_scan(tape, u, g, h0, ScanMode::Sequential);
  r.final_state->grad = p.d_final.clone();
  tape.backward(r.output, p.d_out.clone());
  // The same ops in the same order: the same bits.
  EXPECT_EQ(fused.output.to_double_vector(), r.output->value.to_double_vector());
  EXPECT_EQ(fused.final_state.to_double_vector(), r.final_state->value.to_double_vector());
  EXPECT_EQ(fused.di.to_double_vector(), i_hat->grad.to_double_vector());
  EXPECT_EQ(fused.df.to_double_vector(), f_hat->grad.to_double_vector());
  EXPECT_EQ(fused.dgamma.to_double_vector(), gamma->grad.to_double_vector());
  EXPECT_EQ(fused.dh0.to_double_vector(), h0->grad.to_double_vector());
}

TEST(LowerBoundedGatedScanCuda, MatchesCpuReferenceAcrossShapes) {
  HGRN_SKIP_WITHOUT_GPU();
  int variant = 0;
  for (int64_t time : {1, 63, 64, 65, 200, 1000}) {
    for (int64_t channels : {1, 7, 130}) {
      for (DType act : {DType::F32, DType::BF16}) {
        // Rotate the initial state, the output gradients and the gate's bound, so that every combination occurs.
        const bool with_initial = variant % 2 == 0;
        const bool with_d_out = variant % 3 != 2, with_d_final = variant % 3 != 1;
        Options o;
        o.layer = variant % 4 == 1 ? 0 : 2;
        o.with_gamma = variant % 5 != 3;
        ++variant;
        const Sizes s{3, time, channels};
        const std::string context = s.str() + " " + dtype_name(act) + " h0=" + std::to_string(with_initial) +
                                    " dO=" + std::to_string(with_d_out) + " dh_T=" + std::to_string(with_d_final) +
                                    " layer=" + std::to_string(o.layer) + " gamma=" + std::to_string(o.with_gamma);
        SCOPED_TRACE(context);
        Rng rng(2000 + variant);
        expect_gpu_matches_cpu(make_problem(rng, s, with_initial, with_d_out, with_d_final), act, o, context);
      }
    }
  }
}

TEST(LowerBoundedGatedScanCuda, LayerZeroLeavesGammaAlone) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(61);
  const Problem p = make_problem(rng, {2, 130, 9}, true, true, true);
  Options o;
  o.layer = 0;
  const Result got = run(p, Device::CUDA, DType::F32, o);
  EXPECT_FALSE(got.dgamma.defined());  // the unbounded gate does not depend on γ
  expect_gpu_matches_cpu(p, DType::F32, o, "layer 0");
}

TEST(LowerBoundedGatedScanCuda, ColumnBlocksMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  // Offsets that keep the four-channel accesses aligned (4, 8) and ones that do not (2, 3).
  for (int64_t offset : {int64_t{2}, int64_t{3}, int64_t{4}, int64_t{8}}) {
    for (DType act : {DType::F32, DType::BF16}) {
      const Sizes s{2, 200, 132};
      const std::string context = s.str() + " " + dtype_name(act) + " offset=" + std::to_string(offset);
      SCOPED_TRACE(context);
      Rng rng(400 + offset);
      Options o;
      o.column_offset = offset;
      expect_gpu_matches_cpu(make_problem(rng, s, true, true, true), act, o, context);
    }
  }
}

TEST(LowerBoundedGatedScanCuda, AccumulatesIntoExistingGradients) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 150, 40};
  for (DType act : {DType::F32, DType::BF16}) {
    Rng rng(65);
    const Problem p = make_problem(rng, s, true, true, true);
    Problem prior = make_problem(rng, s, true, true, true);
    prior.gamma = random_tensor(rng, {kLayers, s.channels});
    Options o;
    o.initial_grads = &prior;
    const Result got = run(p, Device::CUDA, act, o);
    Options reference;
    Result want = run(rounded(p, act), Device::CPU, DType::F64, reference);
    const Problem prior_seen = rounded(prior, act);
    auto add = [](Tensor& a, const Tensor& b) {
      for (int64_t i = 0; i < a.numel(); ++i) a.set_item(i, a.item(i) + b.item(i));
    };
    add(want.di, prior_seen.i_hat);
    add(want.df, prior_seen.f_hat);
    add(want.dgamma, prior_seen.gamma);  // rows other than the layer's keep what was there
    add(want.dh0, prior_seen.h0);
    expect_matches(got, want, act, std::string("accumulate ") + dtype_name(act));
  }
}

TEST(LowerBoundedGatedScanCuda, IsBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{3, 500, 132};
  Rng rng(67);
  const Problem p = make_problem(rng, s, true, true, true);
  for (DType act : {DType::F32, DType::BF16}) {
    const Result a = run(p, Device::CUDA, act), b = run(p, Device::CUDA, act);
    EXPECT_EQ(a.output.to_double_vector(), b.output.to_double_vector());
    EXPECT_EQ(a.final_state.to_double_vector(), b.final_state.to_double_vector());
    EXPECT_EQ(a.di.to_double_vector(), b.di.to_double_vector());
    EXPECT_EQ(a.df.to_double_vector(), b.df.to_double_vector());
    EXPECT_EQ(a.dgamma.to_double_vector(), b.dgamma.to_double_vector());
    EXPECT_EQ(a.dh0.to_double_vector(), b.dh0.to_double_vector());
  }
}

TEST(LowerBoundedGatedScanCuda, RejectsWrongInputs) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  const auto gpu = [](Shape shape, DType dtype) { return make_var(Tensor::zeros(shape, dtype, Device::CUDA)); };
  const Var i = gpu({1, 4, 2}, DType::BF16), f = gpu({1, 4, 2}, DType::BF16), gamma = gpu({2, 2}, DType::F32);
  EXPECT_NO_THROW(lower_bounded_gated_scan(tape, i, f, gamma, 1, nullptr));
  EXPECT_THROW(lower_bounded_gated_scan(tape, i, gpu({1, 4, 2}, DType::F32), gamma, 1, nullptr), Error);
  EXPECT_THROW(lower_bounded_gated_scan(tape, i, f, gpu({2, 2}, DType::BF16), 1, nullptr), Error);
  EXPECT_THROW(lower_bounded_gated_scan(tape, i, f, gamma, 2, nullptr), Error);  // layer out of range
  EXPECT_THROW(lower_bounded_gated_scan(tape, i, f, gamma, 1, gpu({1, 2}, DType::BF16)), Error);
  EXPECT_THROW(lower_bounded_gated_scan(tape, i, i, gamma, 1, nullptr), Error);
}

}  // namespace
}  // namespace hgrn
