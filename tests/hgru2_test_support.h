// hgru2_test_support.h: what the HGRU2 recurrence's GPU tests (test_hgru2_recurrence_cuda.cpp,
// test_gated_recurrence_cuda.cpp) share: the problem size, printable for their failure messages, and their
// tolerances against the fp64 CPU reference (the gated test's gates only scale the recurrence's gradients element by
// element, so it holds them to the same bounds).
#pragma once
#include <cstdint>
#include <string>

namespace hgrn::testing {

struct Hgru2Shape {
  int64_t batch, time, heads, key_dim, value_dim;
  std::string str() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(time) + " H=" + std::to_string(heads) +
           " K=" + std::to_string(key_dim) + " V=" + std::to_string(value_dim);
  }
};

// Tolerances of one comparison: relative RMS error, and max abs error relative to the reference's largest entry.
struct Tol {
  double rel_rms, max_rel;
};
// fp32: the kernel computes in fp32 throughout (no TF32), so it differs from fp64 only by fp32 rounding of O(64)-term
// sums, of the gate cumsum and of the hardware exp2 (~2^-22 relative); measured <= 2.3e-6 rel RMS, 5e-6 max.
constexpr Tol kFp32{1e-5, 2e-5};
// bf16: every result is stored in bf16 (2^-9 relative rounding) and the tensor-core products take bf16 operands
// (q ⊙ e^G, k ⊙ e^{G_L − G}, A, the states) as fla's kernel does; the intra-chunk blocks below the diagonal (scores,
// and dq, dk from dA) take TF32 operands (2^-11), as fla's tl.dot on fp32 does. fla's test bound is 5e-3 relative
// RMS. Measured <= 2.8e-3 rel RMS, 4.3e-3 max with fp32 SIMT intra products; outputs <= 2.5e-3 rel RMS, 4.5e-3 max
// with the TF32 ones (the gradients pass the same bound; a TF32 trial of the gradients measured <= 2.7e-3 rel RMS).
constexpr Tol kBf16{5e-3, 1e-2};

}  // namespace hgrn::testing
