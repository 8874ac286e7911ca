// linear.h: y = x·Wᵀ (no bias), x [..., in], W [out, in] -> y [..., out]. All hgrn projections are bias-free.
#pragma once
#include "core/autograd.h"

namespace hgrn {

Var linear(Tape& tape, const Var& x, const Var& weight);

}  // namespace hgrn
