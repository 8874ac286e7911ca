// test_gated_recurrence_cuda.cpp: a layer's HGRN2 gates feeding the HGRU2 recurrence as the model wires them (q̂, f̂
// and v column blocks of one projection output, hgrn2_gates, then gla_recurrence given the gates' origin), on the
// GPU, where the recurrence's backward runs the gates' backward in its own epilogue (GlaGatesEpilogue): the output
// and the gradients of q̂, f̂, v and γ against the CPU composition of the two ops in fp64 on the values the GPU sees;
// that dq, dk and dg were never formed (the fused path ran); and bitwise-identical gradients run to run. Sequence
// lengths 1, 65, 130 and 200 (partial chunks), key widths 32, 64, 96 (a partial second K-tile) and 128, layer 0
// (unbounded gate) and 3 (bounded), fp32 and bf16. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "hgru2_test_support.h"
#include "ops/elementwise.h"
#include "ops/hgrn2_gates.h"
#include "ops/gla_recurrence.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;
using testing::to_host_f64;

using Sizes = testing::Hgru2Shape;
using testing::kBf16;
using testing::kFp32;
using testing::Tol;

// fp64 host inputs: the projection output [q̂ | f̂ | v], the lower bounds γ [layers, H·K] (row 0 zero, the rest in
// [0.02, 0.98], fp32-exact) and the output's cotangent.
struct Problem {
  Tensor projection, gamma, d_out;
};

constexpr int64_t kLayers = 5;

Problem make_problem(Rng& rng, const Sizes& s) {
  const int64_t hk = s.heads * s.key_dim, hv = s.heads * s.value_dim;
  Problem p;
  // q̂ and v standard normal; f̂ around 2 (forget gates mostly near 1: fla's long-memory regime) with a wide spread.
  p.projection = random_tensor(rng, {s.batch, s.time, 2 * hk + hv});
  for (int64_t r = 0; r < s.batch * s.time; ++r)
    for (int64_t c = hk; c < 2 * hk; ++c) {
      const int64_t i = r * (2 * hk + hv) + c;
      p.projection.set_item(i, 2.0 + 1.5 * p.projection.item(i));
    }
  p.gamma = Tensor::zeros({kLayers, hk}, DType::F64);
  for (int64_t l = 1; l < kLayers; ++l)
    for (int64_t c = 0; c < hk; ++c) p.gamma.set_item(l * hk + c, 0.02 + 0.96 * rng.uniform());
  p.gamma = round_through(p.gamma, DType::F32);
  p.d_out = random_tensor(rng, {s.batch, s.time, hv});
  return p;
}

struct Result {
  Tensor output, d_projection, d_gamma;  // fp64 host copies
  bool formed_dq = false;                // the recurrence's q got a gradient of its own (the separate gates pass)
};

// GPU: inputs in act (γ fp32), the gates' origin handed to the recurrence as the model does. CPU: fp64 throughout
// (the chunk form with 64-step chunks) on the inputs rounded through act: the reference.
Result run(const Problem& p, const Sizes& s, int64_t layer, Device device, DType act) {
  const bool gpu = device == Device::CUDA;
  const int64_t hk = s.heads * s.key_dim, hv = s.heads * s.value_dim;
  Tape tape;
  const Var projection =
      make_var(gpu ? to_gpu(p.projection, act) : round_through(p.projection, act), true, "projection");
  const Var gamma = make_var(gpu ? to_gpu(p.gamma, DType::F32) : p.gamma.clone(), true, "gamma");
  const std::vector<Var> blocks = split_columns(tape, projection, {hk, hk, hv});
  const Hgrn2Gates gates = hgrn2_gates(tape, blocks[0], blocks[1], gamma, layer);
  EXPECT_EQ(gates.origin != nullptr, gpu) << "the gates' origin is made by the GPU path only";
  const GlaOutputs r = gla_recurrence(tape, gates.q, gates.k, blocks[2], gates.g, nullptr, s.heads,
                                          1.0 / std::sqrt(static_cast<double>(s.key_dim)), RecurrenceMode::Chunk,
                                          gpu ? 0 : 64, gates.origin);
  tape.backward(r.output, gpu ? to_gpu(p.d_out, act) : round_through(p.d_out, act));
  Result out;
  out.output = to_host_f64(r.output->value);
  out.d_projection = to_host_f64(projection->grad);
  if (gamma->grad.defined()) out.d_gamma = to_host_f64(gamma->grad);
  out.formed_dq = gates.q->grad.defined();
  return out;
}

