// lower_bounded_gla_step.cu: one token of HGRN2's recurrence with its gates (lower_bounded_gla_step.h).
// A block takes one sequence b, one head h and 32 value columns: its 256 threads first compute the head's K gates
// (q = silu(q̂), λ and k = 1 − λ of the lower-bounded forget gate: gate_math::decay_gate, the function HGRN1's scan
// and the gates' kernels use) into shared memory; then lane x owns column v and the 8 warps split the K rows, each
// thread updating its S[k, v] (read once, written once: a warp reads 32 consecutive fp32 of a row) and summing
// q_k · S[k, v] for the read-out; the 8 partial sums are added in warp order. Every value is computed by one thread in
// a fixed order: the bits repeat run to run. It launches as a programmatic dependent (dependent_launch.cuh): before it
// waits it only asks L2 for its state tile; after, it loads its first state rows before it computes the gates.
#include <cuda_bf16.h>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "hgrn2_gate_math.cuh"
#include "lower_bounded_gla_step.h"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

constexpr int kColumns = 32;  // value columns per block (one warp's lanes)
constexpr int kRowGroups = 8;  // warps per block, splitting the K rows
constexpr int kMaxKeyDim = 1024;
constexpr int kRowsInFlight = 16;  // state rows a thread loads before it uses them

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
  float* s = p.state + (static_cast<int64_t>(b) * H + h) * K * V + v;  // S[0, v]; row k at s[k·V]
  if (v < V)
    for (int k = threadIdx.y; k < K; k += kRowGroups) prefetch_l2(s + static_cast<int64_t>(k) * V);
  wait_for_previous_kernel();
  allow_dependent_launch();

  // Rows k0, k0 + kRowGroups, … (kRowsInFlight of them) of this thread's column: loaded together, then updated.
  float held[kRowsInFlight];
  const auto load_rows = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      const int k = k0 + i * kRowGroups;
      if (k < K) held[i] = s[static_cast<int64_t>(k) * V];
    }
  };
  if (v < V) load_rows(threadIdx.y);
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
    for (int k0 = threadIdx.y; k0 < K; k0 += kRowGroups * kRowsInFlight) {
      if (k0 != static_cast<int>(threadIdx.y)) load_rows(k0);
#pragma unroll
      for (int i = 0; i < kRowsInFlight; ++i) {
        const int k = k0 + i * kRowGroups;
        if (k >= K) break;
        const float updated = lambda[k] * held[i] + input[k] * value;
        s[static_cast<int64_t>(k) * V] = updated;
        sum += q[k] * updated;
      }
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
    launch_as_dependent(lower_bounded_gla_step_kernel<act_t>, grid, block, shared, a);
  });
  CUDA_CHECK_LAUNCH("lower_bounded_gla_step");
}

}  // namespace hgrn
