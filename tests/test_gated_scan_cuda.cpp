// test_gated_scan_cuda.cpp: the CUDA gated scan (kernels/gated_scan.cu) against the CPU sequential form in fp64,
// computed from the very values the GPU sees (x and dO rounded through the activation dtype; g, h0, dh_T through
// fp32): output, final state and every gradient, for sequence lengths around the 64-step chunk (1, 63, 64, 65, 200,
// 1000), odd channel counts (1, 7: one channel a thread; 130: two), with and without initial state, output gradient
// and final-state gradient, three gate regimes, fp32 and bf16 x; row-strided x and g (column blocks) with their
// gradients in the parents, accumulation into existing gradients, partial gradient requests, and bitwise run-to-run
// identity. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/gated_scan.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;
using testing::to_host_f64;

struct Sizes {
  int64_t batch, time, channels;
  std::string str() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(time) + " C=" + std::to_string(channels);
  }
};

// fp64 host values of one problem; h0, d_out, d_final may be undefined (absent).
struct Problem {
  Tensor x, g, h0, d_out, d_final;
};

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

enum class Gates { Moderate, AlmostNoDecay, StrongDecay };

// Moderate: logsigmoid of N(2, 1) logits (forget gates mostly near 0.9, HGRN's regime); almost no decay g ≈ −1e-4;
// strong decay g ≈ −20.
Tensor make_gate(Rng& rng, const Shape& shape, Gates gates) {
  Tensor g = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double u = rng.normal();
    switch (gates) {
      case Gates::Moderate: g.set_item(i, log_sigmoid(2.0 + u)); break;
      case Gates::AlmostNoDecay: g.set_item(i, -1e-4 * (1.0 + 0.5 * std::abs(u))); break;
      case Gates::StrongDecay: g.set_item(i, -20.0 * (1.0 + 0.1 * std::abs(u))); break;
    }
  }
  return g;
}

Problem make_problem(Rng& rng, const Sizes& s, bool with_initial, bool with_d_out, bool with_d_final,
                     Gates gates = Gates::Moderate) {
  const Shape seq{s.batch, s.time, s.channels}, state{s.batch, s.channels};
  Problem p;
  p.x = random_tensor(rng, seq);
  p.g = make_gate(rng, seq, gates);
  if (with_initial) p.h0 = random_tensor(rng, state);
  if (with_d_out) p.d_out = random_tensor(rng, seq);
  if (with_d_final) p.d_final = random_tensor(rng, state);
  return p;
}

// The values a run with activation dtype `act` sees (x, dO in act; g, h0, dh_T in fp32), in fp64.
Problem rounded(const Problem& p, DType act) {
  auto r = [](const Tensor& t, DType dtype) { return t.defined() ? round_through(t, dtype) : Tensor(); };
  return {r(p.x, act), r(p.g, DType::F32), r(p.h0, DType::F32), r(p.d_out, act), r(p.d_final, DType::F32)};
}

struct Result {
  Tensor output, final_state, dx, dg, dh0;  // fp64 host copies (gradients undefined where none was asked)
};

struct Wants {
  bool x = true, g = true, h0 = true;
};

