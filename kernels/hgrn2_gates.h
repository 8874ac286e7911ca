// hgrn2_gates.h: the HGRN2 gates on the GPU (src/ops/hgrn2_gates.cpp has the maths and the CPU reference): the
// layer-wise lower bound γ = cumsum(softmax(Γ)) − P_0, and a layer's gates q = silu(q̂), the lower-bounded log
// forget gate g and the input gate k = −expm1(g) (fused, or k alone from a given g), forward and backward. γ, Γ, g
// and their gradients are fp32; q̂, q, f̂ and k are fp32 or bf16.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// Γ [layers, width] -> probs = softmax over layers, gamma (both [layers, width], fp32).
void cuda_lower_bound_forward(const float* lower_bounds, float* probs, float* gamma, int64_t layers, int64_t width);
// dlower_bounds += the softmax/cumsum backward of dgamma.
void cuda_lower_bound_backward(const float* probs, const float* dgamma, float* dlower_bounds, int64_t layers,
                               int64_t width);

// A layer's gates over [rows, width], q̂ and f̂ in `dtype` (fp32/bf16) -> g fp32, and where non-null
// q = silu(q̂) and k = −expm1(g) in `dtype` (q and q_hat come together). gamma_row (fp32 [width]) is null for an
// unbounded gate (layer 0, or no lower bounds). One pass: f̂ and q̂ read once, g not read back. q̂ and f̂ may be
// row-strided (rows *_stride elements apart; 0 = width): column blocks of a fused projection's output.
void cuda_hgrn2_gates_forward(const void* q_hat, const void* f_hat, DType dtype, const float* gamma_row, void* q,
                              float* g, void* k, int64_t rows, int64_t width, int64_t q_hat_stride = 0,
                              int64_t f_hat_stride = 0);
// Floats of scratch cuda_hgrn2_gates_backward needs for γ's gradient (0 when no dgamma_row is asked for).
int64_t cuda_hgrn2_gates_backward_workspace(int64_t rows, int64_t width);
// The backward of cuda_hgrn2_gates_forward, one pass; g is recomputed from f̂, not read. Cotangents dq, dk (`dtype`) and dg (fp32) may each be null
// (zero). g's whole gradient dg − exp(g)·dk goes into df_hat (+)= ·∂g/∂f̂ and dgamma_row += its sum over rows of
// ·∂g/∂γ (fixed order, through `workspace`); dq_hat (+)= silu'(q̂)·dq. add_* true accumulates, false overwrites every
// element (a fresh buffer). df_hat is written before dq_hat, element by element, so the two may alias (dq's add_dq
// must then be true). Null outputs are not computed.
struct Hgrn2GatesBackwardArgs {
  const void* q_hat = nullptr;
  const void* f_hat = nullptr;
  DType dtype = DType::F32;
  const float* gamma_row = nullptr;  // dgamma_row needs it
  const void* dq = nullptr;
  const float* dg = nullptr;
  const void* dk = nullptr;
  void* dq_hat = nullptr;
  bool add_dq = false;
  void* df_hat = nullptr;
  bool add_df = false;
  float* dgamma_row = nullptr;
  float* workspace = nullptr;
  int64_t rows = 0, width = 0;
  // Row strides of q̂, f̂ and their gradients (0 = width: contiguous); dq, dg and dk are contiguous.
  int64_t q_hat_stride = 0, f_hat_stride = 0, dq_hat_stride = 0, df_hat_stride = 0;
};
void cuda_hgrn2_gates_backward(const Hgrn2GatesBackwardArgs& args);

// k = −expm1(g), g in g_dtype and k in k_dtype (each fp32 or bf16), n elements.
void cuda_input_gate_forward(const void* g, DType g_dtype, void* k, DType k_dtype, int64_t n);
// dg (g_dtype) += −exp(g) dk (dk in k_dtype); add_dg false overwrites dg instead (dg = −exp(g) dk).
void cuda_input_gate_backward(const void* g, DType g_dtype, const void* dk, DType k_dtype, void* dg, bool add_dg,
                              int64_t n);

}  // namespace hgrn
