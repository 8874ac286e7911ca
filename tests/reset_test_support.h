// reset_test_support.h: what the tests of the recurrences' per-token resets share (ops/sequence_resets.h): reset
// patterns, and one harness that runs any of the recurrences (gated_scan, lower_bounded_gated_scan,
// complex_gated_scan, gla_recurrence) with or without resets on fp64 host inputs and collects every output and
// gradient, so that the same checks apply to each: the chunk form equals the step-by-step one, a packed sequence equals
// its segments run one by one, and the GPU equals the CPU reference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "gradcheck.h"

namespace hgrn::testing {

// The reset positions of each sequence of a batch.
using ResetRows = std::vector<std::vector<int64_t>>;

// int32 [B, T] flags, 1 at the given positions.
inline Tensor reset_flags(const ResetRows& rows, int64_t time) {
  Tensor flags = Tensor::zeros({static_cast<int64_t>(rows.size()), time}, DType::I32);
  for (size_t b = 0; b < rows.size(); ++b)
    for (int64_t t : rows[b])
      if (t >= 0 && t < time) flags.data<int32_t>()[static_cast<int64_t>(b) * time + t] = 1;
  return flags;
}

// The patterns every reset test covers, one per sequence of a batch of `batch` (cycled): none; at t = 0; at the
// 64-step chunk boundaries and 16-step sub-chunk boundaries (and the last step); several in one chunk, two of them
// adjacent; every step; and random ones (each step with probability 1/8).
inline ResetRows reset_patterns(Rng& rng, int64_t batch, int64_t time) {
  ResetRows rows;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> r;
    switch (b % 6) {
      case 0: break;
      case 1: r = {0}; break;
      case 2:
        for (int64_t t = 16; t < time; t += 16) r.push_back(t);
        r.push_back(time - 1);
        break;
      case 3: r = {3, 5, 6, 40, 63}; break;
      case 4:
        for (int64_t t = 0; t < time; ++t) r.push_back(t);
        break;
      default:
        for (int64_t t = 0; t < time; ++t)
          if (rng.below(8) == 0) r.push_back(t);
    }
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    rows.push_back(r);
  }
  return rows;
}

// The segments [begin, end) of one sequence of `time` steps that its resets cut it into.
inline std::vector<std::pair<int64_t, int64_t>> segments_of(const std::vector<int64_t>& resets, int64_t time) {
  std::vector<std::pair<int64_t, int64_t>> segments;
  int64_t begin = 0;
  for (int64_t t : resets)
    if (t > begin && t < time) {
      segments.emplace_back(begin, t);
      begin = t;
    }
  segments.emplace_back(begin, time);
  return segments;
}

// Steps [begin, end) of sequence b of a [B, T, ...] host tensor, as [1, end − begin, ...].
inline Tensor time_slice(const Tensor& t, int64_t b, int64_t begin, int64_t end) {
  const int64_t T = t.size(1), inner = t.numel() / (t.size(0) * T);
  Shape shape = t.shape();
  shape[0] = 1;
  shape[1] = end - begin;
  Tensor out = Tensor::empty(shape, t.dtype());
  for (int64_t i = 0; i < (end - begin) * inner; ++i) out.set_item(i, t.item((b * T + begin) * inner + i));
  return out;
}
// Writes a [1, n, ...] tensor into steps [begin, begin + n) of sequence b of dst.
inline void paste_time(Tensor& dst, const Tensor& part, int64_t b, int64_t begin) {
  const int64_t T = dst.size(1), inner = dst.numel() / (dst.size(0) * T);
  for (int64_t i = 0; i < part.numel(); ++i) dst.set_item((b * T + begin) * inner + i, part.item(i));
}
// Sequence b of a [B, ...] host tensor as [1, ...] (undefined for an undefined one).
inline Tensor batch_row(const Tensor& t, int64_t b) {
  if (!t.defined()) return Tensor();
  Shape shape = t.shape();
  shape[0] = 1;
  const int64_t inner = t.numel() / t.size(0);
  Tensor out = Tensor::empty(shape, t.dtype());
  for (int64_t i = 0; i < inner; ++i) out.set_item(i, t.item(b * inner + i));
  return out;
}
inline void paste_row(Tensor& dst, const Tensor& part, int64_t b) {
  for (int64_t i = 0; i < part.numel(); ++i) dst.set_item(b * part.numel() + i, part.item(i));
}