// Runs the op on `device` (CUDA: x, dO in act, the rest fp32; CPU: everything fp64 in the sequential form, the
// reference) and backpropagates L = <output, dO> + <final_state, dh_T>. column_offset >= 0: x and g are column blocks
// [column_offset columns | x | 3 columns] of wider tensors (split_columns), read and given their gradients
// row-strided on the GPU. initial_grads: gradients already there, which the backward must add to.
Result run(const Problem& p, Device device, DType act, const Wants& wants = {}, int64_t column_offset = -1,
           const Problem* initial_grads = nullptr) {
  const bool gpu = device == Device::CUDA;
  auto put = [&](const Tensor& t, DType dtype) { return gpu ? to_gpu(t, dtype) : t.clone(); };
  const DType act_dtype = gpu ? act : DType::F64, f32 = gpu ? DType::F32 : DType::F64;
  Tape tape;
  Var x, g, x_parent, g_parent;
  const int64_t C = p.x.size(-1);
  if (column_offset >= 0) {
    const auto pad = [&](int64_t n) { return Tensor::full({p.x.size(0), p.x.size(1), n}, 0.5, DType::F64); };
    x_parent =
        make_var(put(testing::concat_columns({pad(column_offset), p.x, pad(3)}), act_dtype), wants.x, "x_parent");
    g_parent = make_var(put(testing::concat_columns({pad(column_offset), p.g, pad(3)}), f32), wants.g, "g_parent");
    x = split_columns(tape, x_parent, {column_offset, C, 3})[1];
    g = split_columns(tape, g_parent, {column_offset, C, 3})[1];
  } else {
    x = make_var(put(p.x, act_dtype), wants.x, "x");
    g = make_var(put(p.g, f32), wants.g, "g");
  }
  Var h0 = p.h0.defined() ? make_var(put(p.h0, f32), wants.h0, "h0") : nullptr;
  if (initial_grads) {
    x->grad = put(initial_grads->x, act_dtype);
    g->grad = put(initial_grads->g, f32);
    if (h0) h0->grad = put(initial_grads->h0, f32);
  }
  GatedScanOutputs r = gated_scan(tape, x, g, h0, gpu ? ScanMode::Chunk : ScanMode::Sequential);
  if (r.output->requires_grad) {
    if (p.d_out.defined()) {
      if (p.d_final.defined()) r.final_state->grad = put(p.d_final, f32);
      tape.backward(r.output, put(p.d_out, act_dtype));
    } else if (p.d_final.defined()) {
      tape.backward(r.final_state, put(p.d_final, f32));
    }
  }
  auto grad = [](const Var& v) { return v && v->grad.defined() ? to_host_f64(v->grad) : Tensor(); };
  // A column block's gradient lands in its parent's; the other columns get none.
  auto from_parent = [&](const Var& parent, const Var& block) {
    if (!parent || !parent->grad.defined()) return;
    const Tensor whole = to_host_f64(parent->grad);
    const int64_t width = whole.size(-1);
    for (int64_t row = 0; row < whole.numel() / width; ++row)
      for (int64_t c = 0; c < width; ++c)
        if (c < column_offset || c >= column_offset + C)
          EXPECT_EQ(whole.item(row * width + c), 0.0) << parent->name << " column " << c << " of row " << row;
    block->grad = parent->grad.columns(column_offset, C).clone();
  };
  from_parent(x_parent, x);
  from_parent(g_parent, g);
  return {to_host_f64(r.output->value), to_host_f64(r.final_state->value), grad(x), grad(g), grad(h0)};
}

// Tolerances of one comparison: relative RMS error, and max abs error relative to the reference's largest entry.
struct Tol {
  double rel_rms, max_rel;
};
// fp32 state throughout: the kernels and the reference differ by fp32 rounding of the steps, of expf (~1 ulp) and of
// the chunk carries (e^{S} with S a 64-term fp32 sum), compounded over at most T = 1000 barely decaying steps.
constexpr Tol kFp32{1e-5, 2e-5};
// What bf16 x leaves: the output and dx are rounded to bf16 when stored (at most 2^-9 relative, RMS ~2^-9/√3).
// The final state, dg and dh0 are fp32 results of the rounded inputs and keep kFp32 (dg takes h_{t−1} in fp32: this
// is what fails if the backward read h from the bf16 output).
constexpr Tol kBf16Stored{2.5e-3, 4e-3};

