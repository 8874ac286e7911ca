// test_linear_cross_entropy_cuda.cpp: the chunked GPU head + loss against the fp64 CPU composition (linear +
// cross_entropy) on the values the GPU sees: loss, counts, and the gradients of x and of the fp32 master weight,
// accumulated onto existing gradients with a non-unit dloss. fp32 and bf16 activations; chunks that do not divide
// the rows (7 of 50), one row, a vocabulary that is not a multiple of the 16-byte pack (37), the real 50304 in
// several chunks, ignored rows, a batch with no target at all, and a bad target in a later chunk.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/linear_cross_entropy.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/elementwise.h"
#endif

namespace hgrn {
namespace {

using testing::expect_close;
using testing::round_through;
using testing::to_gpu;

struct Case {
  int64_t rows, width, vocab, chunk;
  int ignored_every;  // every n-th row has no target (0: none)
};

void check_case(const Case& c, DType act) {
  SCOPED_TRACE(detail::concat(dtype_name(act), " rows ", c.rows, " D ", c.width, " vocab ", c.vocab, " chunk ",
                              c.chunk));
  Rng rng(static_cast<uint64_t>(c.rows * 131 + c.vocab));
  const Tensor x = round_through(testing::random_tensor(rng, {c.rows, c.width}), act);
  const Tensor w_master = round_through(testing::random_tensor(rng, {c.vocab, c.width}, 0.3), DType::F32);
  const Tensor gx0 = round_through(testing::random_tensor(rng, {c.rows, c.width}, 0.01), act);
  const Tensor gw0 = round_through(testing::random_tensor(rng, {c.vocab, c.width}, 0.01), DType::F32);
  std::vector<int32_t> target_values;
  for (int64_t r = 0; r < c.rows; ++r)
    target_values.push_back(c.ignored_every > 0 && r % c.ignored_every == 0
                                ? -100
                                : static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab))));
  const Tensor targets = Tensor::from_vector(target_values, {c.rows});
  const double dloss = 0.7;

  // Reference: fp64, with the weight the GPU's GEMMs read (its bf16 copy under bf16 activations).
  Var rx = make_var(x.clone(), true), rw = make_var(round_through(w_master, act == DType::BF16 ? DType::BF16 : DType::F32), true);
  rx->grad = gx0.clone();
  rw->grad = gw0.clone();
  Tape ref_tape;
  const CrossEntropyResult ref = linear_cross_entropy(ref_tape, rx, rw, targets);
  ref_tape.backward(ref.loss, Tensor::full({}, dloss, DType::F64));

  Var gx = make_var(to_gpu(x, act), true), gw = make_var(to_gpu(w_master, DType::F32), true);
  gx->grad = to_gpu(gx0, act);
  gw->grad = to_gpu(gw0, DType::F32);
  Tape tape;
  const CrossEntropyResult got = linear_cross_entropy(tape, gx, gw, to_gpu(targets, DType::I32), -100, c.chunk);
  tape.backward(got.loss, to_gpu(Tensor::full({}, dloss, DType::F64), DType::F32));

  EXPECT_EQ(got.num_targets, ref.num_targets);
  // Logits rounded to bf16 (or fp32) may break a near-tie the other way than fp64.
  EXPECT_LE(std::abs(got.num_correct - ref.num_correct), act == DType::BF16 ? 2 : 1);
  // fp32: rounding of the inputs' products only (1e-5); bf16: the logits and dlogits are bf16 (8-bit mantissa), a
  // few roundings of ~4e-3 each, reviewed at 2e-2 relative RMS.
  const double tol = act == DType::BF16 ? 2e-2 : 1e-5;
  const double loss = ref.loss->value.item();
  EXPECT_NEAR(got.loss->value.item(), loss, (act == DType::BF16 ? 2e-3 : 1e-6) * std::max(1.0, std::fabs(loss)));
  expect_close(gx->grad, rx->grad, tol, 1.0, "dx");
  expect_close(gw->grad, rw->grad, tol, 1.0, "dW (fp32 master gradient)");
}

TEST(LinearCrossEntropyCuda, MatchesTheCpuCompositionOnOddShapes) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16}) {
    check_case({50, 24, 37, 7, 5}, act);     // 8 chunks, the last of 1 row; scalar (unpacked) vocab path
    check_case({1, 16, 64, 0, 0}, act);      // one row
    check_case({130, 40, 1000, 64, 9}, act); // a partial last chunk
    check_case({300, 64, 50304, 128, 11}, act);  // the real vocabulary in 3 chunks
  }
}

