// test_recurrence_resets_cuda.cpp: the recurrences' per-token resets on the GPU (the 64-bit per-chunk masks of
// kernels/sequence_resets.cu read by every chunked kernel) against the fp64 CPU reference with the same resets, on the
// values the GPU sees (inputs rounded through their GPU dtypes): gated_scan, lower_bounded_gated_scan,
// complex_gated_scan, gla_recurrence (per-channel and scalar decays), and a layer's HGRN2 gates feeding gla_recurrence
// (the recurrence's backward then runs the gates' backward in its epilogue). Outputs, final states and every gradient,
// fp32 and bf16, with and without an initial state, over lengths around the 64-step chunk and several chunks, each
// batch holding every reset pattern (none, at step 0, on 16- and 64-step boundaries and the last step, several in one
// chunk, every step, random). Plus: all-zero flags give the bits of no flags, and the per-chunk masks themselves.
// Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "hgru2_test_support.h"
#include "ops/complex_gated_scan.h"
#include "ops/gated_scan.h"
#include "ops/gla_recurrence.h"
#include "ops/hgrn2_gates.h"
#include "ops/lower_bounded_gated_scan.h"
#include "ops/sequence_resets.h"
#include "reset_test_support.h"

namespace hgrn {
namespace {

using testing::RecurrenceCall;
using testing::RecurrenceOutcome;
using testing::RecurrenceProblem;
using testing::log_gates;
using testing::random_tensor;
using testing::expect_close;
using testing::round_through;
using testing::Tol;

// Per-result tolerances of one op in one activation dtype.
struct Tolerances {
  Tol output, final_state, d_initial;
  std::vector<Tol> d_steps, d_shared;
};

// Tolerances, as in each op's own GPU tests (and for the same reasons: resets only zero some terms):
// fp32 state and arithmetic throughout: fp32 rounding of the steps, exps and chunk carries.
constexpr Tol kFp32Scan{2e-5, 5e-5};
// Sums over B·T terms of both signs (γ's, θ's gradients): fp32 rounding relative to the terms, not the sum.
constexpr Tol kFp32Sum{3e-4, 1e-3};
// Results stored in bf16 (outputs, gradients of bf16 inputs): at most 2^-9 relative, RMS ~2^-9/√3.
constexpr Tol kBf16Stored{2.5e-3, 4e-3};
// bf16 results that also read a bf16-stored value in a difference that can cancel (lower_bounded's df̂, dγ read
// h_{t−1} from o).
constexpr Tol kBf16FromOutput{5e-3, 8e-3};

// An op under test: its problem, its call, its GPU dtypes, and its tolerances per activation dtype.
struct GpuRecurrence {
  std::string name;
  std::function<RecurrenceProblem(Rng&, int64_t batch, int64_t time, bool with_initial)> problem;
  RecurrenceCall call;  // the same call on both devices (the GPU runs its chunked kernels whatever the mode)
  std::function<std::vector<DType>(DType act)> step_dtypes;
  std::function<Tolerances(DType act)> tolerances;
};

constexpr int64_t kLayers = 3;

std::vector<GpuRecurrence> recurrences(int64_t channels, int64_t heads, int64_t key, int64_t value) {
  const int64_t C = channels, H = heads, K = key, V = value;
  std::vector<GpuRecurrence> all;
  all.push_back({"gated_scan",
                 [=](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   p.steps = {random_tensor(rng, {B, T, C}), log_gates(rng, {B, T, C})};
                   if (with_initial) p.initial = random_tensor(rng, {B, C});
                   p.d_output = random_tensor(rng, {B, T, C});
                   p.d_final = random_tensor(rng, {B, C});
                   return p;
                 },
                 [](Tape& t, const std::vector<Var>& s, const Var& h0, const std::vector<Var>&, const Tensor& r) {
                   const GatedScanOutputs o = gated_scan(t, s[0], s[1], h0, ScanMode::Chunk, 0, r);
                   return std::pair{o.output, o.final_state};
                 },
                 [](DType act) { return std::vector<DType>{act, DType::F32}; },
                 [](DType act) {
                   const Tol stored = act == DType::BF16 ? kBf16Stored : kFp32Scan;
                   return Tolerances{stored, kFp32Scan, kFp32Scan, {stored, kFp32Scan}, {}};
                 }});
  all.push_back({"lower_bounded_gated_scan",
                 [=](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   p.steps = {random_tensor(rng, {B, T, C}), random_tensor(rng, {B, T, C}, 1.5)};
                   Tensor gamma = Tensor::zeros({kLayers, C}, DType::F64);
                   for (int64_t i = C; i < gamma.numel(); ++i) gamma.set_item(i, 0.05 + 0.9 * rng.uniform());
                   p.shared = {round_through(gamma, DType::F32)};
                   if (with_initial) p.initial = random_tensor(rng, {B, C});
                   p.d_output = random_tensor(rng, {B, T, C});
                   p.d_final = random_tensor(rng, {B, C});
                   return p;
                 },
                 [](Tape& t, const std::vector<Var>& s, const Var& h0, const std::vector<Var>& shared,
                    const Tensor& r) {
                   const GatedScanOutputs o =
                       lower_bounded_gated_scan(t, s[0], s[1], shared[0], 1, h0, ScanMode::Chunk, r);
                   return std::pair{o.output, o.final_state};
                 },
                 [](DType act) { return std::vector<DType>{act, act}; },
                 [](DType act) {
                   const bool bf16 = act == DType::BF16;
                   const Tol stored = bf16 ? kBf16Stored : kFp32Scan;
                   return Tolerances{stored, kFp32Scan, kFp32Scan, {stored, bf16 ? kBf16FromOutput : kFp32Scan},
                                     {bf16 ? kBf16FromOutput : kFp32Sum}};
                 }});
  all.push_back({"complex_gated_scan",
                 [=](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   p.steps = {random_tensor(rng, {B, T, C}), random_tensor(rng, {B, T, C}), log_gates(rng, {B, T, C})};
                   p.shared = {random_tensor(rng, {C})};
                   if (with_initial) p.initial = random_tensor(rng, {B, 2, C});
                   p.d_output = random_tensor(rng, {B, T, 2 * C});
                   p.d_final = random_tensor(rng, {B, 2, C});
                   return p;
                 },
                 [](Tape& t, const std::vector<Var>& s, const Var& h0, const std::vector<Var>& shared,
                    const Tensor& r) {
                   const ComplexGatedScanOutputs o =
                       complex_gated_scan(t, s[0], s[1], s[2], shared[0], h0, ScanMode::Chunk, 0, r);
                   return std::pair{o.output, o.final_state};
                 },
                 [](DType act) { return std::vector<DType>{act, act, DType::F32}; },
                 [](DType act) {
                   const Tol stored = act == DType::BF16 ? kBf16Stored : kFp32Scan;
                   return Tolerances{stored, kFp32Scan, kFp32Scan, {stored, stored, kFp32Scan}, {kFp32Sum}};
                 }});
  // The recurrence's own tolerances (hgru2_test_support.h) for every result.
  const auto gla_tolerances = [](DType act) {
    const Tol t = act == DType::BF16 ? testing::kBf16 : testing::kFp32;
    return Tolerances{t, t, t, {t, t, t, t}, {}};
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  // The scalar-decay mode (a log gate per head) runs the kernels' scalar-decay builds on the GPU: dg summed per
  // K-tile, then over the K-tiles where K > 64.
  const auto gla_problem = [=](bool per_head_gate) { return testing::gla_problem(H, K, V, per_head_gate); };
  const auto gla_call = [=](Tape& t, const std::vector<Var>& s, const Var& s0, const std::vector<Var>&,
                            const Tensor& r) {
    const int64_t chunk = s[0]->value.device() == Device::CUDA ? 0 : 64;
    const GlaOutputs o =
        gla_recurrence(t, s[0], s[1], s[2], s[3], s0, H, scale, RecurrenceMode::Chunk, chunk, nullptr, false, r);
    return std::pair{o.output, o.final_state};
  };
  const auto gla_dtypes = [](DType act) { return std::vector<DType>{act, act, act, DType::F32}; };
  all.push_back({"gla_recurrence", gla_problem(false), gla_call, gla_dtypes, gla_tolerances});
  all.push_back({"gla_recurrence_scalar_decay", gla_problem(true), gla_call, gla_dtypes, gla_tolerances});
  // The scalar-decay mode with a constant g [H] (RetNet's decays, packed sequences): the kernels' scalar-decay builds
  // reading g with row stride 0. g is a constant (no gradient), made in the call on q's device, its values exact in
  // fp32 so that both devices see the same.
  all.push_back({"gla_recurrence_per_head_decay",
                 [=](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   const Shape keys{B, T, H * K};
                   p.steps = {random_tensor(rng, keys), random_tensor(rng, keys), random_tensor(rng, {B, T, H * V})};
                   if (with_initial) p.initial = random_tensor(rng, {B, H, K, V});
                   p.d_output = random_tensor(rng, {B, T, H * V});
                   p.d_final = random_tensor(rng, {B, H, K, V});
                   return p;
                 },
                 [=](Tape& t, const std::vector<Var>& s, const Var& s0, const std::vector<Var>&, const Tensor& r) {
                   const Device device = s[0]->value.device();
                   Tensor decays = Tensor::empty({H}, DType::F64);
                   for (int64_t h = 0; h < H; ++h)
                     decays.set_item(h, std::log(1.0 - std::pow(2.0, -5.0 - static_cast<double>(h % 4))));
                   decays = round_through(decays, DType::F32);
                   const Var g = make_var(testing::place(decays, device == Device::CUDA ? DType::F32 : DType::F64,
                                                         device),
                                          false);
                   const int64_t chunk = device == Device::CUDA ? 0 : 64;
                   const GlaOutputs o =
                       gla_recurrence(t, s[0], s[1], s[2], g, s0, H, scale, RecurrenceMode::Chunk, chunk, nullptr, false, r);
                   return std::pair{o.output, o.final_state};
                 },
                 [](DType act) { return std::vector<DType>{act, act, act}; },
                 [](DType act) {
                   const Tol t = act == DType::BF16 ? testing::kBf16 : testing::kFp32;
                   return Tolerances{t, t, t, {t, t, t}, {}};
                 }});
  // As the model wires them: q = silu(q̂), g and k from f̂ and layer 1's γ, the gates' origin handed on, so that the
  // GPU backward forms q̂'s, f̂'s and γ's gradients in the recurrence's epilogue.
  all.push_back({"hgrn2_gates_gla_recurrence",
                 [=](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   Tensor f_hat = random_tensor(rng, {B, T, H * K}, 1.5);
                   for (int64_t i = 0; i < f_hat.numel(); ++i) f_hat.set_item(i, 2.0 + f_hat.item(i));
                   p.steps = {random_tensor(rng, {B, T, H * K}), f_hat, random_tensor(rng, {B, T, H * V})};
                   Tensor gamma = Tensor::zeros({kLayers, H * K}, DType::F64);
                   for (int64_t i = H * K; i < gamma.numel(); ++i) gamma.set_item(i, 0.02 + 0.96 * rng.uniform());
                   p.shared = {round_through(gamma, DType::F32)};
                   if (with_initial) p.initial = random_tensor(rng, {B, H, K, V});
                   p.d_output = random_tensor(rng, {B, T, H * V});
                   p.d_final = random_tensor(rng, {B, H, K, V});
                   return p;
                 },
                 [=](Tape& t, const std::vector<Var>& s, const Var& s0, const std::vector<Var>& shared,
                     const Tensor& r) {
                   const Hgrn2Gates gates = hgrn2_gates(t, s[0], s[1], shared[0], 1);
                   const GlaOutputs o =
                       gla_recurrence(t, gates.q, gates.k, s[2], gates.g, s0, H, scale, RecurrenceMode::Chunk,
                                      s[0]->value.device() == Device::CUDA ? 0 : 64, gates.origin, false, r);
                   return std::pair{o.output, o.final_state};
                 },
                 [](DType act) { return std::vector<DType>{act, act, act}; },
                 [](DType act) {
                   const Tol t = act == DType::BF16 ? testing::kBf16 : testing::kFp32;
                   return Tolerances{t, t, t, {t, t, t}, {t}};
                 }});
  return all;
}

// The problem as the GPU sees it: per-step inputs through their dtypes, the rest through fp32 (the output's cotangent
// through act).
RecurrenceProblem rounded(const RecurrenceProblem& p, const std::vector<DType>& steps, DType act) {
  RecurrenceProblem r;
  for (size_t i = 0; i < p.steps.size(); ++i) r.steps.push_back(round_through(p.steps[i], steps[i]));
  for (const Tensor& s : p.shared) r.shared.push_back(round_through(s, DType::F32));
  if (p.initial.defined()) r.initial = round_through(p.initial, DType::F32);
  r.d_output = round_through(p.d_output, act);
  r.d_final = round_through(p.d_final, DType::F32);
  return r;
}

void expect_within(const RecurrenceOutcome& got, const RecurrenceOutcome& want, const Tolerances& tol,
                   const std::string& context) {
  auto check = [&](const Tensor& a, const Tensor& b, const Tol& t, const std::string& name) {
    ASSERT_EQ(a.defined(), b.defined()) << name << ", " << context;
    if (!b.defined()) return;
    // A reference below fp32's range underflows to 0 or denormals on the GPU, which is right: an absolute bound there.
    constexpr double kFp32Underflow = 1e-37;
    const double scale = testing::max_abs(b);
    if (scale < kFp32Underflow) {
      EXPECT_LE(testing::compare(a, b).max_abs, kFp32Underflow) << name << ", " << context;
      return;
    }
    testing::expect_close(a, b, t.rel_rms, t.max_rel * scale, name + ", " + context);
  };
  check(got.output, want.output, tol.output, "output");
  check(got.final_state, want.final_state, tol.final_state, "final state");
  check(got.d_initial, want.d_initial, tol.d_initial, "d initial state");
  for (size_t i = 0; i < want.d_steps.size(); ++i)
    check(got.d_steps[i], want.d_steps[i], tol.d_steps[i], "d step input " + std::to_string(i));
  for (size_t i = 0; i < want.d_shared.size(); ++i)
    check(got.d_shared[i], want.d_shared[i], tol.d_shared[i], "d shared input " + std::to_string(i));
}

void expect_gpu_matches_cpu(const GpuRecurrence& op, int64_t time, bool with_initial, DType act, uint64_t seed,
                            const std::string& shape) {
  Rng rng(seed);
  const int64_t batch = 6;  // one sequence per reset pattern
  const RecurrenceProblem p = op.problem(rng, batch, time, with_initial);
  const Tensor flags = testing::reset_flags(testing::reset_patterns(rng, batch, time), time);
  const std::vector<DType> dtypes = op.step_dtypes(act);
  testing::Placement gpu;
  gpu.device = Device::CUDA;
  gpu.steps = dtypes;
  gpu.state = DType::F32;
  gpu.output = act;
  const RecurrenceOutcome got = testing::run_recurrence(op.call, p, flags, gpu);
  const RecurrenceOutcome want = testing::run_recurrence(op.call, rounded(p, dtypes, act), flags);
  expect_within(got, want, op.tolerances(act),
                op.name + " " + shape + " T=" + std::to_string(time) + " " + dtype_name(act) +
                    (with_initial ? " with initial state" : ""));
}

TEST(RecurrenceResetsCuda, ScansMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  // Channel counts odd (one channel a thread) and wide (vector accesses); lengths around the chunk and several chunks.
  uint64_t seed = 1;
  for (int64_t channels : {7, 130})
    for (const GpuRecurrence& op : recurrences(channels, 1, 16, 16)) {
      if (op.name.find("gla") != std::string::npos) continue;
      for (int64_t time : {1, 63, 64, 65, 200, 700})
        for (DType act : {DType::F32, DType::BF16})
          expect_gpu_matches_cpu(op, time, (seed % 2) == 0, act, seed++, "C=" + std::to_string(channels));
    }
}

TEST(RecurrenceResetsCuda, GlaRecurrenceMatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  // K, V below, at and above the 64-wide tiles (partial last tiles); H·B = 6·50 = 300 with one K- and one V-tile and
  // 6·20 = 120 with two of each: the state pass's three-block and V-tile-pair builds on GPUs of 100-149 SMs.
  struct Shape {
    int64_t heads, key, value;
  };
  uint64_t seed = 100;
  for (const Shape& s : {Shape{2, 16, 32}, Shape{3, 60, 40}, Shape{2, 200, 96}, Shape{1, 128, 128}, Shape{50, 64, 64},
                         Shape{20, 128, 120}})
    for (const GpuRecurrence& op : recurrences(1, s.heads, s.key, s.value)) {
      if (op.name.find("gla") == std::string::npos) continue;
      const std::string shape =
          "H=" + std::to_string(s.heads) + " K=" + std::to_string(s.key) + " V=" + std::to_string(s.value);
      for (int64_t time : {1, 17, 64, 65, 200}) {
        if (s.heads >= 20 && time != 65) continue;  // the wide-grid builds: one length is enough
        for (DType act : {DType::F32, DType::BF16})
          expect_gpu_matches_cpu(op, time, (seed % 2) == 0, act, seed++, shape);
      }
    }
}

// All-zero flags run the kernels' reset builds, whose masked chunk sums round differently from the builds without
// resets (which are the unchanged kernels): the same results to rounding. fp32 states and gradients agree to ~1e-7
// relative; bf16 outputs and step gradients differ by one bf16 ulp where an fp32 value sits near a rounding boundary,
// so relative RMS 1e-3 and at most 2^-7 of the largest magnitude (~8 here: 0.07).
TEST(RecurrenceResetsCuda, AllZeroFlagsGiveTheResultsOfNoFlags) {
  HGRN_SKIP_WITHOUT_GPU();
  for (const GpuRecurrence& op : recurrences(130, 2, 64, 64)) {
    SCOPED_TRACE(op.name);
    Rng rng(7);
    const RecurrenceProblem p = op.problem(rng, 2, 150, true);
    testing::Placement gpu;
    gpu.device = Device::CUDA;
    const DType act = DType::BF16;
    gpu.steps = op.step_dtypes(act);
    gpu.state = DType::F32;
    gpu.output = act;
    const RecurrenceOutcome without = testing::run_recurrence(op.call, p, Tensor(), gpu);
    const RecurrenceOutcome with = testing::run_recurrence(op.call, p, Tensor::zeros({2, 150}, DType::I32), gpu);
    expect_close(with.output, without.output, 1e-3, 0.07, "output");
    expect_close(with.final_state, without.final_state, 1e-5, 1e-4, "final state");
    for (size_t i = 0; i < p.steps.size(); ++i)
      expect_close(with.d_steps[i], without.d_steps[i], 1e-3, 0.07, "step gradient " + std::to_string(i));
    for (size_t i = 0; i < p.shared.size(); ++i)
      expect_close(with.d_shared[i], without.d_shared[i], 1e-3, 0.07, "shared gradient " + std::to_string(i));
    expect_close(with.d_initial, without.d_initial, 1e-5, 1e-4, "initial-state gradient");
  }
}

TEST(RecurrenceResetsCuda, ChunkMasksHoldEachChunksFlags) {
  HGRN_SKIP_WITHOUT_GPU();
  for (int64_t time : {1, 31, 32, 64, 65, 200}) {
    Rng rng(static_cast<uint64_t>(time));
    const testing::ResetRows rows = testing::reset_patterns(rng, 6, time);
    const Tensor flags = testing::reset_flags(rows, time);
    const Tensor masks = reset_chunk_masks(flags.to(Device::CUDA)).to(Device::CPU);
    const int64_t chunks = (time + 63) / 64;
    ASSERT_EQ(masks.shape(), (Shape{6, chunks}));
    for (int64_t b = 0; b < 6; ++b)
      for (int64_t c = 0; c < chunks; ++c) {
        uint64_t want = 0;
        for (int64_t i = 0; i < 64 && c * 64 + i < time; ++i)
          if (flags.data<int32_t>()[b * time + c * 64 + i]) want |= uint64_t{1} << i;
        EXPECT_EQ(static_cast<uint64_t>(masks.data<int64_t>()[b * chunks + c]), want) << "T=" << time << " b=" << b;
      }
  }
}

}  // namespace
}  // namespace hgrn
