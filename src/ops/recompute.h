// recompute.h: activation recomputation (gradient checkpointing) on the tape. The wrapped function runs without
// recording, so none of its intermediate activations are kept; the backward runs it again on a fresh tape and
// back-propagates through that. Gradients reach the inputs and every parameter the function uses directly, because
// backward closures accumulate into the same gradient buffers.
#pragma once
#include <functional>
#include <vector>

#include "core/autograd.h"

namespace hgrn {

using RecomputedFn = std::function<Var(Tape&, const std::vector<Var>&)>;
// f must be a pure function of its inputs and of parameters captured by reference (no state carried out of it).
Var recompute(Tape& tape, const std::vector<Var>& inputs, RecomputedFn f);

}  // namespace hgrn
