// sequence_resets.h: the recurrences' optional per-token reset flags. resets[b, t] != 0 means "the state before
// position t is zero": step t starts from the zero state (a new document of a packed sequence), whatever came before
// it, an initial state included. In the maths a reset multiplies step t's decay by 0, so nothing before t reaches t
// or later, and no gradient flows back across it (the decay gate of a reset step gets no gradient through the
// decay). The ops treat a reset as a segment boundary (a mask, never a log-space −∞), so no −∞ − (−∞) can arise.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace hgrn {

// Checks resets (undefined: none) for an op on [batch, time, ...] inputs on `device`: int32 [batch, time],
// contiguous, on that device. `op` names the op in the message.
void check_resets(const Tensor& resets, int64_t batch, int64_t time, Device device, const char* op);

// One sequence's flags on the CPU (null: no resets), read by the CPU reference forms.
struct SequenceResets {
  const int32_t* flags = nullptr;
  bool at(int64_t t) const { return flags && flags[t] != 0; }
  // The first reset in [begin, end), or end when there is none.
  int64_t first_in(int64_t begin, int64_t end) const {
    if (flags)
      for (int64_t t = begin; t < end; ++t)
        if (flags[t]) return t;
    return end;
  }
  // The last reset in [begin, end), or begin − 1 when there is none.
  int64_t last_in(int64_t begin, int64_t end) const {
    if (flags)
      for (int64_t t = end - 1; t >= begin; --t)
        if (flags[t]) return t;
    return begin - 1;
  }
};

// Row b of a checked resets tensor on the CPU (no resets for an undefined one).
inline SequenceResets sequence_resets(const Tensor& resets, int64_t b) {
  return {resets.defined() ? resets.data<int32_t>() + b * resets.size(1) : nullptr};
}

// On the GPU: the flags as the chunked kernels read them, one 64-bit mask per (sequence, 64-step chunk) with bit i
// set where step 64·c + i resets (kernels/sequence_resets.h): int64 [B, ceil(T / 64)]. Undefined for undefined
// resets.
Tensor reset_chunk_masks(const Tensor& resets);

}  // namespace hgrn
