// recompute.h: activation recomputation on the tape, in two grains.
//  - recompute(): gradient checkpointing of a whole block (training.recompute). The wrapped function runs without
//    recording, so none of its intermediate activations are kept; the backward runs it again on a fresh tape and
//    back-propagates through that. Gradients reach the inputs and every parameter the function uses directly,
//    because backward closures accumulate into the same gradient buffers.
//  - rematerialize(): selective recomputation of single cheap intermediates (an activation function's output, a
//    norm's output, the gates): their values are freed as soon as the forward is done with them and recomputed from
//    inputs that are kept anyway, just before the backward needs them. It costs one elementwise pass in the backward
//    and saves the tensor's memory from the end of its forward to its backward, which is where the step's memory
//    peaks. The model calls it under training.recompute_elementwise (on by default) and
//    training.recompute_mlp_projections.
#pragma once
#include <functional>
#include <vector>

#include "core/autograd.h"

namespace hgrn {

using RecomputedFn = std::function<Var(Tape&, const std::vector<Var>&)>;
// f must be a pure function of its inputs and of parameters captured by reference (no state carried out of it).
Var recompute(Tape& tape, const std::vector<Var>& inputs, RecomputedFn f);

// Values for the Vars of one rematerialize() call, in their order, computed on an untaped (disabled) tape.
using RematerializeFn = std::function<std::vector<Tensor>(Tape& untaped)>;
// Call after the last forward op that reads vars' values has been recorded: frees those values now and records a
// step that sets them to `values(untaped)` before the backward of any op recorded so far runs, i.e. before any op
// that used them (or made them) reads them again. `values` must recompute the same tensors (same shapes and dtypes,
// checked; the same kernels on the same inputs, so the same bits). Does nothing when the tape is disabled, nor
// inside recompute()'s replay of a block (whose backward follows at once: nothing would be saved).
void rematerialize(Tape& tape, const std::vector<Var>& vars, RematerializeFn values);

}  // namespace hgrn
