// host_staging.h: host-to-device copies that neither wait for the GPU nor keep the caller's buffer: the bytes go
// into a ring of pinned host memory first, and the device copy is queued from there on the compute stream
// (cuda_context.h), in order with everything else on it. A training step's uploads (the batch's ids and targets, a
// loss seed, the optimiser's tables) then no longer drain the GPU each time.
#pragma once
#include <cstddef>

namespace hgrn {

// Queues dst (device memory) ← src (any host memory) and returns true; false, with nothing queued, where the bytes
// do not fit the ring or a CUDA graph is being captured (the caller then copies and waits, as before).
bool cuda_staged_upload(void* dst, const void* src, size_t bytes);

// The same for `rows` rows of row_bytes each: src rows src_pitch bytes apart, dst rows dst_pitch apart.
bool cuda_staged_upload_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                             size_t rows);

}  // namespace hgrn
