// elementwise.h: element-wise ops that the model needs between the larger ops (the residual add).
#pragma once
#include "core/autograd.h"

namespace hgrn {

// y = a + b (same shape): the residual connection.
Var add(Tape& tape, const Var& a, const Var& b);

}  // namespace hgrn
