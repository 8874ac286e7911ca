// adamw.cu: the optimiser's multi-tensor kernels (adamw.h): AdamW, the gradients' sum of squares and their scaling.
// AdamW also writes a parameter's bf16 compute copy where the caller passes one (the cast the next forward would
// otherwise make: a launch and a pass over every weight saved). One launch covers every parameter: the grid is cut
// into chunks of kChunk elements, each parameter owning ceil(n / kChunk) consecutive chunks, and a block finds its
// parameter by binary search in the slot table.
// The AdamW arithmetic is the CPU's (src/train/optimizer.cpp) operation for operation in double, spelled with
// the _rn intrinsics so that nvcc cannot contract a multiply-add into an FMA the CPU build (x86-64-v2) never
// uses: the results are the CPU's to the bit. The norm is summed per chunk, then the chunk sums in chunk order;
// the chunking depends only on the parameters' sizes, so the bits never change from run to run.
#include "adamw.h"

#include <cuda_bf16.h>
#include <math_constants.h>

#include <vector>

#include "core/allocator.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace hgrn {

namespace {

constexpr int kThreads = 256;
constexpr long long kChunk = 4096;  // elements per block: 16 per thread
constexpr size_t kTableAlign = 256;

struct AdamWArgs {
  double beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay_factor, step_size, inv_sqrt_bias_correction2,
      grad_scale;
  const double* clip_sum_of_squares;  // non-null: grad_scale is the clip factor of this Σ grad² and max_norm
  double max_norm;
};

// grad_norm_and_clip_factor's factor (src/train/optimizer.cpp), formed on the device from the summed squares: the
// same IEEE double operations, so the same bits as the host's.
__device__ __forceinline__ double clip_factor(double sum_of_squares, double max_norm) {
  const double norm = __dsqrt_rn(sum_of_squares);
  return max_norm > 0.0 && isfinite(norm) && norm > max_norm ? __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6)) : 1.0;
}

size_t table_bytes(int64_t count) {
  return (static_cast<size_t>(count) * sizeof(MultiTensorSlot) + kTableAlign - 1) / kTableAlign * kTableAlign;
}

// The slot owning `chunk`: the last one whose first_chunk is <= chunk (empty slots own no chunk and are skipped
// because the next slot starts at the same chunk).
__device__ __forceinline__ const MultiTensorSlot& slot_of_chunk(const MultiTensorSlot* slots, int count,
                                                               long long chunk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (slots[mid].first_chunk <= chunk) lo = mid;
    else hi = mid - 1;
  }
  return slots[lo];
}

// A gradient element as clipping leaves it, float(g · factor) in IEEE double (the CPU's `scaled`): scale_kernel
// writes it, adamw_kernel uses it in place of the element (exactly the element for factor 1).
__device__ __forceinline__ float scaled_grad(float g, double factor) {
  return __double2float_rn(__dmul_rn(static_cast<double>(g), factor));
}

// Each thread takes kAdamWBatch elements at a time, every load issued before any arithmetic: the fp64 divisions and
// square root are long dependency chains, and the compiler cannot hoist the next element's loads above this one's
// stores by itself (the four arrays may alias, for all it knows).
constexpr int kAdamWBatch = 4;

__global__ void adamw_kernel(const MultiTensorSlot* slots, int count, AdamWArgs a) {
  const MultiTensorSlot s = slot_of_chunk(slots, count, blockIdx.x);
  const long long begin = (blockIdx.x - s.first_chunk) * kChunk;
  const long long end = min(static_cast<long long>(s.n), begin + kChunk);
  // A non-finite gradient norm skips the step: nothing is written (AdamW::clip_and_step).
  if (a.clip_sum_of_squares && !isfinite(*a.clip_sum_of_squares)) return;
  const double decay_factor = s.decay ? a.decay_factor : 1.0;
  const double grad_scale = a.clip_sum_of_squares ? clip_factor(*a.clip_sum_of_squares, a.max_norm) : a.grad_scale;
  for (long long i0 = begin + threadIdx.x; i0 < end; i0 += (long long)blockDim.x * kAdamWBatch) {
    float grad[kAdamWBatch], first[kAdamWBatch], second[kAdamWBatch], param[kAdamWBatch];
#pragma unroll
    for (int u = 0; u < kAdamWBatch; ++u) {
      const long long i = i0 + (long long)u * blockDim.x;
      if (i < end) grad[u] = s.grad[i], first[u] = s.first[i], second[u] = s.second[i], param[u] = s.param[i];
    }
#pragma unroll
    for (int u = 0; u < kAdamWBatch; ++u) {
      const long long i = i0 + (long long)u * blockDim.x;
      if (i >= end) continue;
      const double g = scaled_grad(grad[u], grad_scale);
      const double m = __dadd_rn(__dmul_rn(a.beta1, static_cast<double>(first[u])), __dmul_rn(a.one_minus_beta1, g));
      const double v = __dadd_rn(__dmul_rn(a.beta2, static_cast<double>(second[u])),
                                 __dmul_rn(__dmul_rn(a.one_minus_beta2, g), g));
      s.first[i] = __double2float_rn(m);
      s.second[i] = __double2float_rn(v);
      const double denom = __dadd_rn(__dmul_rn(__dsqrt_rn(v), a.inv_sqrt_bias_correction2), a.eps);
      const double p = __dmul_rn(static_cast<double>(param[u]), decay_factor);
      const double step = __ddiv_rn(__dmul_rn(a.step_size, m), denom);
      const float updated = __double2float_rn(__dsub_rn(p, step));
      s.param[i] = updated;
      // cast_kernel's rounding: the copy holds the bits a cast of the new weight would.
      if (s.bf16_copy) static_cast<__nv_bfloat16*>(s.bf16_copy)[i] = __float2bfloat16_rn(updated);
    }
  }
}

