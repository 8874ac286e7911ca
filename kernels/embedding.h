// embedding.h: the CUDA embedding lookup (gather of fp32 weight rows into fp32/bf16 activations) and its
// deterministic backward: positions are sorted by token (embedding_sort_cuda), then the backward sums each token's
// dy rows in position order into the fp32 weight gradient without atomics (frequent tokens in chunks: see below).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// Checks n ids (int32 or int64, on the device) against [0, vocab). Returns -1 when all are valid, else the first
// offending position, with its id in *bad_id. scratch: 8 bytes of device memory. Reads one number back to the host
// (synchronises the stream).
int64_t embedding_check_ids_cuda(const void* ids, DType ids_dtype, int64_t n, int64_t vocab, void* scratch,
                                 int64_t* bad_id);

// y[r, :] = weight[ids[r], :] converted to y_dtype (fp32 or bf16), for n valid ids; weight [vocab, width] fp32.
void embedding_forward_cuda(const float* weight, const void* ids, DType ids_dtype, void* y, DType y_dtype, int64_t n,
                            int64_t width);

// Device scratch that embedding_sort_cuda needs for n ids and this vocab size.
size_t embedding_sort_workspace_bytes(int64_t n, int64_t vocab);

// Groups the positions of n valid ids by token for the backward. Outputs (device, int32):
//   sorted_ids[n], sorted_pos[n]: the (id, position) pairs in increasing id, then increasing position;
//   segment_start[n]: the first index into the sorted arrays of each distinct id (the first *num_segments are set);
//   num_segments[1]: how many distinct ids there are.
void embedding_sort_cuda(const void* ids, DType ids_dtype, int64_t n, int64_t vocab, int32_t* sorted_ids,
                         int32_t* sorted_pos, int32_t* segment_start, int32_t* num_segments, void* workspace,
                         size_t workspace_bytes);

// Device scratch that embedding_backward_cuda needs for n ids of this width.
size_t embedding_backward_workspace_bytes(int64_t n, int64_t width);

// dweight[id, :] += dy[p_1, :] + dy[p_2, :] + ... for each distinct id, p_1 < p_2 < ... its positions, added one
// after the other onto the existing gradient (the CPU's order, so fp32 results match it bit for bit), except for an
// id with more than 128 positions (a frequent token), whose rows are summed per chunk of 128 sorted positions in
// parallel and those sums then added in order: deterministic, but not the CPU's rounding.
// dy [n, width] in dy_dtype (fp32 or bf16); dweight [vocab, width] fp32; the rest from embedding_sort_cuda.
void embedding_backward_cuda(const void* dy, DType dy_dtype, const int32_t* sorted_ids, const int32_t* sorted_pos,
                             const int32_t* segment_start, const int32_t* num_segments, float* dweight, int64_t n,
                             int64_t vocab, int64_t width, void* workspace, size_t workspace_bytes);

}  // namespace hgrn
