// activations.h: silu (the query activation) and swiglu = silu(gate) ⊙ up (the GatedMLP's activation), fused so
// that the MLP's product is one op with one saved pair of inputs.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// y = x · σ(x).
Var silu(Tape& tape, const Var& x);

// y = silu(gate) ⊙ up; gate and up have the same shape.
Var swiglu(Tape& tape, const Var& gate, const Var& up);

}  // namespace hgrn