// One column block [c0, c0 + width) of a [B, T, W] host tensor, contiguous.
Tensor columns(const Tensor& t, int64_t c0, int64_t width) { return t.columns(c0, width).clone(); }

// Tolerances: the recurrence tests' own (hgru2_test_support.h), whose dq, dk and dg the gates' backward only scales
// element by element; γ's gradient is a sum over all rows of such terms.

void expect_matches(const Result& got, const Result& want, const Sizes& s, Tol tol, const std::string& context) {
  const int64_t hk = s.heads * s.key_dim, hv = s.heads * s.value_dim;
  const struct {
    const char* name;
    Tensor got, want;
  } pairs[] = {{"output", got.output, want.output},
               {"dq_hat", columns(got.d_projection, 0, hk), columns(want.d_projection, 0, hk)},
               {"df_hat", columns(got.d_projection, hk, hk), columns(want.d_projection, hk, hk)},
               {"dv", columns(got.d_projection, 2 * hk, hv), columns(want.d_projection, 2 * hk, hv)},
               {"dgamma", got.d_gamma, want.d_gamma}};
  for (const auto& p : pairs) {
    ASSERT_EQ(p.got.defined(), p.want.defined()) << p.name << ", " << context;
    if (!p.want.defined()) continue;
    const double scale = std::max(max_abs(p.want), 1e-30);
    testing::expect_close(p.got, p.want, tol.rel_rms, tol.max_rel * scale, std::string(p.name) + ", " + context);
  }
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || (a.nbytes() == b.nbytes() &&
                                                         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0));
}

TEST(GatedRecurrenceCuda, FusedGatesBackwardMatchesCpuComposition) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<Sizes> shapes{{2, 1, 2, 32, 16}, {1, 65, 2, 64, 64}, {2, 130, 2, 96, 40}, {1, 200, 3, 128, 128}};
  int variant = 0;
  for (const Sizes& s : shapes) {
    for (DType act : {DType::F32, DType::BF16}) {
      for (int64_t layer : {int64_t{0}, int64_t{3}}) {
        const std::string context = s.str() + " " + dtype_name(act) + " layer " + std::to_string(layer);
        SCOPED_TRACE(context);
        Rng rng(4100 + variant++);
        const Problem p = make_problem(rng, s);
        const Result got = run(p, s, layer, Device::CUDA, act);
        const Result want = run(p, s, layer, Device::CPU, act);
        EXPECT_FALSE(got.formed_dq) << "the fused path must not form dq (the gates' backward ran separately)";
        ASSERT_TRUE(want.formed_dq);
        // Layer 0's gate is unbounded: γ gets no gradient from it (the reference's leaves it untouched too).
        EXPECT_EQ(got.d_gamma.defined(), layer > 0);
        expect_matches(got, want, s, act == DType::F32 ? kFp32 : kBf16, context);
      }
    }
  }
}

TEST(GatedRecurrenceCuda, FusedGatesBackwardIsBitwiseReproducible) {
  HGRN_SKIP_WITHOUT_GPU();
  const Sizes s{2, 200, 3, 96, 64};
  Rng rng(4200);
  const Problem p = make_problem(rng, s);
  for (DType act : {DType::F32, DType::BF16}) {
    const Result a = run(p, s, 3, Device::CUDA, act), b = run(p, s, 3, Device::CUDA, act);
    EXPECT_TRUE(same_bits(a.d_projection, b.d_projection)) << dtype_name(act);
    EXPECT_TRUE(same_bits(a.d_gamma, b.d_gamma)) << dtype_name(act);
  }
}

}  // namespace
}  // namespace hgrn
