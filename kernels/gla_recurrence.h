// gla_recurrence.h: the HGRU2 (= gated linear attention) chunkwise recurrence on the GPU, forward and backward
// (spec section 7): S_t = Diag(e^{g_t}) S_{t−1} + k_tᵀ v_t, o_t = s·q_t S_t, per (batch, head), in chunks of 64 steps.
// q, k: [B, T, H·K] and v: [B, T, H·V], row-strided (GlaCudaRowStrides), in the activation dtype (fp32 or bf16, all
// three the same); g fp32 (log forget gate, <= 0, contiguous) in one of the GlaDecay shapes; states fp32
// [B, H, K, V]; output [B, T, H·V] in the activation dtype. K <= 256, any V.
// The caller provides the scratch buffers (sizes below), so that all memory goes through hgrn's allocator.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

struct GlaCudaShape {
  int64_t batch = 0, time = 0, heads = 0, key_dim = 0, value_dim = 0;
};

// The chunk length of the CUDA kernels (fixed; the last chunk may be partial).
constexpr int64_t kGlaCudaChunk = 64;
// Elements of a per-chunk state buffer: B·H·NT·K·V (NT = ceil(T / 64)); the forward's is in the activation dtype,
// the backward's two are fp32.
int64_t gla_cuda_states_elements(const GlaCudaShape& shape);
// Elements of a per-chunk 64×64 score buffer (A in the forward, in the activation dtype; dA in the backward, fp32):
// B·H·NT·64·64.
int64_t gla_cuda_scores_elements(const GlaCudaShape& shape);

// g's shape: a log decay per key channel [B, T, H·K] (HGRN2, GLA), or the scalar-decay mode of the same kernels,
// one per head and step [B, T, H] or a constant per head [H] (RetNet; no gradient).
enum class GlaDecay { PerChannel, PerStep, PerHead };

// Floats of GlaCudaBackwardArgs::dg_partials: K-tiles·B·T·H where K > 64 (several 64-wide K-tiles), else 0.
int64_t gla_cuda_dg_partials_elements(const GlaCudaShape& shape);

// Elements between consecutive rows (one per batch and step) of q, k, v and their gradients, which may be column
// blocks of a wider tensor (a fused projection's output, or its gradient); 0 = contiguous (H·K, or H·V for v, dv).
struct GlaCudaRowStrides {
  int64_t q = 0, k = 0, v = 0;
  int64_t dq = 0, dk = 0, dv = 0;  // backward only
};

struct GlaCudaForwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  GlaCudaRowStrides strides;            // q's, k's and v's
  DType act = DType::F32;               // dtype of q, k, v and output
  const float* g = nullptr;
  GlaDecay decay = GlaDecay::PerChannel;
  const float* initial_state = nullptr;  // null: S_0 = 0
  float scale = 1.0f;
  void* output = nullptr;
  float* final_state = nullptr;
  // Null, or the scores buffer, in the activation dtype: receives every chunk's A (s included) for the backward. Only
  // products that round A to that dtype read it (A v here, Aᵀ dO in the backward), so keeping it rounded is exact.
  void* scores = nullptr;
  // Scratch: the states buffer, in the activation dtype. The forward only uses the states rounded to it (operands of
  // q̄·S), so storing them rounded is exact and halves their traffic for bf16 (as fla stores them).
  void* states = nullptr;
  // Per-chunk reset masks [B, ceil(T / 64)] (kernels/sequence_resets.h): a set bit i restarts the state at row i of
  // that chunk (S_t = k_tᵀ v_t). Null: no resets.
  const uint64_t* reset_masks = nullptr;
};
void gla_cuda_forward(const GlaCudaShape& shape, const GlaCudaForwardArgs& args);

