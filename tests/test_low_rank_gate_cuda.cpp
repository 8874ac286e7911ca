// test_low_rank_gate_cuda.cpp: low_rank_log_sigmoid_gate on the GPU, forward and every gradient, against the CPU op
// in fp64 on the same inputs (u rounded through bf16 for bf16 runs; the fp32 parameters and cotangent fp32-exact):
// fp32 and bf16 u, odd row counts, output widths and ranks (one and several 512-wide output tiles, one and several
// 16-rank chunks), u a column block whose gradient lands in its columns, gradients added onto existing ones, extreme
// logits, and bitwise-identical reruns. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "gpu_test.h"
#include "gradcheck.h"
#include "kernels/low_rank_gate.h"
#include "ops/elementwise.h"
#include "ops/low_rank_gate.h"

namespace hgrn {
namespace {

using testing::concat_columns;
using testing::expect_close;
using testing::max_abs;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;

constexpr double kDivisor = 16.0;  // GLA's gate_logit_normalizer

Tensor f32_exact(const Tensor& host) { return round_through(host, DType::F32); }

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

// One problem's host inputs (fp64 holding the values the GPU sees) and how it runs.
struct GateProblem {
  Tensor u, weight, bias, seed;      // u rounded through the activation dtype; the rest fp32-exact
  Tensor du0, dweight0, dbias0;      // gradients already there (existing_grads)
  DType act = DType::F32;
  bool column_block = false;    // u is columns [5, 5 + R) of [rows, 5 + R + 3], read by two gates
  bool existing_grads = false;  // u, weight and bias hold a gradient before the backward
};

// u ~ N(0, 1), weight ~ N(0, 0.5), bias ~ N(0, bias_scale), seed ~ N(0, 1).
GateProblem make_problem(Rng& rng, DType act, int64_t rows, int64_t out, int64_t rank, double bias_scale = 1.0) {
  GateProblem p;
  p.act = act;
  p.u = round_through(random_tensor(rng, {rows, rank}), act);
  p.weight = f32_exact(random_tensor(rng, {out, rank}, 0.5));
  p.bias = f32_exact(random_tensor(rng, {out}, bias_scale));
  p.seed = f32_exact(random_tensor(rng, {rows, out}));
  p.du0 = round_through(random_tensor(rng, {rows, rank}), act);
  p.dweight0 = f32_exact(random_tensor(rng, {out, rank}));
  p.dbias0 = f32_exact(random_tensor(rng, {out}));
  return p;
}

struct GateRun {
  Var parent, u, weight, bias, y;
  Tensor du() const { return parent ? parent->grad : u->grad; }
};

// The op and its backward on the CPU in fp64 or on the GPU (u in the activation dtype, the rest fp32).
GateRun run_gate(const GateProblem& p, Device device) {
  const bool gpu = device == Device::CUDA;
  const auto act_tensor = [&](const Tensor& t) { return gpu ? to_gpu(t, p.act) : t.clone(); };
  const auto f32_tensor = [&](const Tensor& t) { return gpu ? to_gpu(t, DType::F32) : t.clone(); };
  const DType out_dtype = gpu ? DType::F32 : DType::F64;
  GateRun r;
  Tape tape;
  const int64_t rows = p.u.size(0), rank = p.u.size(1);
  if (p.column_block) {
    r.parent = make_var(act_tensor(concat_columns({Tensor::full({rows, 5}, 0.25, DType::F64), p.u,
                                                   Tensor::full({rows, 3}, -0.5, DType::F64)})),
                        true, "parent");
    r.u = split_columns(tape, r.parent, {5, rank, 3})[1];
  } else {
    r.u = make_var(act_tensor(p.u), true, "u");
  }
  r.weight = make_var(f32_tensor(p.weight), true, "weight");
  r.bias = make_var(f32_tensor(p.bias), true, "bias");
  if (p.existing_grads) {
    r.u->grad = act_tensor(p.du0);
    r.weight->grad = f32_tensor(p.dweight0);
    r.bias->grad = f32_tensor(p.dbias0);
  }
  r.y = low_rank_log_sigmoid_gate(tape, r.u, r.weight, r.bias, kDivisor, out_dtype);
  if (p.column_block) {
    // A second read of u (the same weights, half the cotangent): its backward runs first and writes u's columns
    // fresh, the first's adds to them.
    const Var again = low_rank_log_sigmoid_gate(tape, r.u, r.weight, r.bias, kDivisor, out_dtype);
    Tensor half = p.seed.clone();
    for (int64_t i = 0; i < half.numel(); ++i) half.set_item(i, 0.5 * half.item(i));
    again->grad = f32_tensor(half);
  }
  tape.backward(r.y, f32_tensor(p.seed));
  return r;
}

// The GPU against the fp64 CPU op on the same inputs.
void expect_matches_cpu(const GateProblem& p) {
  const GateRun ref = run_gate(p, Device::CPU);
  const GateRun got = run_gate(p, Device::CUDA);
  ASSERT_EQ(got.y->value.dtype(), DType::F32) << "the gate is fp32 on the GPU whatever u's dtype";
  ASSERT_EQ(got.du().dtype(), p.act);
  // y: fp32 sums of R products (|x| of a few units: errors ~1e-7), then log σ through expf and log1pf (a few ulp)
  // and the divisor's 1/16: within 2e-6 of the largest |y| (~0.3), also for bf16 u, whose values both sides share.
  const double y_scale = std::max(1.0, max_abs(ref.y->value));
  expect_close(got.y->value, ref.y->value, 2e-6, 2e-6 * y_scale, "y");
  // du: fp32 sums over the outputs, ~1e-6 relative; bf16 u rounds each element on every write (2^-9 relative, twice
  // where u is read twice).
  const double du_tol = p.act == DType::F32 ? 1e-5 : 8e-3;
  expect_close(got.du(), ref.du(), du_tol, du_tol * max_abs(ref.du()), "du");
  // dW and db: fp32 sums over the rows in a fixed order, ~1e-6 relative to the largest.
  expect_close(got.weight->grad, ref.weight->grad, 1e-5, 1e-5 * max_abs(ref.weight->grad), "dW");
  expect_close(got.bias->grad, ref.bias->grad, 1e-5, 1e-5 * max_abs(ref.bias->grad), "db");
  if (p.column_block) {  // the parent's other columns get zeros
    const Tensor g = got.parent->grad.to(Device::CPU).to(DType::F64);
    const int64_t width = g.size(1), rank = p.u.size(1);
    for (int64_t r = 0; r < g.size(0); ++r)
      for (int64_t c : {int64_t{0}, int64_t{4}, 5 + rank, width - 1}) ASSERT_EQ(g.item(r * width + c), 0.0) << r;
  }
}

// One shape in each layout of u: contiguous, a column block of a wider parent, and with existing gradients.
void expect_matches_cpu_in_each_layout(Rng& rng, DType act, int64_t rows, int64_t out, int64_t rank) {
  for (int layout = 0; layout < 3; ++layout) {
    SCOPED_TRACE(::testing::Message() << dtype_name(act) << ", rows " << rows << ", out " << out << ", rank " << rank
                                      << ", layout " << layout);
    GateProblem p = make_problem(rng, act, rows, out, rank);
    p.column_block = layout == 1;
    p.existing_grads = layout == 2;
    expect_matches_cpu(p);
  }
}

TEST(LowRankGateCuda, MatchesCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(601);
  for (DType act : {DType::F32, DType::BF16})
    for (int64_t rows : {1, 37, 4099})
      for (const auto& [out, rank] : std::vector<std::pair<int64_t, int64_t>>{{512, 16}, {20, 3}})
        expect_matches_cpu_in_each_layout(rng, act, rows, out, rank);
}

// Wider problems: several 512-wide output tiles (du summed over tiles by a second kernel), several 16-rank chunks,
// the widest rank, an output width that is not a multiple of 4.
TEST(LowRankGateCuda, WideOutputsAndRanksMatchCpuFp64) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(602);
  for (DType act : {DType::F32, DType::BF16})
    for (const auto& [out, rank] :
         std::vector<std::pair<int64_t, int64_t>>{{1100, 16}, {512, 40}, {700, kLowRankGateMaxRank}, {5, 3}})
      expect_matches_cpu_in_each_layout(rng, act, 301, out, rank);
}

// Logits of ±60 (bias ~ N(0, 30)): log σ and σ(−x) underflow to tiny numbers, never to NaN.
TEST(LowRankGateCuda, ExtremeLogitsStayFiniteAndAccurate) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(603);
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    expect_matches_cpu(make_problem(rng, act, 257, 512, 16, 30.0));
  }
}

