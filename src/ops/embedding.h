// embedding.h: token embedding lookup, y[..., :] = W[ids[...], :], with a deterministic scatter-add backward.
#pragma once
#include "core/autograd.h"

namespace hgrn {

// weight [Vocab, D], ids int32 or int64 of any shape [...] on the weight's device -> [..., D] in out_dtype.
// An id outside [0, Vocab) is an Error naming it and its position. On the CPU out_dtype must be the weight's dtype;
// on the GPU the weight is fp32 (a parameter) and out_dtype is an activation dtype (fp32 or bf16), and the check
// reads one number back from the device, unless the ids are given on the host: then they are checked there and
// uploaded without waiting for the GPU (a training batch's ids). The ids are copied (the GPU keeps them sorted by
// token for the backward), so the caller may reuse their buffer before backward runs.
Var embedding(Tape& tape, const Var& weight, const Tensor& ids, DType out_dtype);
// Output in the weight's dtype.
Var embedding(Tape& tape, const Var& weight, const Tensor& ids);

// The lookup alone into y [..., D] (contiguous, ids' shape then D), without a tape, for buffers made once (decoding,
// models/fused_decoder.h); y's dtype as for embedding's out_dtype. The GPU does not check the ids (that reads a number
// back to the host, which work captured in a CUDA graph cannot do): the caller must pass ids in [0, Vocab), checked
// where they come from. The CPU checks them.
void embedding_lookup_into(const Tensor& weight, const Tensor& ids, Tensor& y);

}  // namespace hgrn
