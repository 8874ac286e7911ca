// embedding.cpp: embedding lookup forward (row gather) and backward (scatter-add into the weight gradient).
#include "ops/embedding.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "ops/cpu_parallel.h"

namespace hgrn {

// The backward splits the D columns into blocks of this many; each block is owned by one thread, which visits
// the rows in order, so repeated ids accumulate in the same order on every run.
static constexpr int64_t kColumnsPerBlock = 64;

template <typename T>
static void embedding_forward_cpu(const T* weight, const int64_t* ids, T* y, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(y + r * width, weight + ids[r] * width, static_cast<size_t>(width) * sizeof(T));
}

template <typename T>
static void embedding_backward_cpu(const T* dy, const int64_t* ids, T* dweight, int64_t rows, int64_t width) {
  const int64_t blocks = (width + kColumnsPerBlock - 1) / kColumnsPerBlock;
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColumnsPerBlock, c1 = std::min(width, c0 + kColumnsPerBlock);
    for (int64_t r = 0; r < rows; ++r) {
      const T* src = dy + r * width;
      T* dst = dweight + ids[r] * width;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

// Copies the ids to int64 and checks each lies in [0, vocab).
template <typename I>
static std::vector<int64_t> checked_ids(const I* ids, int64_t n, int64_t vocab) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    HGRN_CHECK(id >= 0 && id < vocab, "embedding: id ", id, " at position ", i, " is out of range for vocab size ",
               vocab);
    out[static_cast<size_t>(i)] = id;
  }
  return out;
}

Var embedding(Tape& tape, const Var& weight, const Tensor& ids) {
  HGRN_CHECK(weight, "embedding: weight is null");
  const Tensor& wv = weight->value;
  HGRN_CHECK(wv.dim() == 2, "embedding: weight must be [Vocab, D], got ", shape_str(wv.shape()));
  HGRN_CHECK(wv.device() == Device::CPU && wv.is_contiguous(), "embedding: weight must be a contiguous CPU tensor");
  HGRN_CHECK(ids.defined() && (ids.dtype() == DType::I32 || ids.dtype() == DType::I64),
             "embedding: ids must be int32 or int64, got ", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  HGRN_CHECK(ids.device() == Device::CPU && ids.is_contiguous(), "embedding: ids must be a contiguous CPU tensor");
  const int64_t vocab = wv.size(0), width = wv.size(1), rows = ids.numel();

  auto flat_ids = std::make_shared<const std::vector<int64_t>>(
      ids.dtype() == DType::I32 ? checked_ids(ids.data<int32_t>(), rows, vocab)
                                : checked_ids(ids.data<int64_t>(), rows, vocab));

  Shape out_shape = ids.shape();
  out_shape.push_back(width);
  Tensor y = Tensor::empty(out_shape, wv.dtype());
  HGRN_DISPATCH_FLOAT(wv.dtype(), "embedding", [&] {
    embedding_forward_cpu(wv.data<scalar_t>(), flat_ids->data(), y.data<scalar_t>(), rows, width);
  });
  Var out = op_output(tape, y, {weight});
  if (!out->requires_grad) return out;
  tape.record([weight, out, flat_ids, rows, width] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "embedding backward", [&] {
      embedding_backward_cpu(out->grad.data<scalar_t>(), flat_ids->data(), grad_buffer(weight).data<scalar_t>(), rows,
                             width);
    });
  });
  return out;
}

}  // namespace hgrn
