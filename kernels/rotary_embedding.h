// rotary_embedding.h: the rotary position embedding's layout, which the CPU reference (ops/rotary_embedding.cpp)
// and the GPU kernel take alike, and the GPU entry point. A tensor is seen as [rows][heads][head_dim][inner]: row r
// (rows in_stride / out_stride elements apart) is at position first_position + r % time, and within a head the
// pair (element i, element i + head_dim/2) of every inner column is rotated by position · θᵢ,
// θᵢ = 10000^(−2i/head_dim). Keys and queries [B, T, H·K]: rows B·T, inner 1; a recurrent state [B, H, K, V]: rows
// B, time 1, inner V.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace hgrn {

// fla's RotaryEmbedding base, and the widest head it takes (head_dim <= 256, so at most 128 pairs).
constexpr double kRotaryBase = 10000.0;
constexpr int kMaxRotaryPairs = 128;

// θᵢ = 1 / base^(2i/K) as fla forms it (one power, one division) in the angle type A: fp64 for fp64 tensors, else
// fp32. The GPU gets the host's fp32 values (RotaryFrequencies), so both devices rotate by the same angles.
template <typename A>
A rotary_frequency(int64_t i, int64_t head_dim) {
  return A(1) / std::pow(static_cast<A>(kRotaryBase), static_cast<A>(2 * i) / static_cast<A>(head_dim));
}

struct RotaryFrequencies {
  float inv_freq[kMaxRotaryPairs];
};

struct RotaryRows {
  int64_t rows = 0, time = 1, heads = 0, head_dim = 0, inner = 1;
  int64_t in_stride = 0, out_stride = 0;  // elements between rows; 0: heads · head_dim · inner (contiguous)
  int64_t first_position = 0;
  bool inverse = false;  // rotate by −position · θᵢ (the backward)
  int64_t row_width() const { return heads * head_dim * inner; }
};

// out (+)= the rotation of in: add true accumulates into out, false overwrites it. fp32 or bf16 (dtype), arithmetic
// and angles in fp32 as fla's tables: position · frequencies.inv_freq[i] (head_dim <= 2 · kMaxRotaryPairs).
void cuda_rotary_embedding(const void* in, void* out, bool add, const RotaryRows& shape,
                           const RotaryFrequencies& frequencies, DType dtype);

}  // namespace hgrn
