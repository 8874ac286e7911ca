// test_complex_gated_scan_cuda.cpp: the CUDA complex gated scan (kernels/complex_gated_scan.cu) against the CPU
// sequential form in fp64, computed from the very values the GPU sees (x and dO rounded through the activation dtype;
// g, θ, h0, dh_T through fp32): output, final state and every gradient (x_re, x_im, g, θ, h0), for sequence lengths
// around the 64-step chunk (1, 63, 64, 65, 130, 1000), odd channel counts (1, 7: one channel a thread; 130: two),
// with and without initial state, output gradient and final-state gradient, fp32 and bf16 x; accumulation into
// existing gradients, partial gradient requests, and bitwise run-to-run identity (θ's gradient is a fixed-order sum
// over batch and chunks). Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/complex_gated_scan.h"

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
  Tensor x_re, x_im, g, theta, h0, d_out, d_final;
};

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

// g: logsigmoid of N(2, 1) logits (forget gates mostly near 0.9, HGRN's regime), or almost no decay (g ≈ −1e-3: the
// state's memory spans the whole sequence and every chunk carry matters); θ ~ N(0, 1.5²) so that every rotation
// matters, including angles past π.
Problem make_problem(Rng& rng, const Sizes& s, bool with_initial, bool with_d_out, bool with_d_final,
                     bool slow_decay = false) {
  const Shape seq{s.batch, s.time, s.channels}, state{s.batch, 2, s.channels};
  Problem p;
  p.x_re = random_tensor(rng, seq);
  p.x_im = random_tensor(rng, seq);
  p.g = Tensor::empty(seq, DType::F64);
  for (int64_t i = 0; i < p.g.numel(); ++i) {
    const double u = rng.normal();
    p.g.set_item(i, slow_decay ? -1e-3 * (1.0 + 0.5 * std::abs(u)) : log_sigmoid(2.0 + u));
  }
  p.theta = random_tensor(rng, {s.channels}, 1.5);
  if (with_initial) p.h0 = random_tensor(rng, state);
  if (with_d_out) p.d_out = random_tensor(rng, {s.batch, s.time, 2 * s.channels});
  if (with_d_final) p.d_final = random_tensor(rng, state);
  return p;
}

// The values a run with activation dtype `act` sees (x, dO in act; g, θ, h0, dh_T in fp32), in fp64.
Problem rounded(const Problem& p, DType act) {
  auto r = [](const Tensor& t, DType dtype) { return t.defined() ? round_through(t, dtype) : Tensor(); };
  return {r(p.x_re, act), r(p.x_im, act), r(p.g, DType::F32),       r(p.theta, DType::F32),
          r(p.h0, DType::F32), r(p.d_out, act), r(p.d_final, DType::F32)};
}

struct Result {
  Tensor output, final_state, dx_re, dx_im, dg, dtheta, dh0;  // fp64 host copies (undefined where none was asked)
};

struct Wants {
  bool x = true, g = true, theta = true, h0 = true;
};

// Runs the op on `device` (CUDA: x, dO in act, the rest fp32; CPU: everything fp64 in the sequential form, the
// reference) and backpropagates L = <output, dO> + <final_state, dh_T>. initial_grads: gradients already there, which
// the backward must add to.
Result run(const Problem& p, Device device, DType act, const Wants& wants = {},
           const Problem* initial_grads = nullptr) {
  const bool gpu = device == Device::CUDA;
  auto put = [&](const Tensor& t, DType dtype) { return gpu ? to_gpu(t, dtype) : t.clone(); };
  const DType act_dtype = gpu ? act : DType::F64, f32 = gpu ? DType::F32 : DType::F64;
  Tape tape;
  Var xr = make_var(put(p.x_re, act_dtype), wants.x, "x_re");
  Var xi = make_var(put(p.x_im, act_dtype), wants.x, "x_im");
  Var g = make_var(put(p.g, f32), wants.g, "g");
  Var theta = make_var(put(p.theta, f32), wants.theta, "theta");
  Var h0 = p.h0.defined() ? make_var(put(p.h0, f32), wants.h0, "h0") : nullptr;
  if (initial_grads) {
    xr->grad = put(initial_grads->x_re, act_dtype);
    xi->grad = put(initial_grads->x_im, act_dtype);
    g->grad = put(initial_grads->g, f32);
    theta->grad = put(initial_grads->theta, f32);
    if (h0) h0->grad = put(initial_grads->h0, f32);
  }
  ComplexGatedScanOutputs r =
      complex_gated_scan(tape, xr, xi, g, theta, h0, gpu ? ScanMode::Chunk : ScanMode::Sequential);
  if (r.output->requires_grad) {
    if (p.d_out.defined()) {
      if (p.d_final.defined()) r.final_state->grad = put(p.d_final, f32);
      tape.backward(r.output, put(p.d_out, act_dtype));
    } else if (p.d_final.defined()) {
      tape.backward(r.final_state, put(p.d_final, f32));
    }
  }
  auto grad = [](const Var& v) { return v && v->grad.defined() ? to_host_f64(v->grad) : Tensor(); };
  return {to_host_f64(r.output->value), to_host_f64(r.final_state->value), grad(xr), grad(xi), grad(g), grad(theta),
          grad(h0)};
}