// Sums kThreads doubles in shared memory by a fixed tree; the result is in values[0].
__device__ __forceinline__ void block_sum(double* values) {
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (threadIdx.x < stride) values[threadIdx.x] += values[threadIdx.x + stride];
  }
  __syncthreads();
}

__global__ void sum_of_squares_kernel(const MultiTensorSlot* slots, int count, double* partials) {
  __shared__ double sums[kThreads];
  const MultiTensorSlot s = slot_of_chunk(slots, count, blockIdx.x);
  const long long begin = (blockIdx.x - s.first_chunk) * kChunk;
  const long long end = min(static_cast<long long>(s.n), begin + kChunk);
  double acc = 0.0;
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double x = s.grad[i];
    acc += x * x;
  }
  sums[threadIdx.x] = acc;
  block_sum(sums);
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

// One block: thread t adds chunks t, t + kThreads, … in order, then the fixed tree.
__global__ void sum_partials_kernel(const double* partials, long long chunks, double* total) {
  __shared__ double sums[kThreads];
  double acc = 0.0;
  for (long long c = threadIdx.x; c < chunks; c += kThreads) acc += partials[c];
  sums[threadIdx.x] = acc;
  block_sum(sums);
  if (threadIdx.x == 0) *total = sums[0];
}

__global__ void scale_kernel(const MultiTensorSlot* slots, int count, double factor) {
  const MultiTensorSlot s = slot_of_chunk(slots, count, blockIdx.x);
  const long long begin = (blockIdx.x - s.first_chunk) * kChunk;
  const long long end = min(static_cast<long long>(s.n), begin + kChunk);
  for (long long i = begin + threadIdx.x; i < end; i += blockDim.x)
    s.grad[i] = scaled_grad(s.grad[i], factor);
}

double* partials_of(void* workspace, int64_t count) {
  return reinterpret_cast<double*>(static_cast<char*>(workspace) + table_bytes(count));
}

}  // namespace

size_t cuda_multi_tensor_workspace_bytes(int64_t count, int64_t elements) {
  // Each slot rounds up to at most one extra chunk; one more double holds the total.
  const size_t max_chunks = static_cast<size_t>(elements / kChunk + count);
  return table_bytes(count) + (max_chunks + 1) * sizeof(double);
}

long long cuda_upload_slot_table(const MultiTensorSlot* slots, int64_t count, void* workspace) {
  HGRN_CHECK(count > 0 && count <= 0x7fffffff, "multi-tensor launch: bad slot count ", count);
  std::vector<MultiTensorSlot> table(slots, slots + count);
  long long chunks = 0;
  for (int64_t i = 0; i < count; ++i) {
    table[i].first_chunk = chunks;
    chunks += (slots[i].n + kChunk - 1) / kChunk;
  }
  // An upload like any other (staged, no wait): the table may be freed on return.
  device_copy(workspace, Device::CUDA, table.data(), Device::CPU, table.size() * sizeof(MultiTensorSlot));
  HGRN_CHECK(chunks <= 0x7fffffffLL, "multi-tensor launch: ", chunks, " chunks exceed the launch grid");
  return chunks;
}

double* cuda_multi_tensor_total(void* workspace, int64_t count, long long chunks) {
  return partials_of(workspace, count) + chunks;
}

void cuda_adamw_update(const void* workspace, int64_t count, long long chunks, double beta1, double beta2, double eps,
                       double decay_factor, const AdamWStep& step, double grad_scale,
                       const double* clip_sum_of_squares, double max_norm) {
  if (count == 0 || chunks == 0) return;
  const AdamWArgs args{beta1,
                       1.0 - beta1,
                       beta2,
                       1.0 - beta2,
                       eps,
                       decay_factor,
                       step.step_size,
                       step.inv_sqrt_bias_correction2,
                       grad_scale,
                       clip_sum_of_squares,
                       max_norm};
  adamw_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, cuda_stream()>>>(
      static_cast<const MultiTensorSlot*>(workspace), static_cast<int>(count), args);
  CUDA_CHECK_LAUNCH("adamw");
}

void cuda_grad_sum_of_squares(void* workspace, int64_t count, long long chunks, double* total) {
  if (count == 0 || chunks == 0) {
    CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(double), cuda_stream()));
    return;
  }
  double* partials = partials_of(workspace, count);
  sum_of_squares_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, cuda_stream()>>>(
      static_cast<const MultiTensorSlot*>(workspace), static_cast<int>(count), partials);
  CUDA_CHECK_LAUNCH("grad_sum_of_squares");
  sum_partials_kernel<<<1, kThreads, 0, cuda_stream()>>>(partials, chunks, total);
  CUDA_CHECK_LAUNCH("grad_sum_of_squares_total");
}

__global__ void poison_if_nonfinite_kernel(double* total, const float* value) {
  if (!isfinite(*value)) *total = CUDART_NAN;
}

void cuda_poison_if_nonfinite(double* total, const float* value) {
  poison_if_nonfinite_kernel<<<1, 1, 0, cuda_stream()>>>(total, value);
  CUDA_CHECK_LAUNCH("poison_if_nonfinite");
}

void cuda_scale_grads(const void* workspace, int64_t count, long long chunks, double factor) {
  if (count == 0 || chunks == 0) return;
  scale_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, cuda_stream()>>>(
      static_cast<const MultiTensorSlot*>(workspace), static_cast<int>(count), factor);
  CUDA_CHECK_LAUNCH("scale_grads");
}

}  // namespace hgrn
