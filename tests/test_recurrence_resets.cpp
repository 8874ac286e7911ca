// test_recurrence_resets.cpp: the recurrences' per-token resets on the CPU (ops/sequence_resets.h), for every one of
// them (gated_scan, lower_bounded_gated_scan, complex_gated_scan, gla_recurrence with per-channel and scalar decays)
// in fp64: a packed sequence gives the outputs, final state and every gradient of its segments run one by one (the
// definition of a reset), the chunk forms equal the step-by-step ones over lengths around the chunk and chunk sizes
// that put resets on and off chunk boundaries, fp64 finite-difference gradients with resets, all-zero flags give the
// bits of no flags, a reset at step 0 cuts the initial state off, and bad flags are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "ops/complex_gated_scan.h"
#include "ops/gated_scan.h"
#include "ops/gla_recurrence.h"
#include "ops/lower_bounded_gated_scan.h"
#include "reset_test_support.h"

namespace hgrn {
namespace {

using testing::RecurrenceCall;
using testing::RecurrenceOutcome;
using testing::RecurrenceProblem;
using testing::ResetRows;
using testing::log_gates;
using testing::random_tensor;

// One recurrence under test: its problems and its call in a given form.
struct Recurrence {
  std::string name;
  bool chunked_form;  // has a chunk form besides the step-by-step one
  std::function<RecurrenceProblem(Rng&, int64_t batch, int64_t time, bool with_initial)> problem;
  std::function<RecurrenceCall(bool chunk, int64_t chunk_size)> call;
};

void PrintTo(const Recurrence& op, std::ostream* os) { *os << op.name; }

constexpr int64_t kChannels = 5;
constexpr int64_t kHeads = 2, kKey = 3, kValue = 4;

std::vector<Recurrence> recurrences() {
  std::vector<Recurrence> all;
  all.push_back({"gated_scan", true,
                 [](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   p.steps = {random_tensor(rng, {B, T, kChannels}), log_gates(rng, {B, T, kChannels})};
                   if (with_initial) p.initial = random_tensor(rng, {B, kChannels});
                   p.d_output = random_tensor(rng, {B, T, kChannels});
                   p.d_final = random_tensor(rng, {B, kChannels});
                   return p;
                 },
                 [](bool chunk, int64_t chunk_size) -> RecurrenceCall {
                   return [=](Tape& t, const std::vector<Var>& s, const Var& h0, const std::vector<Var>&,
                              const Tensor& resets) {
                     const GatedScanOutputs r = gated_scan(
                         t, s[0], s[1], h0, chunk ? ScanMode::Chunk : ScanMode::Sequential, chunk_size, resets);
                     return std::pair{r.output, r.final_state};
                   };
                 }});
  // HGRN1's whole recurrence from î and f̂, bounded (layer 1 of two: γ takes a gradient).
  all.push_back({"lower_bounded_gated_scan", true,
                 [](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   p.steps = {random_tensor(rng, {B, T, kChannels}), random_tensor(rng, {B, T, kChannels}, 1.5)};
                   Tensor gamma = Tensor::zeros({2, kChannels}, DType::F64);
                   for (int64_t c = 0; c < kChannels; ++c) gamma.set_item(kChannels + c, 0.2 + 0.1 * c);
                   p.shared = {gamma};
                   if (with_initial) p.initial = random_tensor(rng, {B, kChannels});
                   p.d_output = random_tensor(rng, {B, T, kChannels});
                   p.d_final = random_tensor(rng, {B, kChannels});
                   return p;
                 },
                 [](bool chunk, int64_t) -> RecurrenceCall {
                   return [=](Tape& t, const std::vector<Var>& s, const Var& h0, const std::vector<Var>& shared,
                              const Tensor& resets) {
                     const GatedScanOutputs r = lower_bounded_gated_scan(
                         t, s[0], s[1], shared[0], 1, h0, chunk ? ScanMode::Chunk : ScanMode::Sequential, resets);
                     return std::pair{r.output, r.final_state};
                   };
                 }});
  all.push_back({"complex_gated_scan", true,
                 [](Rng& rng, int64_t B, int64_t T, bool with_initial) {
                   RecurrenceProblem p;
                   p.steps = {random_tensor(rng, {B, T, kChannels}), random_tensor(rng, {B, T, kChannels}),
                              log_gates(rng, {B, T, kChannels})};
                   p.shared = {random_tensor(rng, {kChannels})};
                   if (with_initial) p.initial = random_tensor(rng, {B, 2, kChannels});
                   p.d_output = random_tensor(rng, {B, T, 2 * kChannels});
                   p.d_final = random_tensor(rng, {B, 2, kChannels});
                   return p;
                 },
                 [](bool chunk, int64_t chunk_size) -> RecurrenceCall {
                   return [=](Tape& t, const std::vector<Var>& s, const Var& h0, const std::vector<Var>& shared,
                              const Tensor& resets) {
                     const ComplexGatedScanOutputs r =
                         complex_gated_scan(t, s[0], s[1], s[2], shared[0], h0,
                                            chunk ? ScanMode::Chunk : ScanMode::Sequential, chunk_size, resets);
                     return std::pair{r.output, r.final_state};
                   };
                 }});
  const auto gla_problem = [](bool per_head_gate) {
    return testing::gla_problem(kHeads, kKey, kValue, per_head_gate);
  };
  const auto gla_call = [](bool chunk, int64_t chunk_size) -> RecurrenceCall {
    return [=](Tape& t, const std::vector<Var>& s, const Var& s0, const std::vector<Var>&, const Tensor& resets) {
      const GlaOutputs r = gla_recurrence(t, s[0], s[1], s[2], s[3], s0, kHeads, 0.5,
                                          chunk ? RecurrenceMode::Chunk : RecurrenceMode::Naive, chunk_size, nullptr,
                                          false, resets);
      return std::pair{r.output, r.final_state};
    };
  };
  all.push_back({"gla_recurrence", true, gla_problem(false), gla_call});
  all.push_back({"gla_recurrence_scalar_decay", true, gla_problem(true), gla_call});
  return all;
}

class RecurrenceResets : public ::testing::TestWithParam<Recurrence> {};

// fp64: the packed call and its segments compute the same sums, grouped differently only where a chunk boundary
// falls elsewhere in a segment run alone (rounding of O(1) values over at most a few hundred steps); a leak across a
// reset, or a missing carry, is O(1).
constexpr double kFp64Tolerance = 1e-10;

TEST_P(RecurrenceResets, PackedSequenceEqualsItsSegmentsRunOneByOne) {
  const Recurrence& op = GetParam();
  for (int64_t time : {1, 7, 64, 65, 150}) {
    for (bool with_initial : {false, true}) {
      Rng rng(10 * time + with_initial);
      const RecurrenceProblem p = op.problem(rng, 6, time, with_initial);
      const ResetRows rows = testing::reset_patterns(rng, 6, time);
      const Tensor flags = testing::reset_flags(rows, time);
      for (bool chunk : {false, true}) {
        for (int64_t chunk_size : {0, 16}) {
          if (!chunk && chunk_size) continue;
          const std::string context = op.name + " T=" + std::to_string(time) + " initial=" +
                                      std::to_string(with_initial) + (chunk ? " chunk " : " step by step ") +
                                      std::to_string(chunk_size);
          const RecurrenceOutcome packed = testing::run_recurrence(op.call(chunk, chunk_size), p, flags);
          const RecurrenceOutcome alone = testing::run_segments_alone(op.call(chunk, chunk_size), p, rows);
          testing::expect_outcomes_match(packed, alone, kFp64Tolerance, context);
        }
      }
    }
  }
}

TEST_P(RecurrenceResets, ChunkFormMatchesStepByStepWithResets) {
  // Chunk sizes 16 and 5 put the 16-step resets on chunk boundaries and off them; 0 is the op's default (64).
  const Recurrence& op = GetParam();
  for (int64_t time : {1, 15, 16, 17, 64, 65, 130, 200}) {
    for (bool with_initial : {false, true}) {
      Rng rng(1000 + 10 * time + with_initial);
      const RecurrenceProblem p = op.problem(rng, 6, time, with_initial);
      const Tensor flags = testing::reset_flags(testing::reset_patterns(rng, 6, time), time);
      const RecurrenceOutcome step = testing::run_recurrence(op.call(false, 0), p, flags);
      for (int64_t chunk_size : {0, 16, 5}) {
        const RecurrenceOutcome chunked = testing::run_recurrence(op.call(true, chunk_size), p, flags);
        testing::expect_outcomes_match(chunked, step, kFp64Tolerance,
                                       op.name + " T=" + std::to_string(time) + " chunk " +
                                           std::to_string(chunk_size) + " initial=" + std::to_string(with_initial));
      }
    }
  }
}

TEST_P(RecurrenceResets, AllZeroFlagsGiveTheBitsOfNoFlags) {
  const Recurrence& op = GetParam();
  Rng rng(7);
  const RecurrenceProblem p = op.problem(rng, 2, 70, true);
  const Tensor zeros = Tensor::zeros({2, 70}, DType::I32);
  for (bool chunk : {false, true}) {
    const RecurrenceOutcome without = testing::run_recurrence(op.call(chunk, 16), p, Tensor());
    const RecurrenceOutcome with = testing::run_recurrence(op.call(chunk, 16), p, zeros);
    EXPECT_EQ(with.output.to_double_vector(), without.output.to_double_vector()) << op.name;
    EXPECT_EQ(with.final_state.to_double_vector(), without.final_state.to_double_vector()) << op.name;
    for (size_t i = 0; i < p.steps.size(); ++i)
      EXPECT_EQ(with.d_steps[i].to_double_vector(), without.d_steps[i].to_double_vector()) << op.name << " " << i;
    EXPECT_EQ(with.d_initial.to_double_vector(), without.d_initial.to_double_vector()) << op.name;
  }
}

TEST_P(RecurrenceResets, ResetAtTheFirstStepCutsTheInitialStateOff) {
  // With a reset at step 0 the initial state reaches nothing: another initial state gives the same bits, and its
  // gradient is exactly zero.
  const Recurrence& op = GetParam();
  Rng rng(8);
  RecurrenceProblem p = op.problem(rng, 1, 40, true);
  const Tensor flags = testing::reset_flags({{0, 9}}, 40);
  for (bool chunk : {false, true}) {
    const RecurrenceOutcome a = testing::run_recurrence(op.call(chunk, 16), p, flags);
    RecurrenceProblem q = p;
    q.initial = random_tensor(rng, p.initial.shape(), 3.0);
    const RecurrenceOutcome b = testing::run_recurrence(op.call(chunk, 16), q, flags);
    EXPECT_EQ(a.output.to_double_vector(), b.output.to_double_vector()) << op.name;
    EXPECT_EQ(a.final_state.to_double_vector(), b.final_state.to_double_vector()) << op.name;
    ASSERT_TRUE(a.d_initial.defined());
    EXPECT_EQ(testing::max_abs(a.d_initial), 0.0) << op.name;
  }
}

// Central differences with h = 1e-6 on O(1) fp64 functions: truncation ~h², rounding ~1e-10; a wrong term is O(1).
TEST_P(RecurrenceResets, GradientsMatchFiniteDifferences) {
  const Recurrence& op = GetParam();
  // 13 steps in chunks of 4: resets at 0 (row 1), on chunk boundaries and the last step (row 2: 4, 8, 12), and inside
  // a chunk, two adjacent (row 0: 5, 6, 10).
  const ResetRows rows{{5, 6, 10}, {0}, {4, 8, 12}};
  const Tensor flags = testing::reset_flags(rows, 13);
  for (bool chunk : {false, true}) {
    Rng rng(31 + chunk);
    const RecurrenceProblem p = op.problem(rng, 3, 13, true);
    std::vector<Var> vars;
    for (const Tensor& s : p.steps) vars.push_back(make_var(s.clone(), true, "step input"));
    for (const Tensor& s : p.shared) vars.push_back(make_var(s.clone(), true, "shared input"));
    vars.push_back(make_var(p.initial.clone(), true, "initial state"));
    const size_t steps = p.steps.size(), shared = p.shared.size();
    const RecurrenceCall call = op.call(chunk, 4);
    testing::expect_gradients_match_outputs(
        [&](Tape& t, const std::vector<Var>& in) {
          const std::vector<Var> s(in.begin(), in.begin() + static_cast<int64_t>(steps));
          const std::vector<Var> sh(in.begin() + static_cast<int64_t>(steps),
                                    in.begin() + static_cast<int64_t>(steps + shared));
          const auto [output, final_state] = call(t, s, in.back(), sh, flags);
          return std::vector<Var>{output, final_state};
        },
        vars, 99, 1e-6, 1e-6);
  }
}

TEST_P(RecurrenceResets, RefusesBadFlags) {
  const Recurrence& op = GetParam();
  Rng rng(9);
  const RecurrenceProblem p = op.problem(rng, 2, 6, false);
  for (const Tensor& bad : {Tensor::zeros({2, 5}, DType::I32), Tensor::zeros({3, 6}, DType::I32),
                            Tensor::zeros({2, 6}, DType::F32), Tensor::zeros({12}, DType::I32)})
    EXPECT_THROW(testing::run_recurrence(op.call(true, 0), p, bad), Error) << op.name << " " << shape_str(bad.shape());
}

INSTANTIATE_TEST_SUITE_P(Ops, RecurrenceResets, ::testing::ValuesIn(recurrences()),
                         [](const ::testing::TestParamInfo<Recurrence>& info) { return info.param.name; });

TEST(GlaRecurrenceResets, ResetRowsGetExactlyZeroGateGradient) {
  // The loss does not depend on a gate whose decay a reset replaces: its dg is 0 exactly in both forms (the chunk
  // form's segment sum restarts there rather than cancelling to a rounding residue).
  // Per key channel and scalar (per head and step).
  for (const Recurrence& op : recurrences()) {
    if (op.name.rfind("gla_recurrence", 0) != 0) continue;
    SCOPED_TRACE(op.name);
    Rng rng(12);
    const RecurrenceProblem p = op.problem(rng, 6, 130, true);
    const ResetRows rows = testing::reset_patterns(rng, 6, 130);
    const Tensor flags = testing::reset_flags(rows, 130);
    for (bool chunk : {false, true}) {
      const RecurrenceOutcome r = testing::run_recurrence(op.call(chunk, 0), p, flags);
      const Tensor& dg = r.d_steps[3];
      const int64_t width = dg.size(2);
      for (size_t b = 0; b < rows.size(); ++b)
        for (int64_t t : rows[b])
          for (int64_t c = 0; c < width; ++c)
            ASSERT_EQ(dg.item((static_cast<int64_t>(b) * 130 + t) * width + c), 0.0) << "row " << b << " step " << t;
    }
  }
}

}  // namespace
}  // namespace hgrn
