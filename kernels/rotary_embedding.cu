// rotary_embedding.cu: the rotary position embedding on the GPU (layout and maths in rotary_embedding.h). A block
// takes one position at a time: its cosines and sines, by sincosf of the position times the host's fp32 frequency (the
// CPU reference's very bits; the accurate sincosf, not the fast intrinsic: angles reach thousands of radians), are
// formed once into shared memory, then the block's threads rotate that position's pairs. Queries and keys (inner 1,
// 16-byte aligned rows) take the packed kernel: one position's rows across the batch share the tables, and a thread
// rotates 16 bytes of each half of a head; any other layout the general one, a row at a time.
#include "rotary_embedding.h"

#include <algorithm>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "elementwise.cuh"

namespace hgrn {
namespace {

// One pair's rotation, the one both kernels run (so that they give the same bits).
__device__ __forceinline__ void rotate(float x0, float x1, float c, float s, float& y0, float& y1) {
  y0 = x0 * c - x1 * s;
  y1 = x0 * s + x1 * c;
}

// One position's cosines and sines (negated for the inverse rotation) into the block's tables.
__device__ __forceinline__ void fill_tables(float position, const RotaryFrequencies& f, int half, bool inverse,
                                            float* cosines, float* sines) {
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(position * f.inv_freq[i], &s, &c);
    cosines[i] = c;
    sines[i] = inverse ? -s : s;
  }
}

template <typename T>
__global__ void rotary_kernel(const T* in, T* out, bool add, RotaryRows d, RotaryFrequencies f, int pairs_per_row,
                              long long in_stride, long long out_stride) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  __shared__ float cosines[kMaxRotaryPairs], sines[kMaxRotaryPairs];
  const int half = static_cast<int>(d.head_dim / 2), inner = static_cast<int>(d.inner);
  for (long long r = blockIdx.x; r < d.rows; r += gridDim.x) {
    const float position = static_cast<float>(d.first_position + r % d.time);
    __syncthreads();  // the previous row's readers are done with the tables
    fill_tables(position, f, half, d.inverse, cosines, sines);
    __syncthreads();
    const T* x = in + r * in_stride;
    T* y = out + r * out_stride;
    for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < pairs_per_row; p += gridDim.y * blockDim.x) {
      // p = (h · half + i) · inner + w
      const int w = p % inner, hi = p / inner, i = hi % half, h = hi / half;
      const int e0 = (h * static_cast<int>(d.head_dim) + i) * inner + w, e1 = e0 + half * inner;
      const float x0 = load_f(x[e0]), x1 = load_f(x[e1]), c = cosines[i], s = sines[i];
      float y0, y1;
      rotate(x0, x1, c, s, y0, y1);
      if (add) {
        y0 += load_f(y[e0]);
        y1 += load_f(y[e1]);
      }
      y[e0] = store_f<T>(y0);
      y[e1] = store_f<T>(y1);
    }
  }
}

// The packed kernel: block (x, y) takes position blockIdx.x of every sequence (rows b · time + x), its threads V
// adjacent pairs (16 bytes of each half of a head) at a time. The same products as rotary_kernel: the same bits.
template <typename T, int V>
__global__ void rotary_packed_kernel(const T* in, T* out, bool add, RotaryRows d, RotaryFrequencies f,
                                     long long in_stride, long long out_stride) {
  begin_dependent_kernel();  // launched as a dependent (dependent_launch.cuh)
  __shared__ float cosines[kMaxRotaryPairs], sines[kMaxRotaryPairs];
  const int half = static_cast<int>(d.head_dim / 2);
  const long long t = blockIdx.x;
  fill_tables(static_cast<float>(d.first_position + t), f, half, d.inverse, cosines, sines);
  __syncthreads();
  const int packs_per_head = half / V, packs_per_row = static_cast<int>(d.heads) * packs_per_head;
  const long long sequences = d.rows / d.time, work = sequences * packs_per_row;
  for (long long j = blockIdx.y * static_cast<long long>(blockDim.x) + threadIdx.x; j < work;
       j += static_cast<long long>(gridDim.y) * blockDim.x) {
    const long long r = (j / packs_per_row) * d.time + t;
    const int pack = static_cast<int>(j % packs_per_row), h = pack / packs_per_head, i0 = (pack % packs_per_head) * V;
    const long long e0 = h * d.head_dim + i0, e1 = e0 + half;
    float x0[V], x1[V], y0[V], y1[V];
    load_pack<V>(in + r * in_stride + e0, 0, x0);
    load_pack<V>(in + r * in_stride + e1, 0, x1);
#pragma unroll
    for (int v = 0; v < V; ++v) rotate(x0[v], x1[v], cosines[i0 + v], sines[i0 + v], y0[v], y1[v]);
    T* y = out + r * out_stride;
    if (add) {
      float o0[V], o1[V];
      load_pack<V>(y + e0, 0, o0);
      load_pack<V>(y + e1, 0, o1);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        y0[v] += o0[v];
        y1[v] += o1[v];
      }
    }
    store_pack<V>(y + e0, 0, y0);
    store_pack<V>(y + e1, 0, y1);
  }
}

