// elementwise.h: the small ops that glue the larger ones together: an add, a product, a bias add, a reshape, column
// blocks of a tensor and a contiguous copy of one, and the hand-over of a gradient that passes through an op
// unchanged.
#pragma once
#include <vector>

#include "core/autograd.h"

namespace hgrn {

// y = a + b (same shape): the residual connection.
Var add(Tape& tape, const Var& a, const Var& b);

// y = a ⊙ b (same shape, dtype and device, contiguous): the complex HGRU's output gate.
Var mul(Tape& tape, const Var& a, const Var& b);

// y = x + bias over the last axis, x [..., N] contiguous, bias [N]: the bias of a projection (ops/linear.h is
// bias-free); dbias = Σ_rows dy, dx = dy. On the CPU x and bias share a dtype; on the GPU x is fp32 or bf16 and the
// bias (a parameter) fp32.
Var add_bias(Tape& tape, const Var& x, const Var& bias);

// A view of x with another shape (same number of elements); its gradient flows back unchanged.
Var reshape(Tape& tape, const Var& x, const Shape& shape);

// Column blocks of x's last axis (widths summing to its width) as Vars of their own: views of x's value (no copy),
// row-strided (Tensor::columns). Ops that write a block's whole gradient and honour row strides write it straight
// into the matching columns of one buffer (core/autograd.h: column_block_outputs), which becomes x's gradient with no
// copy. x's value stays held until the backward (linear_columns makes its blocks without an x).
std::vector<Var> split_columns(Tape& tape, const Var& x, const std::vector<int64_t>& widths);

// x itself when its value is contiguous, else a contiguous copy whose gradient flows back to x: for ops (the CPU
// references) that read only contiguous tensors.
Var contiguous(Tape& tape, const Var& x);

// What the ops that take column blocks (the fused projections' outputs, row-strided) read: x itself on the GPU, whose
// kernels read row-strided operands and write their gradients in place; contiguous(tape, x) on the CPU, whose
// references read only contiguous tensors.
Var contiguous_on_cpu(Tape& tape, const Var& x);

// In the backward of an op whose output's gradient is also one input's, unchanged (y = residual + f(...)): gives
// `to` the gradient of `from`, whose gradient is then undefined. Where `to` is an op output with no gradient yet, the
// buffer itself changes hands (no copy; marked shared, so it is copied before a write while anything else, a queued
// weight gradient say, still holds it: autograd.h); otherwise it is added into to's gradient.
void hand_over_gradient(const Var& from, const Var& to);

}  // namespace hgrn
