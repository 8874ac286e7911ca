// elementwise.h: the small ops that glue the larger ones together: the residual add and a reshape.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// y = a + b (same shape): the residual connection.
Var add(Tape& tape, const Var& a, const Var& b);

// A view of x with another shape (same number of elements); its gradient flows back unchanged.
Var reshape(Tape& tape, const Var& x, const Shape& shape);

}  // namespace hgrn
