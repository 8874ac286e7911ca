// test_activations_cuda.cpp: the CUDA silu, swiglu, log_sigmoid (fp32 output from bf16 input, as GLA's gates) and
// add (and reshape's gradient, which shares add's accumulation) against the fp64 CPU reference from the same rounded inputs, fp32 and bf16, odd sizes, unaligned
// views (the unpacked path) and gradients accumulated onto existing ones. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "core/rng.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/activations.h"
#include "ops/elementwise.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::round_through;
using testing::to_gpu;

// fp32: expf and a few products, ~1e-7 relative per element; bf16: the final rounding to bf16, 2^-9 relative, of
// values up to ~30 (gate ~ 3·N(0,1), up ~ N(0,1)).
double rel_tol(DType dtype) { return dtype == DType::F32 ? 1e-5 : 1e-2; }
double abs_tol(DType dtype) { return dtype == DType::F32 ? 1e-4 : 2e-1; }

struct Shape2 {
  int64_t rows, width;
};
const Shape2 kShapes[] = {{1, 96}, {63, 200}, {65, 771}, {2047, 1024}, {1, 1}, {3, 7}};

std::string case_name(DType dtype, Shape2 s) {
  return std::string(dtype_name(dtype)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.width);
}

// An fp64 host tensor rounded through dtype: the values the GPU will see.
Tensor rounded(Rng& rng, const Shape& shape, double scale, DType dtype) {
  return round_through(testing::random_tensor(rng, shape, scale), dtype);
}

TEST(SiluCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(201);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (Shape2 s : kShapes) {
      // seeded: dx accumulates onto an existing gradient; otherwise the GPU overwrites a fresh, poisoned buffer.
      for (bool seeded : {true, false}) {
        SCOPED_TRACE(case_name(dtype, s) + (seeded ? " seeded" : " fresh"));
        Tensor x = rounded(rng, {s.rows, s.width}, 3.0, dtype), dy = rounded(rng, {s.rows, s.width}, 1.0, dtype);
        Tensor dx0 = rounded(rng, {s.rows, s.width}, 0.5, dtype);
        Tape ref_tape, tape;
        Var rx = make_var(x, true, "x");
        if (seeded) rx->grad = dx0.clone();
        Var ry = silu(ref_tape, rx);
        ref_tape.backward(ry, dy);
        Var gx = make_var(to_gpu(x, dtype), true, "x");
        if (seeded) gx->grad = to_gpu(dx0, dtype);
        Var gy = silu(tape, gx);
        tape.backward(gy, to_gpu(dy, dtype));
        expect_close(gy->value, ry->value, rel_tol(dtype), abs_tol(dtype), "silu y");
        expect_close(gx->grad, rx->grad, rel_tol(dtype), abs_tol(dtype), "silu dx");
      }
    }
  }
}

TEST(SiluCuda, ExtremeInputsStayFinite) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tape tape;
    Var y = silu(tape, make_var(to_gpu(Tensor::from_vector<double>({-1000, 1000, -88, 88, 0}, {5}), dtype)));
    Tensor h = y->value.to(Device::CPU);
    EXPECT_EQ(h.item(0), 0.0) << dtype_name(dtype);  // −1000 · σ(−1000) underflows to (−)0, never NaN
    EXPECT_EQ(h.item(1), 1000.0) << dtype_name(dtype);
    EXPECT_EQ(h.item(4), 0.0) << dtype_name(dtype);
  }
}

TEST(SwigluCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(202);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (Shape2 s : kShapes) {
      // Which inputs want a gradient: both, gate only, up only.
      for (int frozen : {0, 1, 2}) {
        SCOPED_TRACE(case_name(dtype, s) + " frozen=" + std::to_string(frozen));
        const Shape shape{s.rows, s.width};
        Tensor gate = rounded(rng, shape, 3.0, dtype), up = rounded(rng, shape, 1.0, dtype);
        Tensor dy = rounded(rng, shape, 1.0, dtype), dg0 = rounded(rng, shape, 0.5, dtype);
        Tape ref_tape, tape;
        Var rg = make_var(gate, frozen != 2, "gate"), ru = make_var(up, frozen != 1, "up");
        if (rg->requires_grad) rg->grad = dg0.clone();
        Var ry = swiglu(ref_tape, rg, ru);
        ref_tape.backward(ry, dy);
        Var gg = make_var(to_gpu(gate, dtype), frozen != 2, "gate"), gu = make_var(to_gpu(up, dtype), frozen != 1, "up");
        if (gg->requires_grad) gg->grad = to_gpu(dg0, dtype);  // accumulated onto; up's starts undefined
        Var gy = swiglu(tape, gg, gu);
        tape.backward(gy, to_gpu(dy, dtype));
        expect_close(gy->value, ry->value, rel_tol(dtype), abs_tol(dtype), "swiglu y");
        if (frozen != 2) expect_close(gg->grad, rg->grad, rel_tol(dtype), abs_tol(dtype), "dgate");
        else EXPECT_FALSE(gg->grad.defined());
        if (frozen != 1) expect_close(gu->grad, ru->grad, rel_tol(dtype), abs_tol(dtype), "dup");
        else EXPECT_FALSE(gu->grad.defined());
      }
    }
  }
}

