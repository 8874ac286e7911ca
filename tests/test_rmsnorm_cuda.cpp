// test_rmsnorm_cuda.cpp: the CUDA rmsnorm and add_rmsnorm against the fp64 CPU reference computed from the same
// (rounded) inputs, fp32 and bf16 activations, odd row counts and widths, with and without a weight, gradients
// accumulated onto existing ones; the weight gradient's bits repeat run to run; the backward writes the forward's
// output again with the same bits (release_until_producer_backward). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/rng.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::round_through;
using testing::to_gpu;

constexpr double kEps = 1e-6;

std::string case_name(DType dtype, int64_t rows, int64_t width, bool with_weight) {
  return std::string(dtype_name(dtype)) + " rows=" + std::to_string(rows) + " width=" + std::to_string(width) +
         (with_weight ? " weight" : " no weight");
}

// Tolerances for act-dtype results (y, dx): fp32 differs from fp64 by float rounding of O(width) sums (tight);
// bf16 by the final rounding to bf16 (2^-9 relative per element) of values up to ~20.
double act_rel(DType dtype) { return dtype == DType::F32 ? 1e-5 : 1e-2; }
double act_abs(DType dtype) { return dtype == DType::F32 ? 1e-4 : 1e-1; }

TEST(RmsNormCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(101);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 63, 65, 2047}) {
      for (int64_t width : {96, 200, 771, 1024, 1544, 2048}) {
        for (bool with_weight : {true, false}) {
          SCOPED_TRACE(case_name(dtype, rows, width, with_weight));
          // The values the GPU sees: activations rounded to the act dtype, the weight (a parameter) to fp32.
          Tensor x = round_through(testing::random_tensor(rng, {rows, width}, 2.0), dtype);
          Tensor w = round_through(testing::random_tensor(rng, {width}), DType::F32);
          Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), dtype);
          Tensor dx0 = round_through(testing::random_tensor(rng, {rows, width}, 0.5), dtype);
          Tensor dw0 = round_through(testing::random_tensor(rng, {width}, 0.5), DType::F32);

          Tape ref_tape;
          Var rx = make_var(x, true, "x"), rw = with_weight ? make_var(w, true, "weight") : nullptr;
          rx->grad = dx0.clone();
          if (rw) rw->grad = dw0.clone();
          Var ry = rmsnorm(ref_tape, rx, rw, kEps);
          ref_tape.backward(ry, dy);

          Tape tape;
          Var gx = make_var(to_gpu(x, dtype), true, "x");
          Var gw = with_weight ? make_var(to_gpu(w, DType::F32), true, "weight") : nullptr;
          gx->grad = to_gpu(dx0, dtype);  // backward accumulates onto these
          if (gw) gw->grad = to_gpu(dw0, DType::F32);
          Var gy = rmsnorm(tape, gx, gw, kEps);
          ASSERT_EQ(gy->value.device(), Device::CUDA);
          ASSERT_EQ(gy->value.dtype(), dtype);
          tape.backward(gy, to_gpu(dy, dtype));

          expect_close(gy->value, ry->value, act_rel(dtype), act_abs(dtype), "y");
          expect_close(gx->grad, rx->grad, act_rel(dtype), act_abs(dtype), "dx");
          if (with_weight) {
            ASSERT_EQ(gw->grad.dtype(), DType::F32);
            // fp32 sums over rows of fp32 products of exactly the reference's inputs (bf16 values are exact in
            // fp32): tight for both act dtypes; the abs bound allows ~2047-term sums of magnitude ~50.
            expect_close(gw->grad, rw->grad, 1e-5, 1e-3, "dweight");
          }
        }
      }
    }
  }
}

// Seeds the GPU add_rmsnorm's outputs and runs backward: dy for normed (or none), ds for the sum (or none).
void run_add_rmsnorm_backward(Tape& tape, const AddRmsNormResult& o, const Tensor* dy, const Tensor* ds) {
  if (dy) {
    if (ds) o.sum->grad = ds->clone();
    tape.backward(o.normed, *dy);
  } else {
    tape.backward(o.sum, *ds);
  }
}

