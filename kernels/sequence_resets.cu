// sequence_resets.cu: the per-chunk reset masks (kernels/sequence_resets.h): one warp per (sequence, chunk) reads
// its 64 flags as two ballots.
#include "cuda_check.h"
#include "cuda_context.h"
#include "sequence_resets.h"

namespace hgrn {

namespace {

constexpr int kWarpsPerBlock = 8;

__global__ void reset_chunk_masks_kernel(const int32_t* resets, int batch, int time, int chunks, uint64_t* masks) {
  const int lane = threadIdx.x & 31;
  const long long item = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (item >= static_cast<long long>(batch) * chunks) return;  // whole warps leave together
  const int b = static_cast<int>(item / chunks), c = static_cast<int>(item % chunks);
  const int t0 = c * static_cast<int>(kResetMaskChunk);
  const int32_t* row = resets + static_cast<long long>(b) * time;
  const bool low = t0 + lane < time && row[t0 + lane] != 0;
  const bool high = t0 + 32 + lane < time && row[t0 + 32 + lane] != 0;
  const unsigned low_bits = __ballot_sync(0xffffffffu, low), high_bits = __ballot_sync(0xffffffffu, high);
  if (lane == 0) masks[item] = static_cast<uint64_t>(low_bits) | (static_cast<uint64_t>(high_bits) << 32);
}

}  // namespace

void reset_chunk_masks_cuda(const int32_t* resets, int64_t batch, int64_t time, uint64_t* masks) {
  const int64_t chunks = reset_chunk_count(time), items = batch * chunks;
  HGRN_CHECK(batch > 0 && time > 0 && time < (int64_t{1} << 31) && items < (int64_t{1} << 31),
             "reset_chunk_masks: shape [", batch, ", ", time, "] out of range");
  const unsigned blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  reset_chunk_masks_kernel<<<blocks, 32 * kWarpsPerBlock, 0, cuda_stream()>>>(
      resets, static_cast<int>(batch), static_cast<int>(time), static_cast<int>(chunks), masks);
  CUDA_CHECK_LAUNCH("reset_chunk_masks");
}

}  // namespace hgrn
