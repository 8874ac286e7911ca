// hgru2_test_support.h: what the HGRU2 recurrence's GPU tests (test_gla_recurrence_cuda.cpp,
// test_gated_recurrence_cuda.cpp) share: the problem size, printable for their failure messages, and their
// tolerances against the fp64 CPU reference (the gated test's gates only scale the recurrence's gradients element by
// element, so it holds them to the same bounds); and, with the CPU test, q, k and v laid out as column blocks.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "ops/elementwise.h"

namespace hgrn::testing {

struct Hgru2Shape {
  int64_t batch, time, heads, key_dim, value_dim;
  std::string str() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(time) + " H=" + std::to_string(heads) +
           " K=" + std::to_string(key_dim) + " V=" + std::to_string(value_dim);
  }
};

// Tolerances of one comparison: relative RMS error, and max abs error relative to the reference's largest entry.
struct Tol {
  double rel_rms, max_rel;
};
// fp32: the kernel computes in fp32 throughout (no TF32), so it differs from fp64 only by fp32 rounding of O(64)-term
// sums, of the gate cumsum and of the hardware exp2 (~2^-22 relative); measured <= 2.3e-6 rel RMS, 5e-6 max.
constexpr Tol kFp32{1e-5, 2e-5};
// bf16: every result is stored in bf16 (2^-9 relative rounding) and the tensor-core products take bf16 operands
// (q ⊙ e^G, k ⊙ e^{G_L − G}, A, the states) as fla's kernel does; the intra-chunk blocks below the diagonal (scores,
// and dq, dk from dA) take TF32 operands (2^-11), as fla's tl.dot on fp32 does. fla's test bound is 5e-3 relative
// RMS. Measured <= 2.8e-3 rel RMS, 4.3e-3 max with fp32 SIMT intra products; outputs <= 2.5e-3 rel RMS, 4.5e-3 max
// with the TF32 ones (the gradients pass the same bound; a TF32 trial of the gradients measured <= 2.7e-3 rel RMS).
constexpr Tol kBf16{5e-3, 1e-2};

// q, k and v as column blocks of wider tensors, which the recurrence reads in place as it reads a fused projection's
// output (GLA's: linear_columns): lead[i] spare columns before block i (q, k, v), trail[i] after it; fused: all three
// in one parent, side by side in that order, else one parent each.
struct QkvColumns {
  const char* name;
  bool fused;
  int64_t lead[3], trail[3];
};

// Where a QkvColumns layout puts q, k (key_width columns each) and v (value_width): each block's parent and first
// column, and the parents' widths.
class QkvBlocks {
 public:
  QkvBlocks(const QkvColumns& layout, int64_t key_width, int64_t value_width)
      : width_{key_width, key_width, value_width} {
    int64_t column = 0;
    for (int i = 0; i < 3; ++i) {
      if (!layout.fused) column = 0;
      parent_[i] = layout.fused ? 0 : i;
      column_[i] = column + layout.lead[i];
      column = column_[i] + width_[i] + layout.trail[i];
      if (!layout.fused || i == 2) parent_widths_.push_back(column);
    }
  }

  // Host parents ([B, T, width], the dtype of q, k, v) holding q, k and v in their columns, `spare` elsewhere.
  std::vector<Tensor> parents_of(const Tensor& q, const Tensor& k, const Tensor& v, double spare = 1.0) const {
    const Tensor* blocks[3] = {&q, &k, &v};
    std::vector<Tensor> parents;
    for (int64_t width : parent_widths_)
      parents.push_back(Tensor::full({q.size(0), q.size(1), width}, spare, q.dtype()));
    for (int i = 0; i < 3; ++i) block(parents, i).copy_from(*blocks[i]);
    return parents;
  }

  // q, k and v on `tape`: column blocks of the parents (split_columns), whose gradients land in the parents'.
  std::vector<Var> split(Tape& tape, const std::vector<Var>& parents) const {
    std::vector<Var> qkv(3);
    for (size_t p = 0; p < parent_widths_.size(); ++p) {
      std::vector<int64_t> widths;
      std::vector<int> index;  // of q, k, v in `widths` (-1: spare columns)
      int64_t column = 0;
      for (int i = 0; i < 3; ++i) {
        if (parent_[i] != static_cast<int>(p)) continue;
        if (column_[i] > column) widths.push_back(column_[i] - column), index.push_back(-1);
        widths.push_back(width_[i]), index.push_back(i);
        column = column_[i] + width_[i];
      }
      if (parent_widths_[p] > column) widths.push_back(parent_widths_[p] - column), index.push_back(-1);
      const std::vector<Var> blocks = split_columns(tape, parents[p], widths);
      for (size_t j = 0; j < blocks.size(); ++j)
        if (index[j] >= 0) qkv[static_cast<size_t>(index[j])] = blocks[j];
    }
    return qkv;
  }

  // Block i (0: q, 1: k, 2: v) of parent-shaped tensors: a view.
  Tensor block(const std::vector<Tensor>& parents, int i) const {
    return parents[static_cast<size_t>(parent_[i])].columns(column_[i], width_[i]);
  }

  // The parents' gradients (host) are 0 outside the blocks.
  void expect_zero_outside_blocks(const std::vector<Tensor>& grads) const {
    for (size_t p = 0; p < grads.size(); ++p) {
      const int64_t width = parent_widths_[p], rows = grads[p].numel() / width;
      for (int64_t c = 0; c < width; ++c) {
        bool in_block = false;
        for (int i = 0; i < 3; ++i)
          in_block = in_block || (parent_[i] == static_cast<int>(p) && c >= column_[i] && c < column_[i] + width_[i]);
        for (int64_t r = 0; r < rows && !in_block; ++r)
          if (grads[p].item(r * width + c) != 0.0) {
            ADD_FAILURE() << "parent " << p << " has a gradient in spare column " << c << " (row " << r << ")";
            return;
          }
      }
    }
  }

 private:
  int64_t width_[3];
  int parent_[3] = {};
  int64_t column_[3] = {};
  std::vector<int64_t> parent_widths_;
};

}  // namespace hgrn::testing