// One call's inputs, fp64 on the host: per-step inputs [B, T, ...] (x, g, ...), the initial state [B, ...]
// (undefined: none), inputs shared by every sequence (θ, γ), and the cotangents of the output and the final state.
struct RecurrenceProblem {
  std::vector<Tensor> steps;
  Tensor initial;
  std::vector<Tensor> shared;
  Tensor d_output, d_final;
};

// fp64 log decays logsigmoid(u), u ~ N(1, 1): from almost none to strong decay per step.
inline Tensor log_gates(Rng& rng, const Shape& shape) {
  const auto log_sigmoid = [](double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); };
  Tensor g = Tensor::empty(shape, DType::F64);
  for (int64_t i = 0; i < g.numel(); ++i) g.set_item(i, log_sigmoid(1.0 + rng.normal()));
  return g;
}

// The GLA recurrence's problems for H heads of K keys and V values: q, k, v and a log gate per key channel
// [B, T, H·K], or per head [B, T, H] (the scalar-decay mode).
inline std::function<RecurrenceProblem(Rng&, int64_t, int64_t, bool)> gla_problem(int64_t H, int64_t K, int64_t V,
                                                                                  bool per_head_gate) {
  return [=](Rng& rng, int64_t B, int64_t T, bool with_initial) {
    RecurrenceProblem p;
    const Shape keys{B, T, H * K};
    p.steps = {random_tensor(rng, keys), random_tensor(rng, keys), random_tensor(rng, {B, T, H * V}),
               log_gates(rng, per_head_gate ? Shape{B, T, H} : keys)};
    if (with_initial) p.initial = random_tensor(rng, {B, H, K, V});
    p.d_output = random_tensor(rng, {B, T, H * V});
    p.d_final = random_tensor(rng, {B, H, K, V});
    return p;
  };
}

// Everything a call produces, as fp64 host tensors.
struct RecurrenceOutcome {
  Tensor output, final_state;
  std::vector<Tensor> d_steps, d_shared;
  Tensor d_initial;
};

// Records the op on the tape: (per-step Vars, initial state Var or null, shared Vars, resets) -> {output, final}.
using RecurrenceCall = std::function<std::pair<Var, Var>(Tape&, const std::vector<Var>&, const Var&,
                                                         const std::vector<Var>&, const Tensor&)>;

// How a problem's tensors are placed for a call: the per-step inputs' dtypes (in order), the dtype of the initial
// state, the shared inputs and the final state's cotangent, and the device. The CPU reference: all fp64.
struct Placement {
  Device device = Device::CPU;
  std::vector<DType> steps;  // empty: all fp64
  DType state = DType::F64;
  DType output = DType::F64;  // the output's cotangent
};

inline Tensor place(const Tensor& host, DType dtype, Device device) {
  Tensor t = host.dtype() == dtype ? host.clone() : host.to(dtype);
  return device == Device::CPU ? t : t.to(device);
}
inline Tensor host_f64(const Tensor& t) {
  if (!t.defined()) return Tensor();
  const Tensor host = t.device() == Device::CPU ? t : t.to(Device::CPU);
  return host.dtype() == DType::F64 ? host.clone() : host.to(DType::F64);
}

// Runs `call` on p (every input wanting a gradient) and backpropagates <output, d_output> + <final, d_final>.
inline RecurrenceOutcome run_recurrence(const RecurrenceCall& call, const RecurrenceProblem& p, const Tensor& resets,
                                        const Placement& at = {}) {
  Tape tape;
  std::vector<Var> steps, shared;
  for (size_t i = 0; i < p.steps.size(); ++i)
    steps.push_back(make_var(place(p.steps[i], at.steps.empty() ? DType::F64 : at.steps[i], at.device), true));
  for (const Tensor& s : p.shared) shared.push_back(make_var(place(s, at.state, at.device), true));
  const Var initial = p.initial.defined() ? make_var(place(p.initial, at.state, at.device), true) : nullptr;
  const Tensor placed_resets = resets.defined() ? place(resets, resets.dtype(), at.device) : Tensor();
  auto [output, final_state] = call(tape, steps, initial, shared, placed_resets);
  if (p.d_final.defined()) final_state->grad = place(p.d_final, at.state, at.device);
  if (p.d_output.defined())
    tape.backward(output, place(p.d_output, at.output, at.device));
  else
    tape.backward(final_state, final_state->grad);
  RecurrenceOutcome r;
  r.output = host_f64(output->value);
  r.final_state = host_f64(final_state->value);
  auto grad = [](const Var& v) { return v && v->grad.defined() ? host_f64(v->grad) : Tensor(); };
  for (const Var& v : steps) r.d_steps.push_back(grad(v));
  for (const Var& v : shared) r.d_shared.push_back(grad(v));
  r.d_initial = grad(initial);
  return r;
}