void expect_matches(const Result& got, const Result& want, DType act, const std::string& context) {
  struct Pair {
    const char* name;
    const Tensor &got, &want;
    bool stored_in_act;
  };
  const Pair pairs[] = {{"output", got.output, want.output, true},
                        {"final_state", got.final_state, want.final_state, false},
                        {"dx", got.dx, want.dx, true},
                        {"dg", got.dg, want.dg, false},
                        {"dh0", got.dh0, want.dh0, false}};
  for (const Pair& p : pairs) {
    ASSERT_EQ(p.got.defined(), p.want.defined()) << p.name << ", " << context;
    if (!p.want.defined()) continue;
    const Tol t = act == DType::BF16 && p.stored_in_act ? kBf16Stored : kFp32;
    // A reference below fp32's range (dh0 through 1000 decaying steps can be ~1e-76) underflows to 0 or denormals in
    // fp32, which is right: such results are held to an absolute bound at the bottom of fp32's normal range.
    constexpr double kFp32Underflow = 1e-37;
    if (max_abs(p.want) < kFp32Underflow) {
      const testing::Discrepancy d = testing::compare(p.got, p.want);
      EXPECT_EQ(d.non_finite, 0) << p.name << ", " << context;
      EXPECT_LE(d.max_abs, kFp32Underflow) << p.name << ", " << context << ": reference below fp32's range";
      continue;
    }
    const double scale = max_abs(p.want);
    const testing::Discrepancy d =
        testing::expect_close(p.got, p.want, t.rel_rms, t.max_rel * scale, std::string(p.name) + ", " + context);
    if (std::getenv("HGRN_TEST_VERBOSE"))
      std::printf("  %-11s rel_rms %.2e  max_abs/max|ref| %.2e  (%s)\n", p.name, d.rel_rms, d.max_abs / scale,
                  context.c_str());
  }
}

void expect_gpu_matches_cpu(const Problem& p, DType act, const std::string& context) {
  const Result got = run(p, Device::CUDA, act);
  const Result want = run(rounded(p, act), Device::CPU, DType::F64);
  expect_matches(got, want, act, context);
}

// ---------------------------------------------------------------------------------------------------------------------

TEST(GatedScanCuda, MatchesCpuReferenceAcrossShapes) {
  HGRN_SKIP_WITHOUT_GPU();
  int variant = 0;
  for (int64_t time : {1, 63, 64, 65, 200, 1000}) {
    for (int64_t channels : {1, 7, 130}) {
      for (DType act : {DType::F32, DType::BF16}) {
        // Rotate the initial state and which output gradients flow in, so that every combination occurs.
        const bool with_initial = variant % 2 == 0;
        const bool with_d_out = variant % 3 != 2, with_d_final = variant % 3 != 1;
        ++variant;
        const Sizes s{3, time, channels};
        const std::string context = s.str() + " " + dtype_name(act) + " h0=" + std::to_string(with_initial) +
                                    " dO=" + std::to_string(with_d_out) + " dh_T=" + std::to_string(with_d_final);
        SCOPED_TRACE(context);
        Rng rng(1000 + variant);
        expect_gpu_matches_cpu(make_problem(rng, s, with_initial, with_d_out, with_d_final), act, context);
      }
    }
  }
}

TEST(GatedScanCuda, MatchesCpuReferenceInExtremeGateRegimes) {
  HGRN_SKIP_WITHOUT_GPU();
  for (Gates gates : {Gates::AlmostNoDecay, Gates::StrongDecay}) {
    for (DType act : {DType::F32, DType::BF16}) {
      const Sizes s{2, 300, 130};
      const std::string context =
          s.str() + " " + dtype_name(act) + (gates == Gates::StrongDecay ? " g~-20" : " g~-1e-4");
      SCOPED_TRACE(context);
      Rng rng(77);
      expect_gpu_matches_cpu(make_problem(rng, s, true, true, true, gates), act, context);
    }
  }
}