TEST(AddRmsNormCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(102);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t rows : {1, 63, 65, 2047}) {
      for (int64_t width : {96, 200, 771, 1024, 1544, 2048}) {
        for (bool with_weight : {true, false}) {
          // Which outputs reach the loss: both, only normed (the sum's grad stays undefined), only the sum.
          for (int used : {0, 1, 2}) {
            const bool use_normed = used != 2, use_sum = used != 1;
            SCOPED_TRACE(case_name(dtype, rows, width, with_weight) + " uses " +
                         (use_normed ? (use_sum ? "both" : "normed") : "sum"));
            Tensor r = round_through(testing::random_tensor(rng, {rows, width}, 2.0), dtype);
            Tensor d = round_through(testing::random_tensor(rng, {rows, width}), dtype);
            Tensor w = round_through(testing::random_tensor(rng, {width}), DType::F32);
            Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), dtype);
            Tensor ds = round_through(testing::random_tensor(rng, {rows, width}), dtype);
            Tensor dr0 = round_through(testing::random_tensor(rng, {rows, width}, 0.5), dtype);
            Tensor dw0 = round_through(testing::random_tensor(rng, {width}, 0.5), DType::F32);

            Tape ref_tape;
            Var rr = make_var(r, true, "residual"), rd = make_var(d, true, "delta");
            Var rw = with_weight ? make_var(w, true, "weight") : nullptr;
            rr->grad = dr0.clone();
            if (rw) rw->grad = dw0.clone();
            AddRmsNormResult ref = add_rmsnorm(ref_tape, rr, rd, rw, kEps);
            run_add_rmsnorm_backward(ref_tape, ref, use_normed ? &dy : nullptr, use_sum ? &ds : nullptr);

            Tape tape;
            Var gr = make_var(to_gpu(r, dtype), true, "residual"), gd = make_var(to_gpu(d, dtype), true, "delta");
            Var gw = with_weight ? make_var(to_gpu(w, DType::F32), true, "weight") : nullptr;
            gr->grad = to_gpu(dr0, dtype);  // accumulated onto; delta's grad starts undefined (zeros)
            if (gw) gw->grad = to_gpu(dw0, DType::F32);
            AddRmsNormResult got = add_rmsnorm(tape, gr, gd, gw, kEps);
            const Tensor gdy = to_gpu(dy, dtype), gds = to_gpu(ds, dtype);
            run_add_rmsnorm_backward(tape, got, use_normed ? &gdy : nullptr, use_sum ? &gds : nullptr);

            // The sum: one rounding of an exact fp64 sum (fp32: 2^-24 relative, bf16: 2^-9).
            expect_close(got.sum->value, ref.sum->value, dtype == DType::F32 ? 1e-6 : 1e-2, act_abs(dtype), "sum");
            // bf16 normalises the bf16-rounded sum, the reference the exact one: still ~2^-9 relative.
            expect_close(got.normed->value, ref.normed->value, act_rel(dtype), act_abs(dtype), "normed");
            expect_close(gr->grad, rr->grad, act_rel(dtype), act_abs(dtype), "dresidual");
            expect_close(gd->grad, rd->grad, act_rel(dtype), act_abs(dtype), "ddelta");
            if (with_weight) {
              // fp32: tight; bf16: each term uses the bf16-rounded sum (2^-9 relative), averaging down over rows.
              expect_close(gw->grad, rw->grad, dtype == DType::F32 ? 1e-5 : 1e-2, dtype == DType::F32 ? 1e-3 : 0.5,
                           "dweight");
            }
          }
        }
      }
    }
  }
}

// A frozen residual (and weight) gets no gradient; one tensor as both inputs gets both contributions.
TEST(AddRmsNormCuda, FrozenInputAndSharedInput) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(103);
  const int64_t rows = 65, width = 200;
  Tensor r = round_through(testing::random_tensor(rng, {rows, width}), DType::F32);
  Tensor d = round_through(testing::random_tensor(rng, {rows, width}), DType::F32);
  Tensor w = round_through(testing::random_tensor(rng, {width}), DType::F32);
  Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), DType::F32);

  Tape tape, ref_tape;
  Var gr = make_var(to_gpu(r, DType::F32), false, "residual"), gd = make_var(to_gpu(d, DType::F32), true, "delta");
  Var gw = make_var(to_gpu(w, DType::F32), false, "weight");
  tape.backward(add_rmsnorm(tape, gr, gd, gw, kEps).normed, to_gpu(dy, DType::F32));
  Var rr = make_var(r, false, "residual"), rd = make_var(d, true, "delta"), rw = make_var(w, false, "weight");
  ref_tape.backward(add_rmsnorm(ref_tape, rr, rd, rw, kEps).normed, dy);
  EXPECT_FALSE(gr->grad.defined());
  EXPECT_FALSE(gw->grad.defined());
  expect_close(gd->grad, rd->grad, 1e-5, 1e-4, "ddelta with a frozen residual");  // fp32: tight

  Tape shared_tape, shared_ref_tape;
  Var gx = make_var(to_gpu(r, DType::F32), true, "x");
  shared_tape.backward(add_rmsnorm(shared_tape, gx, gx, nullptr, kEps).normed, to_gpu(dy, DType::F32));
  Var rx = make_var(r, true, "x");
  shared_ref_tape.backward(add_rmsnorm(shared_ref_tape, rx, rx, nullptr, kEps).normed, dy);
  expect_close(gx->grad, rx->grad, 1e-5, 1e-4, "dx of x + x");  // fp32: tight
}

