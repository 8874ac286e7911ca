// cross_entropy.h: the language-model loss, mean over non-ignored rows of logsumexp(logits_row) − logits_row[target]
// (spec section 4: no label smoothing, no z-loss), plus the counts the trainer reports (targets, correct argmax).
#pragma once
#include <cstdint>

#include "core/autograd.h"

namespace hgrn {

struct CrossEntropyResult {
  Var loss;             // shape [] (one element); 0 with a zero gradient when every row is ignored
  int64_t num_targets;  // rows whose target is not ignore_index
  int64_t num_correct;  // of those, rows whose argmax (first maximal logit) equals the target
};

// logits [N, Vocab]; targets int32 or int64 [N] on the logits' device. A target outside [0, Vocab) other than
// ignore_index is an Error. The targets are read during the call only; the caller may reuse their buffer before
// backward runs. On the CPU the loss has the logits' dtype; on the GPU (fp32 or bf16 logits) it is an fp32 device
// tensor, its gradient is read on the device, and the counts come back in one small copy (a stream sync).
CrossEntropyResult cross_entropy(Tape& tape, const Var& logits, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace hgrn
