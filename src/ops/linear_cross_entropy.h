// linear_cross_entropy.h: the language-model head and its loss as one op, cross_entropy(x·Wᵀ, targets), that never
// holds the logits of the whole batch. At 16 x 2048 tokens and a 50k vocabulary the logits and their gradient are
// 3.3 GB each in bf16; here only one chunk of rows (about 256 MiB of logits) exists at a time.
//
// GPU: the forward computes each chunk's logits (GEMM), its log-sum-exp, loss and counts and, when a backward will
// run, the gradient as well while the logits exist: dlogits = softmax − onehot in place, then the chunk's rows of
// dx = dlogits·W and its share of dW = Σ dlogitsᵀ·x, both unscaled and in fp32 (the factor dloss / num_targets is
// known only in the backward). The backward scales them into x's and the weight's gradients: no logits are ever
// recomputed, so the head costs 3 GEMMs, as unfused; the price is dx and dW held in fp32 from the forward to the
// backward (rows·D + Vocab·D floats). The per-row arithmetic is the cross_entropy kernels'; the dW sum over rows is
// split into chunk sums (deterministic, but not the same rounding as one GEMM over all rows). CPU: the composition
// linear + cross_entropy, the reference the GPU path is tested against.
#pragma once
#include <cstdint>

#include "ops/cross_entropy.h"

namespace hgrn {

// x [..., D]; weight [Vocab, D] (linear's contract: an fp32 master weight serves bf16 inputs through its bf16
// copy); targets [rows of x] as for cross_entropy. chunk_rows: rows per chunk on the GPU (0: about 256 MiB of
// logits per chunk).
CrossEntropyResult linear_cross_entropy(Tape& tape, const Var& x, const Var& weight, const Tensor& targets,
                                        int64_t ignore_index = -100, int64_t chunk_rows = 0);

// The GPU path's rows per chunk when chunk_rows is 0, for `rows` rows of `row_bytes` bytes of logits each.
int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t row_bytes);

}  // namespace hgrn
