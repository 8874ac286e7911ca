// lower_bounded_gla_step.cu: one token of HGRN2's recurrence with its gates (lower_bounded_gla_step.h).
// A block takes one sequence b, one head h and 32 value columns: its 256 threads first compute the head's K gates
// (q = silu(q̂), λ and k = 1 − λ of the lower-bounded forget gate: gate_math::decay_gate, the function HGRN1's scan
// and the gates' kernels use) into shared memory; then lane x owns column v and the 8 warps split the K rows, each
// thread updating its S[k, v] (read once, written once: a warp reads 32 consecutive fp32 of a row) and summing
// q_k · S[k, v] for the read-out; the 8 partial sums are added in warp order. Every value is computed by one thread in
// a fixed order: the bits repeat run to run.
#include <cuda_bf16.h>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dtype_cuda.cuh"
#include "hgrn2_gate_math.cuh"
#include "lower_bounded_gla_step.h"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

constexpr int kColumns = 32;  // value columns per block (one warp's lanes)
constexpr int kRowGroups = 8;  // warps per block, splitting the K rows
constexpr int kMaxKeyDim = 1024;

template <typename Act>
__global__ void __launch_bounds__(kColumns * kRowGroups) lower_bounded_gla_step_kernel(const LowerBoundedGlaStepArgs p) {
  extern __shared__ float gates[];  // q [K], λ [K], k [K]
  __shared__ float partial[kRowGroups][kColumns];
  const int K = static_cast<int>(p.key_dim), V = static_cast<int>(p.value_dim), H = static_cast<int>(p.heads);
  float* q = gates;
  float* lambda = gates + K;
  float* input = gates + 2 * K;
  const int b = blockIdx.z, h = blockIdx.y;
  const int v = blockIdx.x * kColumns + threadIdx.x;
  const int thread = threadIdx.y * kColumns + threadIdx.x;
  const Act* q_row = static_cast<const Act*>(p.q_hat) + b * p.q_hat_stride + static_cast<int64_t>(h) * K;
  const Act* f_row = static_cast<const Act*>(p.f_hat) + b * p.f_hat_stride + static_cast<int64_t>(h) * K;
  for (int k = thread; k < K; k += kColumns * kRowGroups) {
    const float q_hat = load_f(q_row[k]);
    const float gamma = p.gamma_row ? p.gamma_row[h * K + k] : 0.f;
    const gate_math::DecayGate gate = gate_math::decay_gate(load_f(f_row[k]), gamma);
    q[k] = q_hat * stable_sigmoid<float>(q_hat);
    lambda[k] = gate.lambda;
    input[k] = gate.k;
  }
  __syncthreads();
  float sum = 0.f;
  if (v < V) {
    const float value = load_f(static_cast<const Act*>(p.v)[b * p.v_stride + static_cast<int64_t>(h) * V + v]);
    float* s = p.state + (static_cast<int64_t>(b) * H + h) * K * V + v;
#pragma unroll 4
    for (int k = threadIdx.y; k < K; k += kRowGroups) {
      const float updated = lambda[k] * s[static_cast<int64_t>(k) * V] + input[k] * value;
      s[static_cast<int64_t>(k) * V] = updated;
      sum += q[k] * updated;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && v < V) {
    float o = 0.f;
#pragma unroll
    for (int g = 0; g < kRowGroups; ++g) o += partial[g][threadIdx.x];
    static_cast<Act*>(p.out)[static_cast<int64_t>(b) * H * V + static_cast<int64_t>(h) * V + v] =
        store_f<Act>(p.scale * o);
  }
}

}  // namespace

void cuda_lower_bounded_gla_step(const LowerBoundedGlaStepArgs& a) {
  HGRN_CHECK(a.key_dim > 0 && a.key_dim <= kMaxKeyDim && a.value_dim > 0 && a.heads > 0,
             "lower_bounded_gla_step: key width ", a.key_dim, " (at most ", kMaxKeyDim, "), value width ", a.value_dim,
             ", ", a.heads, " heads");
  HGRN_CHECK(a.batch <= 65535 && a.heads <= 65535, "lower_bounded_gla_step: batch ", a.batch, " or heads ", a.heads,
             " too large for one launch (at most 65535)");
  const dim3 grid(static_cast<unsigned>((a.value_dim + kColumns - 1) / kColumns), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(a.batch));
  const dim3 block(kColumns, kRowGroups);
  const size_t shared = 3 * static_cast<size_t>(a.key_dim) * sizeof(float);
  HGRN_CUDA_DISPATCH_ACT(a.act, "lower_bounded_gla_step", [&] {
    lower_bounded_gla_step_kernel<act_t><<<grid, block, shared, cuda_stream()>>>(a);
  });
  CUDA_CHECK_LAUNCH("lower_bounded_gla_step");
}

}  // namespace hgrn
