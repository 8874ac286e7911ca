// elementwise.h: the small ops that glue the larger ones together: an add, a reshape, and the hand-over of
// a gradient that passes through an op unchanged.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// y = a + b (same shape): the residual connection.
Var add(Tape& tape, const Var& a, const Var& b);

// A view of x with another shape (same number of elements); its gradient flows back unchanged.
Var reshape(Tape& tape, const Var& x, const Shape& shape);

// In the backward of an op whose output's gradient is also one input's, unchanged (y = residual + f(...)): gives
// `to` the gradient of `from`, whose gradient is then undefined. Where `to` is an op output with no gradient yet, the
// buffer itself changes hands (no copy; marked shared, so it is copied before a write while anything else, a queued
// weight gradient say, still holds it: autograd.h); otherwise it is added into to's gradient.
void hand_over_gradient(const Var& from, const Var& to);

}  // namespace hgrn
