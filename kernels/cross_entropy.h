// cross_entropy.h: the CUDA cross-entropy loss (mean over non-ignored rows of logsumexp(row) - row[target]) and its
// backward. One block per row reads the fp32/bf16 logits once (an online max and sum of exponentials in fp32);
// per-row losses go to an fp32 buffer that one block then sums in a fixed order, so the loss is bitwise
// reproducible. The loss stays on the device; the counts come back to the host in one small copy.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

struct CrossEntropyCounts {
  int64_t num_targets = 0;  // rows whose target is not ignore_index
  int64_t num_correct = 0;  // of those, rows whose first maximal logit is the target
  int64_t bad_row = -1;     // the first row whose target is neither ignore_index nor in [0, vocab), or -1
  int64_t bad_target = 0;   // that row's target
};

// logits [rows, vocab] (fp32 or bf16), targets [rows] (int32 or int64), all on the device. Writes loss (fp32, one
// element: the mean, 0 when no row counts), log_sum_exp [rows] (fp32) and row_target [rows] (int32: the target, -1
// for an ignored row), which the backward reads. scratch: device memory of cross_entropy_scratch_bytes(rows).
// Reads the counts back to the host (synchronises the stream). When bad_row >= 0 the other outputs are garbage.
CrossEntropyCounts cross_entropy_forward_cuda(const void* logits, DType logits_dtype, const void* targets,
                                              DType targets_dtype, int64_t rows, int64_t vocab, int64_t ignore_index,
                                              float* loss, float* log_sum_exp, int32_t* row_target, void* scratch);
size_t cross_entropy_scratch_bytes(int64_t rows);

// dlogits[r, :] += (softmax(logits[r, :]) - onehot(row_target[r])) * dloss[0] / num_targets for every row with
// row_target[r] >= 0. dlogits in the logits' dtype; dloss: the loss's fp32 gradient, read on the device.
// accumulate = false overwrites instead (ignored rows become zeros), and then dlogits may be the logits themselves.
void cross_entropy_backward_cuda(const void* logits, DType logits_dtype, const float* log_sum_exp,
                                 const int32_t* row_target, const float* dloss, int64_t num_targets, void* dlogits,
                                 int64_t rows, int64_t vocab, bool accumulate = true);

}  // namespace hgrn
