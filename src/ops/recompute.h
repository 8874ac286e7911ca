// recompute.h: activation recomputation on the tape, in two grains.
//  - recompute(): gradient checkpointing of a whole block (model.memory.recompute). The wrapped function runs without
//    recording, so none of its intermediate activations are kept; the backward runs it again on a fresh tape and
//    back-propagates through that. Gradients reach the inputs and every parameter the function uses directly,
//    because backward closures accumulate into the same gradient buffers.
//  - rematerialize(): selective recomputation of single cheap intermediates (an activation function's output, a
//    norm's output, the gates): their values are freed as soon as the forward is done with them and recomputed from
//    inputs that are kept anyway, just before the backward needs them. It costs one elementwise pass in the backward
//    and saves the tensor's memory from the end of its forward to its backward, which is where the step's memory
//    peaks. The model calls it under model.memory.recompute_elementwise (on by default) and
//    model.memory.recompute_mlp_projections.
//  - release_until_producer_backward(): the same saving with no separate recomputation, where the op that made the
//    value can write it again in its own backward (below).
#pragma once
#include <functional>
#include <vector>

#include "core/autograd.h"
#include "ops/fp8.h"

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

// The cheaper grain where the producer's backward reads what it needs to make the value anyway (an RMSNorm's input):
// v's value is freed now, and the op that made v writes it again in its own backward, which runs after every
// consumer's backward. Consumers queue the parts of their backward that read the value (when_value_ready: a linear's
// weight gradient) and the producer runs them (restore_value). Every op reading v's value in its backward must go
// through when_value_ready, and the producer must call restore_value; a direct read finds no value and fails. Call
// after the last forward op that reads v. Like rematerialize: nothing happens when the tape is disabled or inside
// recompute()'s replay.
void release_until_producer_backward(Tape& tape, const Var& v);
// In a consumer's backward: runs work now when v's value is there, else queues it for v's producer's backward.
void when_value_ready(const Var& v, std::function<void()> work);
// In the producer's backward of a Var released by release_until_producer_backward: puts `value` back (its shape and
// dtype checked against the forward's), runs the queued work in the order it was queued, and frees the value again.
void restore_value(const Var& v, Tensor value);

// when_value_ready for a consumer that can read v's value as FP8 codes instead (an FP8 projection's weight gradient,
// ops/fp8_linear.h): `codes` says where and at which scale. Where this is the only work waiting once v's producer
// runs its backward, the producer may write those codes and no value (codes_to_restore, restore_codes): work then
// finds v's value undefined and reads the codes; otherwise it finds the value, as when_value_ready's work does.
void when_value_or_codes_ready(const Var& v, const Fp8CodesOut& codes, std::function<void()> work);
// In the producer's backward: the codes the only waiting consumer reads in place of the value, else null (write the
// value: restore_value).
const Fp8CodesOut* codes_to_restore(const Var& v);
// In the producer's backward, once it wrote codes_to_restore's codes: runs the waiting consumer's work.
void restore_codes(const Var& v);

}  // namespace hgrn