// Two runs on the same inputs give the same bits: no atomics, every sum in an order set by the shape.
TEST(LowRankGateCuda, RerunsAreBitwiseIdentical) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(604);
  for (DType act : {DType::F32, DType::BF16})
    for (const auto& [out, rank] : std::vector<std::pair<int64_t, int64_t>>{{512, 16}, {1100, 40}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(act) << ", out " << out << ", rank " << rank);
      GateProblem p = make_problem(rng, act, 4099, out, rank);
      p.column_block = true;
      const GateRun a = run_gate(p, Device::CUDA), b = run_gate(p, Device::CUDA);
      EXPECT_TRUE(same_bits(a.y->value, b.y->value)) << "y";
      EXPECT_TRUE(same_bits(a.du(), b.du())) << "du";
      EXPECT_TRUE(same_bits(a.weight->grad, b.weight->grad)) << "dW";
      EXPECT_TRUE(same_bits(a.bias->grad, b.bias->grad)) << "db";
    }
}

TEST(LowRankGateCuda, RejectsBadArguments) {
  HGRN_SKIP_WITHOUT_GPU();
  Tape tape;
  const auto gpu = [](const Shape& s, DType dtype) { return make_var(Tensor::zeros(s, dtype, Device::CUDA)); };
  const Var u = gpu({4, 16}, DType::BF16), w = gpu({8, 16}, DType::F32), b = gpu({8}, DType::F32);
  EXPECT_NO_THROW(low_rank_log_sigmoid_gate(tape, u, w, b, kDivisor, DType::F32));
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, w, b, kDivisor, DType::BF16), Error);  // the gate is fp32
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, gpu({8, 16}, DType::BF16), b, kDivisor, DType::F32),
               Error);  // fp32 parameters
  const int64_t too_wide = kLowRankGateMaxRank + 1;
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, gpu({4, too_wide}, DType::BF16), gpu({8, too_wide}, DType::F32), b,
                                         kDivisor, DType::F32),
               Error);
  EXPECT_THROW(low_rank_log_sigmoid_gate(tape, u, make_var(Tensor::zeros({8, 16}, DType::F32)), b, kDivisor,
                                         DType::F32),
               Error);  // devices
}

}  // namespace
}  // namespace hgrn
