// sequence_resets.h: per-token reset flags (src/ops/sequence_resets.h) as the chunked GPU kernels read them: one
// 64-bit mask per (sequence, 64-step chunk), bit i set where step 64·c + i resets. Every chunked kernel (the GLA
// recurrence, the gated scans) uses 64-step chunks, so one mask is one chunk's resets.
#pragma once
#include <cstdint>

namespace hgrn {

constexpr int64_t kResetMaskChunk = 64;
inline int64_t reset_chunk_count(int64_t time) { return (time + kResetMaskChunk - 1) / kResetMaskChunk; }

// masks[b·NT + c] (NT = reset_chunk_count(time)) from the int32 flags [batch, time], on the compute stream.
void reset_chunk_masks_cuda(const int32_t* resets, int64_t batch, int64_t time, uint64_t* masks);

}  // namespace hgrn