// max|x − ref| / max|ref| (0 for two all-zero tensors); NaN propagates.
inline double relative_error(const Tensor& x, const Tensor& ref) {
  EXPECT_EQ(shape_str(x.shape()), shape_str(ref.shape()));
  double worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double diff = std::abs(x.item(i) - ref.item(i));
    if (std::isnan(diff)) return diff;
    worst = std::max(worst, diff);
  }
  const double scale = max_abs(ref);
  return scale > 0 ? worst / scale : (worst > 0 ? INFINITY : 0.0);
}

// Every output and gradient of `got` within tol of `want` (relative to each tensor's largest entry).
inline void expect_outcomes_match(const RecurrenceOutcome& got, const RecurrenceOutcome& want, double tol,
                                  const std::string& context) {
  auto check = [&](const Tensor& a, const Tensor& b, const std::string& name) {
    ASSERT_EQ(a.defined(), b.defined()) << name << ", " << context;
    if (b.defined()) EXPECT_LE(relative_error(a, b), tol) << name << ", " << context;
  };
  check(got.output, want.output, "output");
  check(got.final_state, want.final_state, "final state");
  for (size_t i = 0; i < want.d_steps.size(); ++i)
    check(got.d_steps[i], want.d_steps[i], "d step input " + std::to_string(i));
  for (size_t i = 0; i < want.d_shared.size(); ++i)
    check(got.d_shared[i], want.d_shared[i], "d shared input " + std::to_string(i));
  check(got.d_initial, want.d_initial, "d initial state");
}

// The packed call's outcome assembled from its segments run one by one without resets (the definition of a reset):
// each sequence's segments in order, the first from the initial state unless a reset is at step 0, the others from the
// zero state; the final state is the last segment's, which alone gets the final state's cotangent; the shared inputs'
// gradients are the sums over all segments (in segment order).
inline RecurrenceOutcome run_segments_alone(const RecurrenceCall& call, const RecurrenceProblem& p,
                                            const ResetRows& resets) {
  const int64_t B = p.steps[0].size(0), T = p.steps[0].size(1);
  RecurrenceOutcome whole;
  for (const Tensor& s : p.steps) whole.d_steps.push_back(Tensor::zeros(s.shape(), DType::F64));
  for (const Tensor& s : p.shared) whole.d_shared.push_back(Tensor::zeros(s.shape(), DType::F64));
  if (p.initial.defined()) whole.d_initial = Tensor::zeros(p.initial.shape(), DType::F64);
  for (int64_t b = 0; b < B; ++b) {
    for (const auto& [begin, end] : segments_of(resets[static_cast<size_t>(b)], T)) {
      RecurrenceProblem part;
      for (const Tensor& s : p.steps) part.steps.push_back(time_slice(s, b, begin, end));
      const bool from_initial = begin == 0 && p.initial.defined() &&
                                (resets[static_cast<size_t>(b)].empty() || resets[static_cast<size_t>(b)][0] != 0);
      if (from_initial) part.initial = batch_row(p.initial, b);
      part.shared = p.shared;
      if (p.d_output.defined()) part.d_output = time_slice(p.d_output, b, begin, end);
      // The last segment's final state is the sequence's; an earlier one's feeds nothing (no cotangent).
      if (end == T) part.d_final = batch_row(p.d_final, b);
      const RecurrenceOutcome r = run_recurrence(call, part, Tensor());
      if (!whole.output.defined()) {
        Shape out_shape = r.output.shape();
        out_shape[0] = B;
        out_shape[1] = T;
        whole.output = Tensor::zeros(out_shape, DType::F64);
        Shape state_shape = r.final_state.shape();
        state_shape[0] = B;
        whole.final_state = Tensor::zeros(state_shape, DType::F64);
      }
      paste_time(whole.output, r.output, b, begin);
      if (end == T) paste_row(whole.final_state, r.final_state, b);
      for (size_t i = 0; i < p.steps.size(); ++i)
        if (r.d_steps[i].defined()) paste_time(whole.d_steps[i], r.d_steps[i], b, begin);
      for (size_t i = 0; i < p.shared.size(); ++i)
        if (r.d_shared[i].defined())
          for (int64_t j = 0; j < r.d_shared[i].numel(); ++j)
            whole.d_shared[i].set_item(j, whole.d_shared[i].item(j) + r.d_shared[i].item(j));
      if (from_initial && r.d_initial.defined()) paste_row(whole.d_initial, r.d_initial, b);
    }
  }
  return whole;
}

}  // namespace hgrn::testing