// The HGRN2 gates' backward run in the epilogue of the kernel that forms dq, dk and dg (bwd_dqk), where the
// recurrence's q, g and k are a layer's gates of q̂ and f̂ (kernels/hgrn2_gates.h: q = silu(q̂), g the lower-bounded
// log forget gate of f̂, k = −expm1(g)). The same function as cuda_hgrn2_gates_backward applied to dq, dk and dg,
// without storing those three and reading them back: g's whole gradient dg − e^g·dk (in fp32, where the separate
// pass had dk rounded to the activation dtype) goes into df̂ = ·∂g/∂f̂ and γ's gradient, and dq̂ = silu'(q̂)·dq (dq
// likewise unrounded). dq̂ and df̂ are written, not accumulated (fresh buffers).
struct GlaGatesEpilogue {
  const void* q_hat = nullptr;  // null: no epilogue (dq, dk, dg are written as asked)
  const void* f_hat = nullptr;
  int64_t q_hat_stride = 0, f_hat_stride = 0;  // row strides (0 = H·K: contiguous), as the gradients' below
  const float* gamma_row = nullptr;            // γ_ℓ [H·K] fp32; null: an unbounded gate (layer 0, no lower bounds)
  void* dq_hat = nullptr;
  void* df_hat = nullptr;
  int64_t dq_hat_stride = 0, df_hat_stride = 0;
  // += the sum over all rows of (dg − e^g dk)·∂g/∂γ, through `partials` (gla_cuda_gate_partials_elements floats:
  // one row of sums per chunk and sequence, added in a fixed order); null: γ wants no gradient.
  float* dgamma_row = nullptr;
  float* partials = nullptr;
};
// Floats of GlaGatesEpilogue::partials: B·NT·H·K.
int64_t gla_cuda_gate_partials_elements(const GlaCudaShape& shape);

struct GlaCudaBackwardArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  GlaCudaRowStrides strides;  // of q, k, v and of dq, dk, dv
  DType act = DType::F32;
  const float* g = nullptr;
  GlaDecay decay = GlaDecay::PerChannel;  // the forward's; dg has g's shape (PerHead: none)
  const float* initial_state = nullptr;  // null: S_0 = 0
  float scale = 1.0f;
  const void* scores = nullptr;          // the forward's A (activation dtype)
  const void* d_output = nullptr;        // null: the output's gradient is zero (act dtype otherwise)
  const float* d_final_state = nullptr;  // null: zero
  // Accumulated (+=); null where that gradient is not wanted. A false accumulate_* flag overwrites that gradient
  // instead (a fresh buffer: spares the caller zero-filling it and the kernels reading it back).
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dg = nullptr;
  float* d_initial_state = nullptr;
  bool accumulate_dq = true, accumulate_dk = true, accumulate_dv = true, accumulate_dg = true;
  // With gates.q_hat set (per-channel gates only), dq, dk and dg must be null: the gates' gradients are formed from
  // them instead.
  GlaGatesEpilogue gates;
  // The per-chunk states S^(c) in the activation dtype, as the forward's state pass stores them (dq, dk and dg read
  // them; null where none of those is wanted). states_given: they hold the forward's states already (kept from it),
  // else they are scratch the backward recomputes them into first, with the forward's pass: the same bits either way.
  void* states = nullptr;
  bool states_given = false;
  const uint64_t* reset_masks = nullptr;  // the forward's
  // Scratch: the state gradients (gla_cuda_states_elements, in the dtype gla_cuda_state_gradients_dtype gives) and
  // one scores buffer (dA).
  void* d_states = nullptr;
  float* d_scores = nullptr;
  // Scratch for a PerStep g's gradient where K > 64 (gla_cuda_dg_partials_elements floats); else unused.
  float* dg_partials = nullptr;
};
void gla_cuda_backward(const GlaCudaShape& shape, const GlaCudaBackwardArgs& args);

// The dtype of the backward's state gradients dS_e (GlaCudaBackwardArgs::d_states) for these arguments: the
// activation dtype where no gradient of g is formed (neither dg nor the gates' epilogue: a per-head g, RetNet's), else
// fp32. Every product reads dS_e rounded to the activation dtype; only dg's row sums rowsum(S_p ⊙ dS_e) take its fp32
// values, so storing it rounded gives the same dq, dk and dv bits in half the bytes.
DType gla_cuda_state_gradients_dtype(const GlaCudaBackwardArgs& args);

}  // namespace hgrn
