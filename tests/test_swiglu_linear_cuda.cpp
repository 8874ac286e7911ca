// test_swiglu_linear_cuda.cpp: the fused SwiGLU + down projection on the GPU against the fp64 CPU reference: fp32
// and bf16 activations (fp32 master weight), hidden kept and recomputed in the backward, odd shapes, frozen inputs.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/swiglu_linear.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;

struct Case {
  int64_t rows, width, out;  // gate and up [rows, width], weight [out, width]
};

double max_magnitude(const Tensor& t) {
  const Tensor h = testing::to_host_f64(t);
  double m = 0;
  for (int64_t i = 0; i < h.numel(); ++i) m = std::max(m, std::fabs(h.item(i)));
  return m;
}

// Which inputs want a gradient (All: also a residual added by the GEMM).
enum class Wants { All, WeightOnly, InputsOnly };

// blocks: gate and up are column blocks of one tensor [gate | up | 8 more columns] (split_columns, as the model's
// fused gate/up projection makes them): read in place, their gradients written into the parent's (the 8 columns
// get none: zeros).
void check(const Case& c, DType act, bool keep_hidden, Wants wants, bool blocks = false) {
  SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " width " << c.width << " out " << c.out << " "
                                    << dtype_name(act) << (keep_hidden ? " kept" : " recomputed") << " wants "
                                    << static_cast<int>(wants) << (blocks ? " column blocks" : ""));
  Rng rng(c.rows * 977 + c.width * 31 + c.out);
  // The reference sees the values the GPU sees: inputs rounded through the activation dtype, and for bf16 the
  // weight rounded to its bf16 copy. hidden itself is rounded only on the GPU (see the tolerances).
  const Tensor gate = round_through(random_tensor(rng, {c.rows, c.width}, 3.0), act);
  const Tensor up = round_through(random_tensor(rng, {c.rows, c.width}), act);
  const Tensor w = random_tensor(rng, {c.out, c.width}, 0.1);
  const Tensor dy = round_through(random_tensor(rng, {c.rows, c.out}), act);
  const Tensor r = round_through(random_tensor(rng, {c.rows, c.out}), act);
  const bool with_residual = wants == Wants::All;
  const bool inputs_grad = wants != Wants::WeightOnly, weight_grad = wants != Wants::InputsOnly;

  // gate and up as Vars of their own, or as column blocks of one parent whose gradient is read back into them.
  struct Inputs {
    Var gate, up, parent;
  };
  const auto inputs = [&](Tape& t, bool gpu) {
    const auto put = [&](const Tensor& host) { return gpu ? to_gpu(host, act) : host; };
    if (!blocks) return Inputs{make_var(put(gate), inputs_grad), make_var(put(up), inputs_grad), nullptr};
    Var parent = make_var(put(testing::concat_columns({gate, up, Tensor::full({c.rows, 8}, 1.0, DType::F64)})),
                          inputs_grad);
    const std::vector<Var> b = split_columns(t, parent, {c.width, c.width, 8});
    return Inputs{b[0], b[1], parent};
  };
  const auto read_back = [&](const Inputs& in) {
    if (!in.parent || !in.parent->grad.defined()) return;
    in.gate->grad = in.parent->grad.columns(0, c.width).clone();
    in.up->grad = in.parent->grad.columns(c.width, c.width).clone();
    const Tensor extra = testing::to_host_f64(in.parent->grad.columns(2 * c.width, 8).clone());
    for (int64_t i = 0; i < extra.numel(); ++i) EXPECT_EQ(extra.item(i), 0.0) << "a column no gradient reached";
  };
  Tape ref_tape;
  const Inputs ref_in = inputs(ref_tape, false);
  Var rg = ref_in.gate, ru = ref_in.up, rw = make_var(round_through(w, act), weight_grad);
  Var rr = with_residual ? make_var(r, true) : nullptr;
  Var ry = swiglu_linear(ref_tape, rg, ru, rw, true, rr);
  ref_tape.backward(ry, dy);
  read_back(ref_in);

  Tape tape;
  const Inputs gpu_in = inputs(tape, true);
  Var gg = gpu_in.gate, gu = gpu_in.up;
  Var gw = make_var(to_gpu(w, DType::F32), weight_grad);
  Var gr = with_residual ? make_var(to_gpu(r, act), true) : nullptr;
  Var gy = swiglu_linear(tape, gg, gu, gw, keep_hidden, gr);
  tape.backward(gy, to_gpu(dy, act));
  read_back(gpu_in);

  // fp32: true fp32 GEMMs and expf: ~1e-6 relative RMS (summation order, exp's last bits), bound 1e-5; max abs
  // 1e-5 of the largest reference value. bf16: hidden and dhidden are rounded to bf16 inside the op and every output
  // once more (2^-9 relative each), bound 1e-2 relative RMS; max abs 2% of the largest reference value. dW sums in
  // fp32 from the bf16 hidden: the same bounds.
  const double rel = act == DType::F32 ? 1e-5 : 1e-2, abs_frac = act == DType::F32 ? 1e-5 : 2e-2;
  const auto abs_tol = [&](const Tensor& want) { return abs_frac * std::max(1.0, max_magnitude(want)); };
  expect_close(gy->value, ry->value, rel, abs_tol(ry->value), "y");
  if (inputs_grad) {
    expect_close(gg->grad, rg->grad, rel, abs_tol(rg->grad), "dgate");
    expect_close(gu->grad, ru->grad, rel, abs_tol(ru->grad), "dup");
  } else {
    EXPECT_FALSE(gg->grad.defined());
    EXPECT_FALSE(gu->grad.defined());
  }
  if (with_residual) expect_close(gr->grad, rr->grad, 0.0, 0.0, "dresidual");  // dy itself: exact
  if (weight_grad) {
    ASSERT_EQ(gw->grad.dtype(), DType::F32) << "weight gradients stay fp32";
    expect_close(gw->grad, rw->grad, rel, abs_tol(rw->grad), "dW");
  } else {
    EXPECT_FALSE(gw->grad.defined());
  }
}

TEST(SwigluLinearCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16})
    for (bool keep_hidden : {false, true})
      for (Case c : {Case{1, 96, 200}, Case{63, 771, 96}, Case{65, 128, 384}, Case{2047, 200, 771}, Case{3, 7, 5}})
        check(c, act, keep_hidden, Wants::All);
}

// gate and up as column blocks of one tensor (the fused gate/up projection's output), packed (widths 96, 200) and
// not (771, 7: rows of an odd stride), hidden kept and recomputed.
TEST(SwigluLinearCuda, ColumnBlocksMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16})
    for (bool keep_hidden : {false, true})
      for (Case c : {Case{1, 96, 200}, Case{63, 771, 96}, Case{2047, 200, 771}, Case{3, 7, 5}})
        check(c, act, keep_hidden, Wants::All, /*blocks=*/true);
}

TEST(SwigluLinearCuda, FrozenInputs) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16})
    for (bool keep_hidden : {false, true})
      for (Wants wants : {Wants::WeightOnly, Wants::InputsOnly}) check(Case{65, 200, 96}, act, keep_hidden, wants);
}

}  // namespace
}  // namespace hgrn
