// row_argmax.cpp: the CPU reference of row_argmax and the dispatch to the GPU kernel (kernels/row_argmax.h).
#include "ops/row_argmax.h"

#include <cmath>
#include <limits>

#ifdef HGRN_WITH_CUDA
#include "kernels/row_argmax.h"
#endif

namespace hgrn {

template <typename T>
static void row_argmax_cpu(const T* x, int64_t rows, int64_t stride, int64_t limit, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * stride;
    int64_t best = -1;
    for (int64_t c = 0; c < limit; ++c)
      if (!std::isnan(row[c]) && (best < 0 || row[c] > row[best])) best = c;
    out[r] = static_cast<int32_t>(best < 0 ? 0 : best);
  }
}

void row_argmax(const Tensor& x, int64_t limit, Tensor& out) {
  HGRN_CHECK(x.dim() == 2 && x.is_row_strided(), "row_argmax: x must be a row-strided [rows, n], got ",
             shape_str(x.shape()));
  const int64_t rows = x.size(0), n = x.size(1);
  HGRN_CHECK(limit > 0 && limit <= n && limit <= std::numeric_limits<int32_t>::max(), "row_argmax: limit ", limit,
             " out of range for rows of ", n);
  HGRN_CHECK(out.dtype() == DType::I32 && out.numel() == rows && out.is_contiguous() && out.device() == x.device(),
             "row_argmax: out must be ", rows, " contiguous int32 on ", device_name(x.device()));
  if (rows == 0) return;
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_row_argmax(x.raw_data(), x.dtype(), rows, x.row_stride(), limit, out.data<int32_t>());
    return;
#else
    throw Error("row_argmax: this hgrn was built without CUDA");
#endif
  }
  HGRN_DISPATCH_FLOAT(x.dtype(), "row_argmax", [&] {
    row_argmax_cpu(x.data<scalar_t>(), rows, x.row_stride(), limit, out.data<int32_t>());
  });
}

}  // namespace hgrn
