// test_rmsnorm_cuda.cpp: the CUDA rmsnorm against the fp64 CPU reference computed from the same (rounded) inputs,
// fp32 and bf16 activations, odd row counts and widths, with and without a weight, gradients accumulated onto
// existing ones (as onto the residual stream's handed-over gradient); the weight gradient's bits repeat run to run;
// the backward writes the forward's output again with the same bits (release_until_producer_backward), also where a
// linear's residual gradient is handed over meanwhile; many rows per warp, through the warp kernels' row buffers;
// per-head groups of a row normalised each on its own.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/rmsnorm.h"
#endif

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

// Per-head groups (GLA's and RetNet's output norm): rows of head-width groups, small widths (the warp path's idle
// lanes, the block path for widths not a multiple of the pack) and the 385m shapes' 256.
TEST(RmsNormCuda, GroupsMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(106);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (auto [rows, heads, group] : {std::tuple<int64_t, int64_t, int64_t>{65, 2, 4}, {63, 3, 24}, {7, 5, 3},
                                      {129, 4, 256}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " rows=" + std::to_string(rows) + " heads=" +
                   std::to_string(heads) + " group=" + std::to_string(group));
      const int64_t width = heads * group;
      Tensor x = round_through(testing::random_tensor(rng, {rows, width}, 2.0), dtype);
      Tensor w = round_through(testing::random_tensor(rng, {group}), DType::F32);
      Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), dtype);
      Tape ref_tape, tape;
      Var rx = make_var(x, true, "x"), rw = make_var(w, true, "weight");
      Var ry = rmsnorm(ref_tape, rx, rw, kEps, group);
      ref_tape.backward(ry, dy);
      Var gx = make_var(to_gpu(x, dtype), true, "x"), gw = make_var(to_gpu(w, DType::F32), true, "weight");
      Var gy = rmsnorm(tape, gx, gw, kEps, group);
      tape.backward(gy, to_gpu(dy, dtype));
      expect_close(gy->value, ry->value, act_rel(dtype), act_abs(dtype), "y");
      expect_close(gx->grad, rx->grad, act_rel(dtype), act_abs(dtype), "dx");
      // fp32 sums over rows·heads terms of exactly the reference's inputs (as MatchesCpuReference's dweight).
      expect_close(gw->grad, rw->grad, 1e-5, 1e-3, "dweight");
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
      Tape add_tape;  // dx added onto a gradient already there, as onto the residual stream's handed-over one
      Var gr = make_var(x, true, "x"), gw2 = make_var(w, true, "weight");
      gr->grad = dy.clone();
      add_tape.backward(rmsnorm(add_tape, gr, gw2, kEps), dy);
      const Tensor got[4] = {gx->grad.to(Device::CPU), gw->grad.to(Device::CPU), gr->grad.to(Device::CPU),
                             gw2->grad.to(Device::CPU)};
      const char* names[4] = {"dx", "dweight", "dx added onto a gradient", "dweight beside it"};
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

// Many rows per warp (the warp kernels' rows arrive one ahead of use through two shared-memory buffers, which every
// warp then alternates several times; in the tests above most forward warps get one row): the output and dx against
// the reference for fp32 and bf16 rows of 1024 (whole packs in every lane) and 1544 (bf16: 193 packs, the last lanes
// idle on the last pack; fp32: the block-per-row kernels, for contrast). 20011 rows: more than the resident warps.
TEST(RmsNormCuda, ManyRowsPerWarpMatchCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(108);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t width : {1024, 1544}) {
      SCOPED_TRACE(case_name(dtype, 20011, width, true));
      const int64_t rows = 20011;
      Tensor x = round_through(testing::random_tensor(rng, {rows, width}, 2.0), dtype);
      Tensor w = round_through(testing::random_tensor(rng, {width}), DType::F32);
      Tensor dy = round_through(testing::random_tensor(rng, {rows, width}), dtype);
      Tensor dx0 = round_through(testing::random_tensor(rng, {rows, width}, 0.5), dtype);
      Tape ref_tape;
      Var rx = make_var(x, true, "x"), rw = make_var(w, false, "weight");
      rx->grad = dx0.clone();
      Var ry = rmsnorm(ref_tape, rx, rw, kEps);
      ref_tape.backward(ry, dy);
      Tape tape;
      Var gx = make_var(to_gpu(x, dtype), true, "x"), gw = make_var(to_gpu(w, DType::F32), false, "weight");
      gx->grad = to_gpu(dx0, dtype);  // accumulated onto: the backward's early read of dx
      Var gy = rmsnorm(tape, gx, gw, kEps);
      tape.backward(gy, to_gpu(dy, dtype));
      expect_close(gy->value, ry->value, act_rel(dtype), act_abs(dtype), "y");
      expect_close(gx->grad, rx->grad, act_rel(dtype), act_abs(dtype), "dx");
    }
  }
}

