// rotary_embedding.h: rotary position embedding (RoPE; Su et al., "RoFormer"), as fla's RotaryEmbedding (base 10000,
// halves not interleaved), which RetNet applies to its queries and keys. Each head's K features are split into halves
// x₁ = x[:K/2] and x₂ = x[K/2:]; at position p the pair (x₁ᵢ, x₂ᵢ) becomes
// (x₁ᵢ cos pθᵢ − x₂ᵢ sin pθᵢ, x₁ᵢ sin pθᵢ + x₂ᵢ cos pθᵢ), θᵢ = 10000^(−2i/K). Angles in the computation's precision:
// fp64 for fp64 tensors, else fp32 (fla's fp32 tables). A rotation, so its backward is the rotation by −pθᵢ.
#pragma once
#include <cstdint>

#include "core/autograd.h"

namespace hgrn {

// x [B, T, H·K] (K even; contiguous or row-strided: a column block of a fused projection), row t at position
// first_position + t. Returns a contiguous [B, T, H·K] in x's dtype.
Var rotary_embedding(Tape& tape, const Var& x, int64_t num_heads, int64_t first_position);

// The same rotation written over x's own elements: the result is a view of x's storage (x's layout), so it costs no
// memory of its own. x's values are gone afterwards: only for an x that nothing else reads (RetNet's q and k, columns
// of the projection's output that only their rotation consumes). The gradient still reaches x.
Var rotary_embedding_in_place(Tape& tape, const Var& x, int64_t num_heads, int64_t first_position);

// A recurrent state over rotated keys, S = Σ_s decay · k̃_sᵀ v_s per head [B, H, K, V] (contiguous), with every
// column (a vector in key space) rotated as rotary_embedding rotates a key at position `shift`. Since a query at t
// meets a key at s only through the rotation by (s − t)θ, the state after T tokens shifted by −T is the state of the
// same history seen from position 0: the next piece of the sequence then starts its positions at 0.
Var rotary_state_shift(Tape& tape, const Var& state, int64_t shift);

}  // namespace hgrn