TEST(GatedScanCuda, RowStridedInputsMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  // Column offsets that keep two-channel accesses aligned (2, 4) and one that does not (3).
  for (int64_t offset : {int64_t{2}, int64_t{3}, int64_t{4}}) {
    for (DType act : {DType::F32, DType::BF16}) {
      const Sizes s{2, 130, 66};
      const std::string context = s.str() + " " + dtype_name(act) + " offset=" + std::to_string(offset);
      SCOPED_TRACE(context);
      Rng rng(300 + offset);
      const Problem p = make_problem(rng, s, true, true, true);
      const Result got = run(p, Device::CUDA, act, {}, offset);
      const Result want = run(rounded(p, act), Device::CPU, DType::F64);
      expect_matches(got, want, act, context);
    }
  }
}

TEST(GatedScanCuda, AccumulatesIntoExistingGradients) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 150, 40};
  for (DType act : {DType::F32, DType::BF16}) {
    Rng rng(55);
    const Problem p = make_problem(rng, s, true, true, true);
    const Problem prior = make_problem(rng, s, true, true, true);
    const Result got = run(p, Device::CUDA, act, {}, -1, &prior);
    Result want = run(rounded(p, act), Device::CPU, DType::F64);
    const Problem prior_seen = rounded(prior, act);
    auto add = [](Tensor& a, const Tensor& b) {
      for (int64_t i = 0; i < a.numel(); ++i) a.set_item(i, a.item(i) + b.item(i));
    };
    add(want.dx, prior_seen.x);
    add(want.dg, prior_seen.g);
    add(want.dh0, prior_seen.h0);
    expect_matches(got, want, act, std::string("accumulate ") + dtype_name(act));
  }
}

TEST(GatedScanCuda, GradientsReachOnlyInputsThatWantThem) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 130, 20};
  Rng rng(56);
  const Problem p = make_problem(rng, s, true, true, true);
  Wants only_g;
  only_g.x = false;
  only_g.h0 = false;
  const Result got = run(p, Device::CUDA, DType::BF16, only_g);
  const Result full = run(p, Device::CUDA, DType::BF16);
  EXPECT_FALSE(got.dx.defined());
  EXPECT_FALSE(got.dh0.defined());
  ASSERT_TRUE(got.dg.defined());
  EXPECT_EQ(got.dg.to_double_vector(), full.dg.to_double_vector());  // the same kernels on the same values
}

TEST(GatedScanCuda, IsBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{3, 500, 130};
  Rng rng(57);
  const Problem p = make_problem(rng, s, true, true, true);
  for (DType act : {DType::F32, DType::BF16}) {
    const Result a = run(p, Device::CUDA, act), b = run(p, Device::CUDA, act);
    EXPECT_EQ(a.output.to_double_vector(), b.output.to_double_vector());
    EXPECT_EQ(a.final_state.to_double_vector(), b.final_state.to_double_vector());
    EXPECT_EQ(a.dx.to_double_vector(), b.dx.to_double_vector());
    EXPECT_EQ(a.dg.to_double_vector(), b.dg.to_double_vector());
    EXPECT_EQ(a.dh0.to_double_vector(), b.dh0.to_double_vector());
  }
}

TEST(GatedScanCuda, RejectsWrongDtypes) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  const Var x = make_var(Tensor::zeros({1, 4, 2}, DType::BF16, Device::CUDA));
  const Var g32 = make_var(Tensor::zeros({1, 4, 2}, DType::F32, Device::CUDA));
  EXPECT_NO_THROW(gated_scan(tape, x, g32, nullptr));
  EXPECT_THROW(gated_scan(tape, x, make_var(Tensor::zeros({1, 4, 2}, DType::BF16, Device::CUDA)), nullptr), Error);
  EXPECT_THROW(gated_scan(tape, x, g32, make_var(Tensor::zeros({1, 2}, DType::BF16, Device::CUDA))), Error);
  EXPECT_THROW(gated_scan(tape, x, make_var(Tensor::zeros({1, 4, 2}, DType::F32)), nullptr), Error);  // a CPU g
}

}  // namespace
}  // namespace hgrn
