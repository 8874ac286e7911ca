// cross_entropy.h: the CUDA cross-entropy loss (mean over non-ignored rows of logsumexp(row) - row[target]) and its
// backward. One block per row reads the fp32/bf16 logits once (an online max and sum of exponentials in fp32);
// per-row losses go to an fp32 buffer that one block then sums in a fixed order, so the loss is bitwise
// reproducible. The loss stays on the device; the counts come back to the host in one small copy per call (of any
// number of chunks' counts).
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "ops/fp8.h"

namespace hgrn {

struct CrossEntropyCounts {
  int64_t num_targets = 0;  // rows whose target is not ignore_index
  int64_t num_correct = 0;  // of those, rows whose first maximal logit is the target
  int64_t bad_row = -1;     // the first row whose target is neither ignore_index nor in [0, vocab), or -1
  int64_t bad_target = 0;   // that row's target
};

// logits [rows, vocab] (fp32 or bf16), targets [rows] (int32 or int64), all on the device. Writes loss (fp32, one
// element: the mean, 0 when no row counts), log_sum_exp [rows] (fp32) and row_target [rows] (int32: the target, -1
// for an ignored or bad row), which the backward reads, and counts: kCrossEntropyCountSlots device int64 (number of
// targets, number correct, first bad row or -1). scratch: device memory of cross_entropy_scratch_bytes(rows).
// Only enqueues the work (no synchronisation): a caller with several chunks reads all their counts back at once.
// When the counts show a bad row the loss is garbage (the backward treats that row as ignored).
constexpr int kCrossEntropyCountSlots = 3;
void cross_entropy_forward_cuda(const void* logits, DType logits_dtype, const void* targets, DType targets_dtype,
                                int64_t rows, int64_t vocab, int64_t ignore_index, float* loss, float* log_sum_exp,
                                int32_t* row_target, int64_t* counts, void* scratch);
size_t cross_entropy_scratch_bytes(int64_t rows);

// The forward as above and, in the same pass over each row (the row read once, kept in shared memory), the unscaled
// gradient softmax − onehot written over the logits: the bits of cross_entropy_forward_cuda followed by
// cross_entropy_backward_cuda(logits, ..., dloss = 1, num_targets = 1, dlogits = logits, accumulate = false). Returns
// false, having done nothing, where a row does not suit the kernel (rows not 16-byte aligned, or two rows too large
// for an SM's shared memory); the caller then runs those two. gradient_codes: the gradient as FP8 codes ([rows, vocab],
// 16-byte aligned; ops/fp8.h: Fp8CodesOut, its amax folded where set) instead, the logits left unchanged.
bool cross_entropy_forward_gradient_cuda(void* logits, DType logits_dtype, const void* targets, DType targets_dtype,
                                         int64_t rows, int64_t vocab, int64_t ignore_index, float* loss,
                                         float* log_sum_exp, int32_t* row_target, int64_t* counts, void* scratch,
                                         const Fp8CodesOut* gradient_codes = nullptr);

// Reads `chunks` consecutive count slots back to the host (synchronises the stream), and where `losses` is set the
// chunks' `chunks` losses into host_losses in the same wait. targets: the device targets the counts were taken of,
// chunk i's starting at row i·chunk_rows (to fetch a bad row's target for the message).
std::vector<CrossEntropyCounts> cross_entropy_counts_to_host(const int64_t* counts, int64_t chunks, const void* targets,
                                                            DType targets_dtype, int64_t chunk_rows,
                                                            const float* losses = nullptr,
                                                            float* host_losses = nullptr);

// dlogits[r, :] += (softmax(logits[r, :]) - onehot(row_target[r])) * dloss[0] / num_targets for every row with
// row_target[r] >= 0. dlogits in the logits' dtype; dloss: the loss's fp32 gradient, read on the device.
// accumulate = false overwrites instead (ignored rows become zeros), and then dlogits may be the logits themselves.
void cross_entropy_backward_cuda(const void* logits, DType logits_dtype, const float* log_sum_exp,
                                 const int32_t* row_target, const float* dloss, int64_t num_targets, void* dlogits,
                                 int64_t rows, int64_t vocab, bool accumulate = true);

}  // namespace hgrn
