// lower_bounded_gated_scan_step.cu: one token of HGRN1's recurrence with its output norm (lower_bounded_gated_scan.h,
// lower_bounded_scan_cuda_step). One block per sequence: each thread takes channels c, c + blockDim, ... and computes
// λ and k = 1 − λ (gate_math::decay_gate, as the chunked scan does), the new state h = λ h + silu(î)·k (written once)
// and its square; the block's sum of squares (row_sums.cuh: a fixed order) gives the RMSNorm's rstd, and a second
// pass over the same channels, by the same threads, reads the state it wrote and writes RMSNorm(h)·w·silu(ĝ).
// It launches as a programmatic dependent (dependent_launch.cuh): before it waits it only asks L2 for its state.
#include <cuda_bf16.h>

#include "cuda_check.h"
#include "cuda_context.h"
#include "dependent_launch.cuh"
#include "dtype_cuda.cuh"
#include "hgrn2_gate_math.cuh"
#include "lower_bounded_gated_scan.h"
#include "row_sums.cuh"
#include "sigmoid.cuh"

namespace hgrn {

namespace {

template <typename Act>
__global__ void lower_bounded_scan_step_kernel(const LowerBoundedScanStepArgs p) {
  __shared__ float warp_sums[32];
  const int64_t b = blockIdx.x;
  const int C = static_cast<int>(p.channels);
  const Act* i_row = static_cast<const Act*>(p.i_hat) + b * p.i_stride;
  const Act* f_row = static_cast<const Act*>(p.f_hat) + b * p.f_stride;
  const Act* g_row = static_cast<const Act*>(p.g_hat) + b * p.g_stride;
  float* h = p.state + b * C;
  for (int c = threadIdx.x * 32; c < C; c += blockDim.x * 32) prefetch_l2(h + c);  // 128-byte lines
  wait_for_previous_kernel();
  allow_dependent_launch();
  float sum_sq = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float i_hat = load_f(i_row[c]);
    const gate_math::DecayGate gate = gate_math::decay_gate(load_f(f_row[c]), p.gamma_row ? p.gamma_row[c] : 0.f);
    const float updated = gate.lambda * h[c] + i_hat * stable_sigmoid<float>(i_hat) * gate.k;
    h[c] = updated;
    sum_sq += updated * updated;
  }
  const float rstd = 1.f / sqrtf(block_sum(sum_sq, warp_sums) / static_cast<float>(C) + p.eps);
  Act* out = static_cast<Act*>(p.out) + b * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g_hat = load_f(g_row[c]);
    out[c] = store_f<Act>(h[c] * rstd * p.norm_weight[c] * (g_hat * stable_sigmoid<float>(g_hat)));
  }
}

}  // namespace

void lower_bounded_scan_cuda_step(const LowerBoundedScanStepArgs& a) {
  check_row_width(a.channels, "lower_bounded_gated_scan_step");
  HGRN_CHECK(a.batch > 0 && a.batch <= 0x7fffffff, "lower_bounded_gated_scan_step: batch ", a.batch, " out of range");
  HGRN_CUDA_DISPATCH_ACT(a.act, "lower_bounded_gated_scan_step", [&] {
    launch_as_dependent(lower_bounded_scan_step_kernel<act_t>, dim3(static_cast<unsigned>(a.batch)),
                        dim3(static_cast<unsigned>(row_block_threads(a.channels))), 0, a);
  });
  CUDA_CHECK_LAUNCH("lower_bounded_gated_scan_step");
}

}  // namespace hgrn
