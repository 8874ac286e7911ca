// rmsnorm.h: RMSNorm on the GPU, forward and backward. x, y and their gradients are act dtype (fp32 or bf16)
// [rows, width], contiguous; the weight, its gradient and the saved rstd are fp32; statistics are computed in fp32.
// (The model's residual adds happen in the GEMM epilogues before the norms: src/ops/linear.h.)
#pragma once
#include <cstdint>
#include <initializer_list>

#include "core/dtype.h"
#include "ops/fp8.h"

namespace hgrn {

// A swish gate on the norm's output, y = silu(gate) ⊙ (x̂ · w): fla's FusedRMSNormGated (swish), and swiglu_linear's
// normalised up operand. x̂ · w is rounded to the act dtype before the product, so the bits are those of rmsnorm then
// swiglu. Gate rows are `stride` elements apart (a column block of a fused projection), each holding `groups` of the
// norm's rows side by side (per-head norms); dgate (the backward's; add_dgate accumulates, else overwrites) is laid
// out the same way, dgate_stride apart.
struct RmsnormGate {
  const void* gate = nullptr;
  int64_t stride = 0, groups = 1;
  void* dgate = nullptr;
  int64_t dgate_stride = 0;
  bool add_dgate = false;
  // codes.codes set: the gated output as FP8 codes in place of y (y null; ops/fp8.h: Fp8CodesOut), with its amax in
  // the forward where codes.amax is set, none in the backward.
  Fp8CodesOut codes;
};
// Whether the gated forms below take a problem: rows of one warp (up to 2048 bf16 or 1024 fp32 values), every row and
// gate row on 16 bytes. The caller composes rmsnorm and swiglu otherwise.
bool cuda_rmsnorm_gate_fits(int64_t width, const void* x, const RmsnormGate& gate, DType dtype);

// y = x̂ · w with x̂ = x · rstd, rstd = (mean(x²) + eps)^(-1/2) per row (written to rstd [rows]); weight may be null
// (y = x̂). gate non-null: y = silu(gate) ⊙ (x̂ · w) instead (RmsnormGate; only where cuda_rmsnorm_gate_fits).
void cuda_rmsnorm_forward(const void* x, const float* weight, void* y, float* rstd, int64_t rows, int64_t width,
                          double eps, DType dtype, const RmsnormGate* gate = nullptr);

// The backward: with g = ∂y/∂x · dy, writes dx (+)= g (null: not wanted): add true accumulates, false overwrites
// every element (a fresh buffer). dweight += Σ_rows dy ⊙ x̂ (fp32; null for none); dweight_add false: dweight = that
// sum (a fresh buffer, written without being read; zeros where there are no rows or no dy). dy null: no gradient
// reached y (nothing but y below is written). dweight is reduced in a fixed order (no atomics): bits repeat
// run to run. y non-null: also writes the forward's output x̂ · w again, with the forward's arithmetic (the same
// bits), for a caller that freed it (ops/recompute.h). gate non-null (only where cuda_rmsnorm_gate_fits): dy is the
// gated output's gradient (required); also writes the gate's gradient, and y (may alias dy) gets the gated output.
// y_codes (the plain norm only; no amax; only where cuda_rmsnorm_codes_fit): the output written again as FP8 codes in
// place of y (y null), for a consumer that reads it as an FP8 projection's input.
void cuda_rmsnorm_backward(const void* x, const float* weight, const float* rstd, const void* dy, void* dx, bool add,
                           float* dweight, bool dweight_add, void* y, int64_t rows, int64_t width, DType dtype,
                           const RmsnormGate* gate = nullptr, const Fp8CodesOut* y_codes = nullptr);
// Whether the backward can write the plain norm's output as codes: rows the warp kernels take, every buffer it reads
// or writes (x, the weight, dy, dx; null ones skipped) on 16 bytes.
bool cuda_rmsnorm_codes_fit(int64_t width, DType dtype, std::initializer_list<const void*> buffers);

}  // namespace hgrn
