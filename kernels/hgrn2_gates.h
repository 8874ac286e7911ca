// hgrn2_gates.h: the HGRN2 gates on the GPU (src/ops/hgrn2_gates.cpp has the maths and the CPU reference): the
// layer-wise lower bound γ = cumsum(softmax(Γ)) − P_0, the lower-bounded log forget gate g and the input gate
// k = −expm1(g), forward and backward. γ, Γ, g and their gradients are fp32; f̂ and k are fp32 or bf16.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// Γ [layers, width] -> probs = softmax over layers, gamma (both [layers, width], fp32).
void cuda_lower_bound_forward(const float* lower_bounds, float* probs, float* gamma, int64_t layers, int64_t width);
// dlower_bounds += the softmax/cumsum backward of dgamma.
void cuda_lower_bound_backward(const float* probs, const float* dgamma, float* dlower_bounds, int64_t layers,
                               int64_t width);

// f_hat [rows, width] in f_dtype (fp32/bf16) -> g fp32. gamma_row (fp32 [width]) is null for an unbounded gate.
void cuda_forget_gate_forward(const void* f_hat, DType f_dtype, const float* gamma_row, float* g, int64_t rows,
                              int64_t width);
// Floats of scratch cuda_forget_gate_backward needs for γ's gradient (0 when no dgamma_row is asked for).
int64_t cuda_forget_gate_backward_workspace(int64_t rows, int64_t width);
// df_hat (f_dtype, may be null) (+)= dg ∂g/∂f̂: add_df true accumulates, false overwrites every element (a fresh
// buffer); dgamma_row (fp32 [width], may be null; needs gamma_row) += the sum over rows of dg ∂g/∂γ, reduced in a
// fixed order through `workspace` (cuda_forget_gate_backward_workspace floats).
void cuda_forget_gate_backward(const void* f_hat, DType f_dtype, const float* gamma_row, const float* g,
                               const float* dg, void* df_hat, bool add_df, float* dgamma_row, float* workspace,
                               int64_t rows, int64_t width);

// k = −expm1(g), g in g_dtype and k in k_dtype (each fp32 or bf16), n elements.
void cuda_input_gate_forward(const void* g, DType g_dtype, void* k, DType k_dtype, int64_t n);
// dg (g_dtype) += −exp(g) dk (dk in k_dtype); add_dg false overwrites dg instead (dg = −exp(g) dk).
void cuda_input_gate_backward(const void* g, DType g_dtype, const void* dk, DType k_dtype, void* dg, bool add_dg,
                              int64_t n);

}  // namespace hgrn