// The norm's output released until its backward, where two linears' weight gradients wait for it (as the model
// does for q/f/i): the backward kernels write it again, so every gradient must equal keeping it, bit for bit. Warp
// path (widths that are whole 16-byte packs) and block path (771), with and without weight, the linears summed by
// add or the second adding the first as its residual (its gradient handed over while both weight gradients wait).
TEST(RmsNormCuda, OutputWrittenAgainByTheBackwardHasTheForwardsBits) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(107);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t width : {200, 771, 1024, 2048}) {
      for (int variant = 0; variant < 3; ++variant) {  // with weight, without, with weight and a residual
        const bool residual = variant == 2, with_weight = variant != 1;
        SCOPED_TRACE(case_name(dtype, 65, width, with_weight) + (residual ? " residual" : " add"));
        const Tensor x = to_gpu(testing::random_tensor(rng, {65, width}, 2.0, DType::F32), dtype);
        const Tensor g = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
        const Tensor w = to_gpu(testing::random_tensor(rng, {24, width}, 0.1, DType::F32), dtype);
        const Tensor v = to_gpu(testing::random_tensor(rng, {24, width}, 0.1, DType::F32), dtype);
        const Tensor dy = to_gpu(testing::random_tensor(rng, {65, 24}, 1.0, DType::F32), dtype);
        std::vector<Tensor> runs[2];
        for (int released = 0; released < 2; ++released) {
          Var gx = make_var(x, true, "x");
          Var gg = with_weight ? make_var(g, true, "norm weight") : nullptr;
          Var gw = make_var(w, true, "w"), gv = make_var(v, true, "v");
          Tape tape;
          const Var normed = rmsnorm(tape, gx, gg, kEps);
          const Var y1 = linear(tape, normed, gw);
          const Var y = residual ? linear(tape, normed, gv, y1) : add(tape, y1, linear(tape, normed, gv));
          if (released) release_until_producer_backward(tape, normed);
          EXPECT_EQ(normed->value.defined(), !released);
          tape.backward(y, dy);
          for (const Var& p : {gx, gg, gw, gv})
            if (p && p->grad.defined()) runs[released].push_back(p->grad.to(Device::CPU));
        }
        ASSERT_EQ(runs[0].size(), with_weight ? 4u : 3u);
        ASSERT_EQ(runs[0].size(), runs[1].size());
        for (size_t k = 0; k < runs[0].size(); ++k)
          EXPECT_EQ(std::memcmp(runs[0][k].raw_data(), runs[1][k].raw_data(), runs[0][k].nbytes()), 0)
              << "gradient " << k << " differs with the output written again by the backward";
      }
    }
  }
}