// Whether the packed kernel takes this layout: inner 1, whole sequences, 16-byte packs within each half of a head,
// rows and pointers 16-byte aligned.
bool packed_layout(const void* in, const void* out, const RotaryRows& d, long long in_stride, long long out_stride,
                   int pack) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return d.inner == 1 && d.rows % d.time == 0 && (d.head_dim / 2) % pack == 0 && in_stride % pack == 0 &&
         out_stride % pack == 0 && aligned(in) && aligned(out) && d.time <= 0x7fffffff;
}

}  // namespace

void cuda_rotary_embedding(const void* in, void* out, bool add, const RotaryRows& d, const RotaryFrequencies& f,
                           DType dtype) {
  HGRN_CHECK(d.head_dim % 2 == 0 && d.head_dim <= 2 * kMaxRotaryPairs && d.time > 0, "rotary_embedding CUDA: head width ",
             d.head_dim, " must be even and at most ", 2 * kMaxRotaryPairs, ", and time positive");
  const long long pairs_per_row = d.heads * (d.head_dim / 2) * d.inner;
  HGRN_CHECK(pairs_per_row < (1LL << 30), "rotary_embedding CUDA: ", pairs_per_row, " pairs a row: fewer than 2^30");
  if (d.rows == 0 || pairs_per_row == 0) return;
  const long long in_stride = d.in_stride ? d.in_stride : d.row_width();
  const long long out_stride = d.out_stride ? d.out_stride : d.row_width();
  constexpr int kThreads = 256;
  HGRN_CUDA_DISPATCH_ACT(dtype, "rotary_embedding", [&] {
    const auto x = static_cast<const act_t*>(in);
    const auto y = static_cast<act_t*>(out);
    constexpr int kPack = 16 / static_cast<int>(sizeof(act_t));
    if (packed_layout(in, out, d, in_stride, out_stride, kPack)) {
      // A block per position, and more per position where positions are few (decoding: one, over a batch of rows).
      const long long blocks_needed = (d.rows / d.time * (pairs_per_row / kPack) + kThreads - 1) / kThreads;
      const long long per_position = std::clamp<long long>(blocks_needed, 1, std::max<long long>(1, 1024 / d.time));
      const dim3 grid(static_cast<unsigned>(d.time), static_cast<unsigned>(std::min<long long>(per_position, 65535)));
      launch_as_dependent(rotary_packed_kernel<act_t, kPack>, grid, dim3(kThreads), 0, x, y, add, d, f, in_stride,
                          out_stride);
    } else {
      const dim3 grid(static_cast<unsigned>(std::min<long long>(d.rows, 1LL << 30)),
                      static_cast<unsigned>(std::min<long long>((pairs_per_row + kThreads - 1) / kThreads, 65535)));
      launch_as_dependent(rotary_kernel<act_t>, grid, dim3(kThreads), 0, x, y, add, d, f,
                          static_cast<int>(pairs_per_row), in_stride, out_stride);
    }
    CUDA_CHECK_LAUNCH("rotary_embedding");
  });
}

}  // namespace hgrn
