// embedding.h: token embedding lookup, y[..., :] = W[ids[...], :], with a deterministic scatter-add backward.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// weight [Vocab, D], ids int32 or int64 of any shape [...] -> [..., D]. An id outside [0, Vocab) is an Error.
// The ids are copied, so the caller may reuse their buffer before backward runs.
Var embedding(Tape& tape, const Var& weight, const Tensor& ids);

}  // namespace hgrn