TEST(LinearCrossEntropyCuda, NoTargetsGiveZeroLossAndLeaveGradientsAlone) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(3);
  Var x = make_var(to_gpu(testing::random_tensor(rng, {6, 8}), DType::BF16), true);
  Var w = make_var(to_gpu(testing::random_tensor(rng, {11, 8}), DType::F32), true);
  const Tensor gw0 = to_gpu(testing::random_tensor(rng, {11, 8}), DType::F32);
  w->grad = gw0.clone();
  Tape tape;
  const CrossEntropyResult r =
      linear_cross_entropy(tape, x, w, to_gpu(Tensor::full({6}, -100, DType::I32), DType::I32), -100, 4);
  EXPECT_EQ(r.num_targets, 0);
  EXPECT_EQ(r.loss->value.item(), 0.0);
  tape.backward(r.loss, to_gpu(Tensor::full({}, 1.0, DType::F32), DType::F32));
  expect_close(w->grad, gw0, 0, 0, "dW untouched");
  Tape bad;
  EXPECT_THROW(linear_cross_entropy(bad, x, w, to_gpu(Tensor::full({6}, 11, DType::I32), DType::I32)), Error);
  // The chunks' counts are read back after the last chunk: a bad target in a later chunk is still named by its own
  // row and value (int32 and int64 targets; chunks of 4 rows, the bad one in the second chunk).
  for (DType target_dtype : {DType::I32, DType::I64}) {
    const Tensor targets = to_gpu(Tensor::from_vector(std::vector<int32_t>{0, 1, -100, 3, 4, 11}, {6}), target_dtype);
    std::string message = "(no error)";
    try {
      linear_cross_entropy(bad, x, w, targets, -100, 4);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("target 11 in row 5 is out of range for vocab size 11"), std::string::npos) << message;
  }
}

// The kernel that scales the head's forward-computed gradient into x's and W's gradients: dst (+)= scale·factor·src
// against fp64, both dtypes, overwrite and accumulate, odd sizes (the unpacked tail) and a misaligned view (all
// unpacked). One rounding to the destination dtype: fp32 ~1e-7, bf16 2^-9 relative.
TEST(ScaledAccumulateCuda, MatchesTheFormulaOnOddSizes) {
  HGRN_SKIP_WITHOUT_GPU();
#ifdef HGRN_WITH_CUDA
  Rng rng(12);
  const double scale = 0.7, factor = 1.0 / 300;
  const Tensor scale_gpu = to_gpu(Tensor::full({}, scale, DType::F64), DType::F32);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t n : {1, 7, 1001, 4096}) {
      for (int64_t offset : {0, 1}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(detail::concat(dtype_name(dtype), " n ", n, " offset ", offset, " accumulate ", accumulate));
          const Tensor src = round_through(testing::random_tensor(rng, {offset + n}, 100.0), DType::F32);
          const Tensor dst0 = round_through(testing::random_tensor(rng, {offset + n}), dtype);
          Tensor dst = to_gpu(dst0, dtype);
          const Tensor src_gpu = to_gpu(src, DType::F32);
          cuda_scaled_accumulate(static_cast<char*>(dst.raw_data()) + offset * dtype_size(dtype), dtype,
                                 src_gpu.data<float>() + offset, scale_gpu.data<float>(), static_cast<float>(factor),
                                 accumulate, n);
          const std::vector<double> got = dst.to(Device::CPU).to_double_vector();
          const std::vector<double> s = src.to_double_vector(), d0 = dst0.to_double_vector();
          // Relative to the terms, not the sum (which may cancel): fp32 scale·factor and the fma each round once
          // (~1e-7); bf16 the result rounds once (2^-9). Elements before the view stay exactly as they were.
          const double rel = dtype == DType::F32 ? 1e-6 : 4e-3;
          for (int64_t i = 0; i < offset + n; ++i) {
            if (i < offset) {
              ASSERT_EQ(got[i], d0[i]) << "element " << i << " is outside the view";
              continue;
            }
            const double old_value = accumulate ? d0[i] : 0.0, term = scale * factor * s[i];
            ASSERT_NEAR(got[i], old_value + term, rel * (std::fabs(old_value) + std::fabs(term)) + 1e-30)
                << "element " << i;
          }
        }
      }
    }
  }
#endif
}

}  // namespace
}  // namespace hgrn
