// rmsnorm.h: RMSNorm over the last axis, y = x / sqrt(mean(x²) + eps) ⊙ w (spec section 4).
#pragma once
#include "core/autograd.h"

namespace hgrn {

// x [..., D]; weight [D], or nullptr for the weightless variant (y = x · rstd). The statistics are computed in the
// input's precision (fp32 for fp32, fp64 for fp64); the per-row rstd is saved for backward.
Var rmsnorm(Tape& tape, const Var& x, const Var& weight, double eps);

}  // namespace hgrn
