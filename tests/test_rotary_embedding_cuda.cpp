// test_rotary_embedding_cuda.cpp: the CUDA rotary embedding and state shift against the CPU reference on the same
// (rounded) inputs: fp32 and bf16, odd shapes, positions into the thousands, a column block of a wider tensor as
// input (gradient written into its columns), gradients fresh and added onto existing ones. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "core/rng.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "ops/elementwise.h"
#include "ops/rotary_embedding.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::round_through;
using testing::to_gpu;

// fp32: against the CPU op in fp32, the same angles on both devices (the host's frequencies times the position, one
// fp32 product, as fla's fp32 tables), then sincosf against the host's sinf/cosf, a few ulps of an O(1) rotation:
// 1e-5. (An fp64 reference differs by the fp32 angle's rounding, ~1e-4 at position 2000.) bf16: against fp64, the
// output's rounding, 2^-9 relative.
double rel_tol(DType dtype) { return dtype == DType::F32 ? 1e-5 : 1e-2; }
double abs_tol(DType dtype) { return dtype == DType::F32 ? 1e-4 : 5e-2; }

TEST(RotaryEmbeddingCuda, MatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(301);
  struct Case {
    int64_t batch, time, heads, head_dim, first, extra_columns;
  };
  for (DType dtype : {DType::F32, DType::BF16}) {
    // Heads of 16 and 128 (and rows 16-byte aligned) take the packed kernel, the others the general one; one
    // position over a batch of rows is a decoding step.
    for (const Case c : {Case{1, 1, 1, 2, 0, 0}, Case{2, 65, 3, 6, 0, 5}, Case{3, 130, 2, 128, 1900, 0},
                         Case{1, 7, 5, 4, 33, 3}, Case{2, 65, 3, 16, 7, 16}, Case{5, 1, 4, 32, 700, 0}}) {
      for (bool seeded : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " B" + std::to_string(c.batch) + " T" + std::to_string(c.time) +
                     " H" + std::to_string(c.heads) + " K" + std::to_string(c.head_dim) + " from " +
                     std::to_string(c.first) + (c.extra_columns ? " column block" : "") + (seeded ? " seeded" : ""));
        const int64_t width = c.heads * c.head_dim;
        // x is the first `width` columns of a wider tensor when extra_columns > 0 (row-strided, as q̂ in the fused
        // projection's output).
        const Tensor whole = round_through(testing::random_tensor(rng, {c.batch, c.time, width + c.extra_columns}), dtype);
        const Tensor dy = round_through(testing::random_tensor(rng, {c.batch, c.time, width}), dtype);
        const Tensor dwhole0 = round_through(testing::random_tensor(rng, whole.shape(), 0.5), dtype);
        Tape ref_tape, tape;
        const auto run = [&](Tape& t, const Var& w) {
          const Var x = c.extra_columns ? split_columns(t, w, {width, c.extra_columns})[0] : w;
          return rotary_embedding(t, x, c.heads, c.first);
        };
        const DType ref_dtype = dtype == DType::F32 ? DType::F32 : DType::F64;
        Var rw = make_var(whole.to(ref_dtype), true, "x"), gw = make_var(to_gpu(whole, dtype), true, "x");
        if (seeded) {
          rw->grad = dwhole0.to(ref_dtype);
          gw->grad = to_gpu(dwhole0, dtype);
        }
        Var ry = run(ref_tape, rw), gy = run(tape, gw);
        ref_tape.backward(ry, dy.to(ref_dtype));
        tape.backward(gy, to_gpu(dy, dtype));
        ASSERT_EQ(gy->value.dtype(), dtype);
        expect_close(gy->value, ry->value, rel_tol(dtype), abs_tol(dtype), "y");
        expect_close(gw->grad, rw->grad, rel_tol(dtype), abs_tol(dtype), "dx");
      }
    }
  }
}