#ifdef HGRN_WITH_CUDA
// The backward writing the norm's output again as FP8 codes (an FP8 projection's input, ops/recompute.h) in place of
// the act-dtype output: the codes are the reference cast (ops/fp8.h) of the output the same backward writes otherwise,
// and dx and dweight keep their bits. fp32 and bf16, with and without a weight, with dy and with none (the codes
// alone), 65 rows.
TEST(RmsNormCuda, BackwardWritesTheCodesOfItsOutput) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(109);
  const float scale = 24.0f;
  const Tensor scale_t = to_gpu(Tensor::full({1}, scale, DType::F32), DType::F32);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t width : {200, 1024}) {
      for (const bool with_weight : {true, false}) {
        for (const bool with_dy : {true, false}) {
          SCOPED_TRACE(case_name(dtype, 65, width, with_weight) + (with_dy ? " dy" : " no dy"));
          const int64_t rows = 65, n = rows * width;
          const Tensor x = to_gpu(testing::random_tensor(rng, {rows, width}, 2.0, DType::F32), dtype);
          const Tensor g = to_gpu(testing::random_tensor(rng, {width}, 1.0, DType::F32), DType::F32);
          const Tensor dy = to_gpu(testing::random_tensor(rng, {rows, width}, 1.0, DType::F32), dtype);
          Tensor y = Tensor::empty({rows, width}, dtype, Device::CUDA);
          Tensor rstd = Tensor::empty({rows}, DType::F32, Device::CUDA);
          rmsnorm_forward_into(x, with_weight ? &g : nullptr, kEps, y, rstd);
          const auto backward = [&](Tensor* y_again, const Fp8CodesOut* codes) {
            Tensor dx = Tensor::empty({rows, width}, dtype, Device::CUDA);
            // A fresh weight gradient (dweight_add false) is written, never read: NaN before must not show.
            Tensor dw = to_gpu(Tensor::full({width}, std::numeric_limits<double>::quiet_NaN(), DType::F32), DType::F32);
            cuda_rmsnorm_backward(x.raw_data(), with_weight ? g.data<float>() : nullptr, rstd.data<float>(),
                                  with_dy ? dy.raw_data() : nullptr, dx.raw_data(), false, dw.data<float>(), false,
                                  y_again ? y_again->raw_data() : nullptr, rows, width, dtype, nullptr, codes);
            return std::make_pair(dx.to(Device::CPU), dw.to(Device::CPU));
          };
          Tensor y_again = Tensor::empty({rows, width}, dtype, Device::CUDA);
          const auto plain = backward(&y_again, nullptr);
          const Tensor codes = Tensor::zeros({(n + 3) / 4}, DType::I32, Device::CUDA);
          const Fp8CodesOut out{static_cast<uint8_t*>(codes.raw_data()), scale_t.data<float>(), nullptr,
                                Fp8Format::E4M3};
          ASSERT_TRUE(cuda_rmsnorm_codes_fit(width, dtype, {x.raw_data(), g.raw_data(), dy.raw_data()}));
          const auto coded = backward(nullptr, &out);
          const Tensor y_host = y_again.to(Device::CPU).to(DType::F32);
          std::vector<uint8_t> want(static_cast<size_t>(n));
          fp8_quantize(y_host.data<float>(), n, scale, Fp8Format::E4M3, want.data());
          const Tensor got = codes.to(Device::CPU);
          EXPECT_EQ(std::memcmp(got.raw_data(), want.data(), static_cast<size_t>(n)), 0) << "codes";
          EXPECT_EQ(std::memcmp(y_again.to(Device::CPU).raw_data(), y.to(Device::CPU).raw_data(), y.nbytes()), 0)
              << "the output written again is the forward's";
          const Tensor dw_host = coded.second;
          for (int64_t c = 0; c < width; ++c)
            ASSERT_TRUE(std::isfinite(dw_host.data<float>()[c]) && (with_dy || dw_host.data<float>()[c] == 0.0f))
                << "dweight[" << c << "] = " << dw_host.data<float>()[c] << ": the fresh buffer is written (zeros "
                << "without dy)";
          if (with_dy) {
            EXPECT_EQ(std::memcmp(coded.first.raw_data(), plain.first.raw_data(), plain.first.nbytes()), 0) << "dx";
            EXPECT_EQ(std::memcmp(coded.second.raw_data(), plain.second.raw_data(), plain.second.nbytes()), 0)
                << "dweight";
          }
        }
      }
    }
  }
}
#endif

}  // namespace
}  // namespace hgrn