// On the GPU the fused op and add followed by rmsnorm round the same fp32 sum, so the sums are bitwise equal and the
// normalised outputs agree to fp32 rounding.
TEST(AddRmsNormCuda, ForwardEqualsAddFollowedByRmsNorm) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(104);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t width : {771, 768, 2048}) {  // the block-per-row kernel, and the warp-per-row one at model widths
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " width " + std::to_string(width));
      Tensor r = testing::random_tensor(rng, {63, width}), d = testing::random_tensor(rng, {63, width});
      Var w = make_var(to_gpu(testing::random_tensor(rng, {width}), DType::F32));
      Tape tape;
      Var gr = make_var(to_gpu(r, dtype)), gd = make_var(to_gpu(d, dtype));
      AddRmsNormResult fused = add_rmsnorm(tape, gr, gd, w, kEps);
      Var sum = add(tape, gr, gd);
      Var normed = rmsnorm(tape, sum, w, kEps);
      Tensor a = fused.sum->value.to(Device::CPU), b = sum->value.to(Device::CPU);
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "sums differ";
      // The same arithmetic on the same rounded sum, so the same bits: the model relies on it when it recomputes a
      // block's normalised input as rmsnorm of the kept sum (rematerialize) instead of keeping add_rmsnorm's output.
      Tensor na = fused.normed->value.to(Device::CPU), nb = normed->value.to(Device::CPU);
      EXPECT_EQ(std::memcmp(na.raw_data(), nb.raw_data(), na.nbytes()), 0) << "normed outputs differ";
    }
  }
}

// The weight gradient is reduced without atomics in a fixed order: two runs give the same bits (dx too). Many rows,
// so the reduction spans many row chunks.
TEST(RmsNormCuda, GradientsAreBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(105);
  const int64_t rows = 8192 + 17, width = 2048;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
    const Tensor w = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
    const Tensor dy = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
    Tensor first[4];
    for (int run = 0; run < 2; ++run) {
      Tape tape;
      Var gx = make_var(x, true, "x"), gw = make_var(w, true, "weight");
      tape.backward(rmsnorm(tape, gx, gw, kEps), dy);
      Tape add_tape;
      Var gr = make_var(x, true, "residual"), gd = make_var(dy, false, "delta"), gw2 = make_var(w, true, "weight");
      add_tape.backward(add_rmsnorm(add_tape, gr, gd, gw2, kEps).normed, dy);
      const Tensor got[4] = {gx->grad.to(Device::CPU), gw->grad.to(Device::CPU), gr->grad.to(Device::CPU),
                             gw2->grad.to(Device::CPU)};
      const char* names[4] = {"rmsnorm dx", "rmsnorm dweight", "add_rmsnorm dresidual", "add_rmsnorm dweight"};
      for (int k = 0; k < 4; ++k) {
        if (run == 0)
          first[k] = got[k];
        else
          EXPECT_EQ(std::memcmp(got[k].raw_data(), first[k].raw_data(), got[k].nbytes()), 0)
              << names[k] << " differs between runs";
      }
    }
  }
}