// Tolerances of one comparison: relative RMS error, and max abs error relative to the reference's largest entry.
struct Tol {
  double rel_rms, max_rel;
};
// fp32 state throughout: the kernels and the reference differ by fp32 rounding of the steps, of expf and sincosf
// (~1 ulp) and of the chunk carries (e^{S} e^{i n θ} with S a 64-term fp32 sum), compounded over up to 1000 barely
// decaying steps; dθ is a sum over B·T terms of both signs, whose cancellation loses a few more bits.
constexpr Tol kFp32{2e-5, 5e-5};
constexpr Tol kFp32Theta{1e-4, 2e-4};
// What bf16 x leaves: the output and dx are rounded to bf16 when stored (at most 2^-9 relative, RMS ~2^-9/√3). The
// final state, dg, dθ and dh0 are fp32 results of the rounded inputs and keep the fp32 bounds (dg and dθ take
// h_{t−1} in fp32: this is what fails if the backward read h from the bf16 output).
constexpr Tol kBf16Stored{2.5e-3, 4e-3};

void expect_matches(const Result& got, const Result& want, DType act, const std::string& context) {
  struct Pair {
    const char* name;
    const Tensor &got, &want;
    Tol tol;
  };
  const Tol stored = act == DType::BF16 ? kBf16Stored : kFp32;
  const Pair pairs[] = {{"output", got.output, want.output, stored},
                        {"final_state", got.final_state, want.final_state, kFp32},
                        {"dx_re", got.dx_re, want.dx_re, stored},
                        {"dx_im", got.dx_im, want.dx_im, stored},
                        {"dg", got.dg, want.dg, kFp32},
                        {"dtheta", got.dtheta, want.dtheta, kFp32Theta},
                        {"dh0", got.dh0, want.dh0, kFp32}};
  for (const Pair& p : pairs) {
    ASSERT_EQ(p.got.defined(), p.want.defined()) << p.name << ", " << context;
    if (!p.want.defined()) continue;
    // A reference below fp32's range (dh0 through 1000 decaying steps) underflows to 0 or denormals in fp32, which is
    // right: such results are held to an absolute bound at the bottom of fp32's normal range.
    constexpr double kFp32Underflow = 1e-37;
    const double scale = max_abs(p.want);
    if (scale < kFp32Underflow) {
      const testing::Discrepancy d = testing::compare(p.got, p.want);
      EXPECT_EQ(d.non_finite, 0) << p.name << ", " << context;
      EXPECT_LE(d.max_abs, kFp32Underflow) << p.name << ", " << context << ": reference below fp32's range";
      continue;
    }
    testing::expect_close(p.got, p.want, p.tol.rel_rms, p.tol.max_rel * scale, std::string(p.name) + ", " + context);
  }
}

void expect_gpu_matches_cpu(const Problem& p, DType act, const std::string& context, const Wants& wants = {}) {
  const Result got = run(p, Device::CUDA, act, wants);
  const Result want = run(rounded(p, act), Device::CPU, DType::F64, wants);
  expect_matches(got, want, act, context);
}

// ---------------------------------------------------------------------------------------------------------------------

TEST(ComplexGatedScanCuda, MatchesCpuReferenceAcrossShapes) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(301);
  int variant = 0;
  for (int64_t time : {1, 63, 64, 65, 130, 1000}) {
    for (int64_t channels : {1, 7, 130}) {
      for (DType act : {DType::F32, DType::BF16}) {
        // Rotate through the optional inputs so that every combination meets several shapes.
        const bool with_initial = variant % 2 == 0, with_d_out = variant % 3 != 2, with_d_final = variant % 3 != 1;
        ++variant;
        const Sizes s{2, time, channels};
        const std::string context = s.str() + " " + dtype_name(act) + (with_initial ? " h0" : "") +
                                    (with_d_out ? " dO" : "") + (with_d_final ? " dh_T" : "");
        SCOPED_TRACE(context);
        expect_gpu_matches_cpu(make_problem(rng, s, with_initial, with_d_out, with_d_final), act, context);
      }
    }
  }
}