// The packed kernel (aligned rows) and the general one (a column block one element off alignment) on the same values:
// the same products in the same order, so the same bits.
TEST(RotaryEmbeddingCuda, PackedAndGeneralKernelsGiveTheSameBits) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(303);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t batch = 3, time = 130, heads = 4, head_dim = 64, width = heads * head_dim;
    const Tensor whole = round_through(testing::random_tensor(rng, {batch, time, 1 + width}), dtype);
    const Tensor dy = round_through(testing::random_tensor(rng, {batch, time, width}), dtype);
    Tape general_tape, packed_tape;
    const Var w = make_var(to_gpu(whole, dtype), true, "x");
    const Var offset = split_columns(general_tape, w, {1, width})[1];  // starts one element past a 16-byte boundary
    Tensor dense = Tensor::empty(offset->value.shape(), dtype, Device::CUDA);
    dense.copy_from(offset->value);
    const Var aligned = make_var(dense, true, "aligned x");
    const Var y_general = rotary_embedding(general_tape, offset, heads, 1500);
    const Var y_packed = rotary_embedding(packed_tape, aligned, heads, 1500);
    general_tape.backward(y_general, to_gpu(dy, dtype));
    packed_tape.backward(y_packed, to_gpu(dy, dtype));
    ASSERT_TRUE(w->grad.defined() && aligned->grad.defined());
    EXPECT_EQ(testing::compare(y_packed->value, y_general->value).max_abs, 0.0) << "y";
    Tensor d_offset = Tensor::empty(aligned->grad.shape(), dtype, Device::CUDA);
    d_offset.copy_from(w->grad.columns(1, width));
    EXPECT_EQ(testing::compare(aligned->grad, d_offset).max_abs, 0.0) << "dx";
  }
}

// In place over a column block of the fused projection's output (RetNet's q and k) the GPU gives the out-of-place
// rotation's bits, values and gradient, through the packed kernel (aligned block) and the general one (offset block).
TEST(RotaryEmbeddingCuda, InPlaceGivesTheOutOfPlaceBits) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(304);
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t offset : {int64_t{0}, int64_t{1}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (offset ? " general kernel" : " packed kernel"));
      const int64_t batch = 2, time = 67, heads = 3, head_dim = 32, width = heads * head_dim;
      const Tensor whole = round_through(testing::random_tensor(rng, {batch, time, offset + width + 40}), dtype);
      const Tensor dy = round_through(testing::random_tensor(rng, {batch, time, width}), dtype);
      const auto run = [&](bool in_place) {
        Tape tape;
        const Var w = make_var(to_gpu(whole, dtype), true, "x");
        const std::vector<Var> blocks =
            offset ? split_columns(tape, w, {offset, width, 40}) : split_columns(tape, w, {width, 40});
        const Var x = blocks[offset ? 1 : 0];
        const Var y = in_place ? rotary_embedding_in_place(tape, x, heads, 900) : rotary_embedding(tape, x, heads, 900);
        Tensor y_value = Tensor::empty(y->value.shape(), dtype, Device::CUDA);
        y_value.copy_from(y->value);
        tape.backward(y, to_gpu(dy, dtype));
        return std::pair<Tensor, Tensor>{y_value, w->grad};
      };
      const auto [y_copied, dx_copied] = run(false);
      const auto [y_in_place, dx_in_place] = run(true);
      EXPECT_EQ(testing::compare(y_in_place, y_copied).max_abs, 0.0) << "y";
      EXPECT_EQ(testing::compare(dx_in_place, dx_copied).max_abs, 0.0) << "dx";
    }
  }
}

TEST(RotaryEmbeddingCuda, StateShiftMatchesCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  Rng rng(302);
  for (const int64_t shift : {-1, -2048, 5}) {
    SCOPED_TRACE(shift);
    const Tensor s = testing::random_tensor(rng, {3, 2, 128, 72}, 1.0, DType::F32);
    const Tensor dy = testing::random_tensor(rng, s.shape(), 1.0, DType::F32);
    Tape ref_tape, tape;
    Var rs = make_var(s, true, "state"), gs = make_var(to_gpu(s, DType::F32), true, "state");
    Var ry = rotary_state_shift(ref_tape, rs, shift), gy = rotary_state_shift(tape, gs, shift);
    ref_tape.backward(ry, dy);
    tape.backward(gy, to_gpu(dy, DType::F32));
    expect_close(gy->value, ry->value, 1e-5, 1e-4, "shifted state");  // as rel_tol(F32)
    expect_close(gs->grad, rs->grad, 1e-5, 1e-4, "its gradient");
  }
}

}  // namespace
}  // namespace hgrn
