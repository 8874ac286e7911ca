// test_gated_rmsnorm_linear_cuda.cpp: swiglu_linear with a normalised up operand (UpNorm) on the GPU. Where the rows
// fit one warp its norm, gate and product run as one pass each way (kernels/rmsnorm.cu's gated forms); elsewhere as
// rmsnorm then swiglu. Either way the values and gradients must be the GPU composition's bits (rmsnorm Var, then
// swiglu_linear), and close to the fp64 CPU reference. Odd row counts, whole rows and per-head groups, gates that are
// column blocks (packed strides, and an odd stride that the fused form refuses), a gate gradient accumulated onto
// another op's, hidden kept and recomputed, fp32 and bf16. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu_linear.h"

namespace hgrn {
namespace {

using testing::round_through;
using testing::to_gpu;

struct Case {
  int64_t rows, width, group, out;  // o and gate [rows, width], norm groups of `group` (0: whole rows), W [out, width]
  int64_t extra;                    // columns beside the gate in its parent (0: the gate is a tensor of its own)
};

// Host fp64 inputs, rounded through the activation dtype where the GPU reads them in it.
struct Inputs {
  Tensor gate, o, norm_weight, weight, scale, dy, dscaled;
};

struct Outputs {
  Tensor y, dgate, dout, dnorm, dweight;
};

// One run on the GPU (activations `act`, fp32 master weights) or the CPU (fp64): the fused op, or rmsnorm then
// swiglu_linear. also_scaled: gate also feeds gate ⊙ scale, recorded after the op, so that its backward runs first and
// the op adds its gate gradient onto the one already there.
Outputs run(const Case& c, const Inputs& in, bool gpu, DType act, bool fused, bool keep_hidden, bool also_scaled) {
  const auto put = [&](const Tensor& t) { return gpu ? to_gpu(t, act) : t; };
  const auto put_weight = [&](const Tensor& t) { return gpu ? to_gpu(t, DType::F32) : t; };
  Tape tape;
  Var parent = make_var(
      put(c.extra ? testing::concat_columns({in.gate, Tensor::full({c.rows, c.extra}, 0.5, DType::F64)}) : in.gate),
      true);
  Var g = c.extra ? split_columns(tape, parent, {c.width, c.extra})[0] : parent;
  Var o = make_var(put(in.o), true), n = make_var(put_weight(in.norm_weight), true);
  Var w = make_var(put_weight(in.weight), true);
  Var y;
  if (fused) {
    const UpNorm norm{n, 1e-6, c.group};
    y = swiglu_linear(tape, g, o, w, keep_hidden, nullptr, &norm);
  } else {
    y = swiglu_linear(tape, g, rmsnorm(tape, o, n, 1e-6, c.group), w, keep_hidden);
  }
  if (also_scaled) {
    Var scaled = mul(tape, contiguous(tape, g), make_var(put(in.scale)));
    scaled->grad = put(in.dscaled);
  }
  tape.backward(y, put(in.dy));
  const Tensor dgate = c.extra ? parent->grad.columns(0, c.width).clone() : parent->grad;
  return {y->value, dgate, o->grad, n->grad, w->grad};
}

void check(const Case& c, DType act, bool keep_hidden, bool also_scaled) {
  SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " width " << c.width << " group " << c.group << " out "
                                    << c.out << " extra " << c.extra << " " << dtype_name(act)
                                    << (keep_hidden ? " kept" : " recomputed") << (also_scaled ? " accumulated" : ""));
  Rng rng(c.rows * 977 + c.width * 31 + c.group * 7 + c.out + c.extra);
  const int64_t g = c.group ? c.group : c.width;
  Inputs in;
  in.gate = round_through(testing::random_tensor(rng, {c.rows, c.width}, 3.0), act);
  in.o = round_through(testing::random_tensor(rng, {c.rows, c.width}), act);
  in.norm_weight = round_through(testing::random_tensor(rng, {g}, 0.3), DType::F32);
  for (int64_t i = 0; i < g; ++i) in.norm_weight.data<double>()[i] += 1.0;
  in.weight = round_through(testing::random_tensor(rng, {c.out, c.width}, 0.1), act);
  in.scale = round_through(testing::random_tensor(rng, {c.rows, c.width}), act);
  in.dy = round_through(testing::random_tensor(rng, {c.rows, c.out}), act);
  in.dscaled = round_through(testing::random_tensor(rng, {c.rows, c.width}), act);

  const Outputs fused = run(c, in, true, act, true, keep_hidden, also_scaled);
  const Outputs composed = run(c, in, true, act, false, keep_hidden, also_scaled);
  const Outputs reference = run(c, in, false, act, false, true, also_scaled);
  const auto outputs = [](const Outputs& r) {
    return std::vector<std::pair<const Tensor*, const char*>>{
        {&r.y, "y"}, {&r.dgate, "dgate"}, {&r.dout, "do"}, {&r.dnorm, "dnorm"}, {&r.dweight, "dW"}};
  };
  const auto f = outputs(fused), m = outputs(composed), r = outputs(reference);
  for (size_t i = 0; i < f.size(); ++i) {
    // The composition's bits: same element-wise arithmetic in the same order, same reductions, same GEMMs.
    const Tensor got = testing::to_host_f64(*f[i].first), want = testing::to_host_f64(*m[i].first);
    ASSERT_EQ(got.shape(), want.shape()) << f[i].second;
    for (int64_t k = 0; k < want.numel(); ++k)
      ASSERT_EQ(got.item(k), want.item(k)) << f[i].second << " element " << k << " differs from the composition's";
    // Against fp64: fp32 ~1e-6 relative RMS (bound 1e-5); bf16 rounds the norm's output, hidden, dhidden and every
    // output (2^-9 relative each), bound 1e-2 relative RMS, max abs 3% of the largest reference value (the norm
    // weight's gradient sums rows×width/group bf16-rounded terms).
    const Tensor ref = testing::to_host_f64(*r[i].first);
    double largest = 1.0;
    for (int64_t k = 0; k < ref.numel(); ++k) largest = std::max(largest, std::fabs(ref.item(k)));
    const double rel = act == DType::F32 ? 1e-5 : 1e-2, abs_frac = act == DType::F32 ? 1e-5 : 3e-2;
    testing::expect_close(got, ref, rel, abs_frac * largest, f[i].second);
  }
}

// Rows the fused form takes (widths up to 2048 bf16 / 1024 fp32, on 16 bytes), and ones it refuses (a width of 100
// bf16 values, 2048 fp32, a gate stride of 1027): those run the composition.
TEST(GatedRmsnormLinearCuda, MatchesTheCompositionAndTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::BF16, DType::F32})
    for (bool keep_hidden : {false, true})
      for (Case c : {Case{1, 1024, 0, 96, 0}, Case{63, 256, 64, 200, 8}, Case{65, 2048, 0, 128, 2048},
                     Case{2047, 512, 128, 64, 1024}, Case{5, 100, 0, 7, 0}, Case{3, 48, 16, 5, 16},
                     Case{9, 1024, 0, 33, 3}})
        check(c, act, keep_hidden, /*also_scaled=*/false);
}

TEST(GatedRmsnormLinearCuda, GateGradientAddsOntoAnotherOps) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::BF16, DType::F32})
    for (Case c : {Case{65, 1024, 0, 96, 2048}, Case{31, 256, 64, 40, 0}}) check(c, act, false, /*also_scaled=*/true);
}

}  // namespace
}  // namespace hgrn