// Rows 1.. of a [rows, width] tensor with an odd width start off any 16-byte boundary: the unpacked path.
TEST(SwigluCuda, UnalignedViews) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(203);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Shape shape{2, 3, 771};
    Tensor gate = rounded(rng, shape, 3.0, dtype), up = rounded(rng, shape, 1.0, dtype);
    Tensor gate_gpu = to_gpu(gate, dtype), up_gpu = to_gpu(up, dtype);
    Tape ref_tape, tape;
    Var ry = swiglu(ref_tape, make_var(gate.select_row(1)), make_var(up.select_row(1)));
    Var gy = swiglu(tape, make_var(gate_gpu.select_row(1)), make_var(up_gpu.select_row(1)));
    expect_close(gy->value, ry->value, rel_tol(dtype), abs_tol(dtype), "swiglu y on views");
    Var rs = silu(ref_tape, make_var(gate.select_row(1)));
    Var gs = silu(tape, make_var(gate_gpu.select_row(1)));
    expect_close(gs->value, rs->value, rel_tol(dtype), abs_tol(dtype), "silu y on views");
  }
}

TEST(AddCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(204);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (Shape2 s : kShapes) {
      SCOPED_TRACE(case_name(dtype, s));
      const Shape shape{s.rows, s.width};
      Tensor a = rounded(rng, shape, 1.0, dtype), b = rounded(rng, shape, 1.0, dtype);
      Tensor dy = rounded(rng, shape, 1.0, dtype), da0 = rounded(rng, shape, 0.5, dtype);
      Tape ref_tape, tape;
      Var ra = make_var(a, true, "a"), rb = make_var(b, true, "b");
      ra->grad = da0.clone();
      Var ry = add(ref_tape, ra, rb);
      ref_tape.backward(ry, dy);
      Var ga = make_var(to_gpu(a, dtype), true, "a"), gb = make_var(to_gpu(b, dtype), true, "b");
      ga->grad = to_gpu(da0, dtype);  // accumulated onto; b's starts undefined
      Var gy = add(tape, ga, gb);
      tape.backward(gy, to_gpu(dy, dtype));
      // One rounding of an exact sum: fp32 2^-24, bf16 2^-9 relative; values up to ~6.
      const double rel = dtype == DType::F32 ? 1e-6 : 1e-2, abs = dtype == DType::F32 ? 1e-5 : 5e-2;
      expect_close(gy->value, ry->value, rel, abs, "a + b");
      expect_close(ga->grad, ra->grad, rel, abs, "da");
      expect_close(gb->grad, rb->grad, rel, abs, "db");  // dy itself: exact
    }
  }
}

// swiglu(x, x): both contributions land in one buffer, the first overwriting the fresh gradient, the second adding.
TEST(SwigluCuda, SharedInput) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(206);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = rounded(rng, {65, 200}, 3.0, dtype), dy = rounded(rng, {65, 200}, 1.0, dtype);
    Tape ref_tape, tape;
    Var rx = make_var(x, true, "x");
    ref_tape.backward(swiglu(ref_tape, rx, rx), dy);
    Var gx = make_var(to_gpu(x, dtype), true, "x");
    tape.backward(swiglu(tape, gx, gx), to_gpu(dy, dtype));
    // As MatchesCpuReference; bf16 rounds the first contribution before adding the second (one more 2^-9).
    expect_close(gx->grad, rx->grad, rel_tol(dtype), abs_tol(dtype), "d swiglu(x, x)");
  }
}

// x + x and a reshape in the graph: the first gradient path copies into the fresh buffer, the others accumulate.
TEST(AddCuda, SharedInputAndReshapeGradients) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(205);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = rounded(rng, {65, 200}, 1.0, dtype), dy = rounded(rng, {13, 1000}, 1.0, dtype);
    Tape ref_tape, tape;
    Var rx = make_var(x, true, "x");
    ref_tape.backward(reshape(ref_tape, add(ref_tape, rx, rx), {13, 1000}), dy);
    Var gx = make_var(to_gpu(x, dtype), true, "x");
    Var gy = reshape(tape, add(tape, gx, gx), {13, 1000});
    ASSERT_EQ(gy->value.device(), Device::CUDA);
    tape.backward(gy, to_gpu(dy, dtype));
    // 2·dy, then 2·dy: exact in both dtypes (powers of two), hence the zero tolerance.
    expect_close(gx->grad, rx->grad, 0, 0, "d(x + x)");
  }
}

// GLA's gate: log σ(x)/16 from fp32 or bf16 x, written in fp32 or x's dtype; its gradient (in the output's dtype)
// back into x's, fresh or added onto one there.
TEST(LogSigmoidCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(206);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (DType out_dtype : {DType::F32, dtype}) {
      for (Shape2 s : kShapes) {
        for (bool seeded : {true, false}) {
          SCOPED_TRACE(case_name(dtype, s) + " out " + dtype_name(out_dtype) + (seeded ? " seeded" : " fresh"));
          Tensor x = rounded(rng, {s.rows, s.width}, 4.0, dtype), dy = rounded(rng, {s.rows, s.width}, 1.0, out_dtype);
          Tensor dx0 = rounded(rng, {s.rows, s.width}, 0.5, dtype);
          Tape ref_tape, tape;
          Var rx = make_var(x, true, "x");
          if (seeded) rx->grad = dx0.clone();
          Var ry = log_sigmoid(ref_tape, rx, 16.0, DType::F64);
          ref_tape.backward(ry, dy);
          Var gx = make_var(to_gpu(x, dtype), true, "x");
          if (seeded) gx->grad = to_gpu(dx0, dtype);
          Var gy = log_sigmoid(tape, gx, 16.0, out_dtype);
          ASSERT_EQ(gy->value.dtype(), out_dtype);
          tape.backward(gy, to_gpu(dy, out_dtype));
          // fp32 output: IEEE expf/log1pf, a few ulps; a bf16 output or gradient: its final rounding (rel_tol).
          expect_close(gy->value, ry->value, out_dtype == DType::F32 ? 1e-6 : rel_tol(dtype), abs_tol(dtype), "y");
          expect_close(gx->grad, rx->grad, rel_tol(dtype), abs_tol(dtype), "dx");
        }
      }
    }
  }
}

}  // namespace
}  // namespace hgrn
