// gpu_test.h: what every CUDA-op test uses: the skip (never a pass) without a GPU, copies to and from the GPU with
// a dtype, and the comparison against the CPU reference: relative RMS error and max abs error with the tolerances
// written at the call site, and a NaN/Inf in the GPU result that the reference does not have always fails.
// Device memory is poisoned (HGRN_POISON_CUDA_ALLOC=1, set by ctest), so unwritten output elements are NaN.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/allocator.h"
#include "core/tensor.h"

namespace hgrn::testing {

#define HGRN_SKIP_WITHOUT_GPU()                                                                           \
  do {                                                                                                    \
    if (!::hgrn::cuda_available())                                                                        \
      GTEST_SKIP() << "no GPU: this build has no CUDA backend or no device is visible (skipped, not passed)"; \
  } while (0)

// A copy of a CPU tensor on the GPU, converted to `dtype` (fp64/fp32 host values round to bf16 on the way).
inline Tensor to_gpu(const Tensor& host, DType dtype) {
  Tensor staged = host.dtype() == dtype ? host : host.to(dtype);
  return staged.to(Device::CUDA);
}
// A CPU fp64 copy of any tensor (for comparisons).
inline Tensor to_host_f64(const Tensor& t) {
  Tensor host = t.device() == Device::CPU ? t : t.to(Device::CPU);
  return host.dtype() == DType::F64 ? host : host.to(DType::F64);
}
// The values a bf16 GPU run actually sees: the reference should be computed from these, not the unrounded ones.
inline Tensor round_through(const Tensor& host, DType dtype) {
  return dtype == host.dtype() ? host.clone() : host.to(dtype).to(host.dtype());
}

struct Discrepancy {
  double rel_rms = 0;    // ||got - want||_2 / ||want||_2 (fla's metric)
  double max_abs = 0;    // max |got - want|
  int64_t non_finite = 0;  // elements finite in want but NaN/Inf in got
};

inline Discrepancy compare(const Tensor& got, const Tensor& want) {
  Tensor g = to_host_f64(got), w = to_host_f64(want);
  Discrepancy d;
  double num = 0, den = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const double a = g.item(i), b = w.item(i);
    if (!std::isfinite(a)) {
      if (std::isfinite(b)) ++d.non_finite;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
    d.max_abs = std::max(d.max_abs, std::fabs(a - b));
  }
  d.rel_rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

// Fails (with the numbers) unless got matches want: same shape, no new NaN/Inf, rel RMS <= rel_rms_tol and
// max abs <= max_abs_tol. Returns the discrepancy for tests that print it.
inline Discrepancy expect_close(const Tensor& got, const Tensor& want, double rel_rms_tol, double max_abs_tol,
                                const std::string& what) {
  EXPECT_EQ(shape_str(got.shape()), shape_str(want.shape())) << what;
  if (got.shape() != want.shape()) return {};
  Discrepancy d = compare(got, want);
  EXPECT_EQ(d.non_finite, 0) << what << ": NaN/Inf (or unwritten, poisoned) elements in the GPU result";
  EXPECT_LE(d.rel_rms, rel_rms_tol) << what << ": relative RMS error (max abs " << d.max_abs << ")";
  EXPECT_LE(d.max_abs, max_abs_tol) << what << ": max abs error (relative RMS " << d.rel_rms << ")";
  return d;
}

// Host tensors of one shape but the last axis side by side along it: the parent of split_columns' blocks.
inline Tensor concat_columns(const std::vector<Tensor>& parts) {
  Shape shape = parts.at(0).shape();
  shape.back() = 0;
  for (const Tensor& p : parts) shape.back() += p.size(-1);
  Tensor out = Tensor::empty(shape, parts[0].dtype());
  int64_t col = 0;
  for (const Tensor& p : parts) {
    out.columns(col, p.size(-1)).copy_from(p);
    col += p.size(-1);
  }
  return out;
}

}  // namespace hgrn::testing