// A large case (rows = 16 sequences of 2048 tokens) against the reference, for the weight gradient whose
// reduction depth grows with rows: width 771 takes the block-per-row kernels, 1024 (the model's D) the fused
// warp-per-row backward. x's gradient starts undefined (the GPU overwrites a fresh buffer) or x is frozen.
TEST(RmsNormCuda, ManyRowsWeightGradient) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(106);
  for (int64_t width : {771, 1024}) {
    for (bool x_grad : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "width " << width << (x_grad ? ", dx" : ", x frozen"));
      const int64_t rows = 16 * 2048 + 3;
      Tensor x = round_through(testing::random_tensor(rng, {rows, width}), DType::BF16);
      Tensor w = round_through(testing::random_tensor(rng, {width}), DType::F32);
      Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), DType::BF16);
      Tape ref_tape;
      Var rx = make_var(x, x_grad, "x"), rw = make_var(w, true, "weight");
      ref_tape.backward(rmsnorm(ref_tape, rx, rw, kEps), dy);
      Tape tape;
      Var gx = make_var(to_gpu(x, DType::BF16), x_grad, "x"), gw = make_var(to_gpu(w, DType::F32), true, "weight");
      tape.backward(rmsnorm(tape, gx, gw, kEps), to_gpu(dy, DType::BF16));
      // fp32 sums of ~33k exact products: rounding grows ~sqrt(rows)·2^-24 relative; sums reach ~600.
      expect_close(gw->grad, rw->grad, 1e-5, 1e-2, "dweight over 32771 rows");
      if (x_grad) expect_close(gx->grad, rx->grad, act_rel(DType::BF16), act_abs(DType::BF16), "dx");
    }
  }
}

// The norm's output released until its backward, where two linears' weight gradients wait for it (as the model
// does for q/f/i): the backward kernels write it again, so every gradient must equal keeping it, bit for bit. Warp
// path (widths that are whole 16-byte packs) and block path (771), rmsnorm and add_rmsnorm, with and without weight.
TEST(RmsNormCuda, OutputWrittenAgainByTheBackwardHasTheForwardsBits) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(107);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t width : {200, 771, 1024, 2048}) {
      for (int variant = 0; variant < 3; ++variant) {  // rmsnorm with weight, without, add_rmsnorm with weight
        const bool add = variant == 2, with_weight = variant != 1;
        SCOPED_TRACE(case_name(dtype, 65, width, with_weight) + (add ? " add_rmsnorm" : " rmsnorm"));
        const Tensor x = to_gpu(testing::random_tensor(rng, {65, width}, 2.0, DType::F32), dtype);
        const Tensor d = to_gpu(testing::random_tensor(rng, {65, width}, 1.0, DType::F32), dtype);
        const Tensor g = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
        const Tensor w = to_gpu(testing::random_tensor(rng, {24, width}, 0.1, DType::F32), dtype);
        const Tensor v = to_gpu(testing::random_tensor(rng, {24, width}, 0.1, DType::F32), dtype);
        const Tensor dy = to_gpu(testing::random_tensor(rng, {65, 24}, 1.0, DType::F32), dtype);
        std::vector<Tensor> runs[2];
        for (int released = 0; released < 2; ++released) {
          Var gx = make_var(x, true, "x"), gd = make_var(d, true, "delta");
          Var gg = with_weight ? make_var(g, true, "norm weight") : nullptr;
          Var gw = make_var(w, true, "w"), gv = make_var(v, true, "v");
          Tape tape;
          const Var normed = add ? add_rmsnorm(tape, gx, gd, gg, kEps).normed : rmsnorm(tape, gx, gg, kEps);
          const Var y1 = linear(tape, normed, gw), y2 = linear(tape, normed, gv);
          const Var y = add_rmsnorm(tape, y1, y2, nullptr, kEps).sum;
          if (released) release_until_producer_backward(tape, normed);
          EXPECT_EQ(normed->value.defined(), !released);
          tape.backward(y, dy);
          for (const Var& p : {gx, gd, gg, gw, gv})
            if (p && p->grad.defined()) runs[released].push_back(p->grad.to(Device::CPU));
        }
        ASSERT_EQ(runs[0].size(), add ? 5u : with_weight ? 4u : 3u);
        ASSERT_EQ(runs[0].size(), runs[1].size());
        for (size_t k = 0; k < runs[0].size(); ++k)
          EXPECT_EQ(std::memcmp(runs[0][k].raw_data(), runs[1][k].raw_data(), runs[0][k].nbytes()), 0)
              << "gradient " << k << " differs with the output written again by the backward";
      }
    }
  }
}

}  // namespace
}  // namespace hgrn