// Almost no decay: the state's memory spans all 1000 steps, so every chunk's carry (the chunk decay e^{S} e^{i64θ},
// and the reverse one with a partial last chunk) shapes every later output and earlier gradient.
TEST(ComplexGatedScanCuda, SlowDecayCarriesAcrossEveryChunk) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(302);
  for (DType act : {DType::F32, DType::BF16}) {
    for (int64_t time : {130, 1000}) {
      const Sizes s{3, time, 33};
      const std::string context = s.str() + " " + dtype_name(act) + " slow decay";
      SCOPED_TRACE(context);
      expect_gpu_matches_cpu(make_problem(rng, s, true, true, true, /*slow_decay=*/true), act, context);
    }
  }
}

// Gradients already there are added to (the GPU overwrites only fresh buffers); each input alone may want one.
TEST(ComplexGatedScanCuda, AccumulatesAndHonoursPartialRequests) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(303);
  const Sizes s{2, 130, 12};
  const Problem p = make_problem(rng, s, true, true, true);
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    Problem initial = make_problem(rng, s, true, false, false);
    initial.x_re = round_through(initial.x_re, act);
    initial.x_im = round_through(initial.x_im, act);
    const Result got = run(p, Device::CUDA, act, {}, &initial);
    Result want = run(rounded(p, act), Device::CPU, DType::F64);
    auto plus = [](const Tensor& a, const Tensor& b) {
      Tensor sum = a.clone();
      for (int64_t i = 0; i < sum.numel(); ++i) sum.set_item(i, a.item(i) + b.item(i));
      return sum;
    };
    want.dx_re = plus(want.dx_re, initial.x_re);
    want.dx_im = plus(want.dx_im, initial.x_im);
    want.dg = plus(want.dg, round_through(initial.g, DType::F32));
    want.dtheta = plus(want.dtheta, round_through(initial.theta, DType::F32));
    want.dh0 = plus(want.dh0, round_through(initial.h0, DType::F32));
    expect_matches(got, want, act, "accumulated");
    for (int only = 0; only < 4; ++only) {
      const Wants wants{only == 0, only == 1, only == 2, only == 3};
      SCOPED_TRACE(::testing::Message() << "only input " << only << " wants a gradient");
      expect_gpu_matches_cpu(p, act, "partial", wants);
    }
  }
}

// No atomics: two runs give the same bits, θ's gradient (summed over batch and chunks) included.
TEST(ComplexGatedScanCuda, ForwardAndBackwardAreBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(304);
  const Problem p = make_problem(rng, {4, 1000, 130}, true, true, true);
  for (DType act : {DType::F32, DType::BF16}) {
    const Result a = run(p, Device::CUDA, act), b = run(p, Device::CUDA, act);
    const std::vector<std::pair<const char*, std::pair<Tensor, Tensor>>> pairs = {
        {"output", {a.output, b.output}}, {"final_state", {a.final_state, b.final_state}},
        {"dx_re", {a.dx_re, b.dx_re}},    {"dx_im", {a.dx_im, b.dx_im}},
        {"dg", {a.dg, b.dg}},             {"dtheta", {a.dtheta, b.dtheta}},
        {"dh0", {a.dh0, b.dh0}}};
    for (const auto& [name, t] : pairs)
      EXPECT_EQ(std::memcmp(t.first.raw_data(), t.second.raw_data(), t.first.nbytes()), 0)
          << name << " differs between runs (" << dtype_name(act) << ")";
  }
}

// The GPU's dtypes: x_re, x_im in the activation dtype, g, θ and the state fp32; a mix is refused.
TEST(ComplexGatedScanCuda, RefusesMixedDtypes) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(305);
  const Problem p = make_problem(rng, {1, 5, 4}, false, true, false);
  Tape tape;
  const Var xr = make_var(to_gpu(p.x_re, DType::BF16)), xi = make_var(to_gpu(p.x_im, DType::BF16));
  const Var theta = make_var(to_gpu(p.theta, DType::F32));
  EXPECT_THROW(complex_gated_scan(tape, xr, xi, make_var(to_gpu(p.g, DType::BF16)), theta, nullptr), Error);
  EXPECT_THROW(complex_gated_scan(tape, xr, make_var(to_gpu(p.x_im, DType::F32)), make_var(to_gpu(p.g, DType::F32)),
                                  theta, nullptr),
               Error);
  EXPECT_NO_THROW(complex_gated_scan(tape, xr, xi, make_var(to_gpu(p.g, DType::F32)), theta, nullptr));
}

}  // namespace
}  // namespace hgrn
