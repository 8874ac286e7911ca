// elementwise.h: the small ops that glue the larger ones together: an add, a reshape, column blocks of a tensor
// and a contiguous copy of one, and the hand-over of a gradient that passes through an op unchanged.
#pragma once
#include <vector>

#include "core/autograd.h"

namespace hgrn {

// y = a + b (same shape): the residual connection.
Var add(Tape& tape, const Var& a, const Var& b);

// A view of x with another shape (same number of elements); its gradient flows back unchanged.
Var reshape(Tape& tape, const Var& x, const Shape& shape);

// Column blocks of x's last axis (widths summing to its width) as Vars of their own: views of x's value (no copy),
// row-strided (Tensor::columns). An op that writes a block's whole gradient and honours row strides
// (grad_buffer_for_write with GradLayout::RowStrided) writes it straight into the matching columns of one buffer
// shaped like x's gradient, which then becomes x's gradient with no copy: how a fused projection's output
// ([rows, q | f | i], ops/linear.h: linear_columns) feeds three consumers and gets one gradient for one dx GEMM.
// Blocks whose gradient arrives otherwise are copied into place, and blocks with none are zero there.
std::vector<Var> split_columns(Tape& tape, const Var& x, const std::vector<int64_t>& widths);

// x itself when its value is contiguous, else a contiguous copy whose gradient flows back to x: for ops (the CPU
// references) that read only contiguous tensors.
Var contiguous(Tape& tape, const Var& x);

// In the backward of an op whose output's gradient is also one input's, unchanged (y = residual + f(...)): gives
// `to` the gradient of `from`, whose gradient is then undefined. Where `to` is an op output with no gradient yet, the
// buffer itself changes hands (no copy; marked shared, so it is copied before a write while anything else, a queued
// weight gradient say, still holds it: autograd.h); otherwise it is added into to's gradient.
void hand_over_gradient(const Var& from, const Var& to);

}  // namespace hgrn
