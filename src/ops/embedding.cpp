// embedding.cpp: embedding lookup forward (row gather) and backward (scatter-add into the weight gradient); the CPU
// reference here, the GPU kernels in kernels/embedding.cu.
#include "ops/embedding.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "ops/cpu_parallel.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/embedding.h"
#endif

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

// Checks each id lies in [0, vocab): one branch-free pass over them (it vectorises), then, only where one is out of
// range, a second that names the first.
template <typename I>
static void check_ids(const I* ids, int64_t n, int64_t vocab) {
  const uint64_t limit = static_cast<uint64_t>(vocab);
  bool bad = false;  // a negative id cast to unsigned exceeds any vocabulary
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint64_t>(static_cast<int64_t>(ids[i])) >= limit;
  if (!bad) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    HGRN_CHECK(id >= 0 && id < vocab, "embedding: id ", id, " at position ", i, " is out of range for vocab size ",
               vocab);
  }
}

// The same for a contiguous int32 or int64 host tensor.
static void check_ids(const Tensor& ids, int64_t vocab) {
  if (ids.dtype() == DType::I32)
    check_ids(ids.data<int32_t>(), ids.numel(), vocab);
  else
    check_ids(ids.data<int64_t>(), ids.numel(), vocab);
}

// The ids of a contiguous int32 or int64 host tensor as int64, checked.
static std::vector<int64_t> checked_ids(const Tensor& ids, int64_t vocab) {
  check_ids(ids, vocab);
  const int64_t n = ids.numel();
  return ids.dtype() == DType::I32 ? std::vector<int64_t>(ids.data<int32_t>(), ids.data<int32_t>() + n)
                                   : std::vector<int64_t>(ids.data<int64_t>(), ids.data<int64_t>() + n);
}

// What the backward needs: on the CPU the checked ids; on the GPU the ids, which it sorts into (id, position) pairs
// and each distinct id's run (embedding.h) there rather than in the forward: the sort's host work (cub's dispatch)
// would hold up the step's first kernels, while by the backward the host is well ahead of the GPU.
struct EmbeddingSaved {
  std::vector<int64_t> cpu_ids;
  Tensor gpu_ids;
};

Var embedding(Tape& tape, const Var& weight, const Tensor& given_ids, DType out_dtype) {
  HGRN_CHECK(weight, "embedding: weight is null");
  const Tensor& wv = weight->value;
  HGRN_CHECK(wv.dim() == 2, "embedding: weight must be [Vocab, D], got ", shape_str(wv.shape()));
  HGRN_CHECK(wv.is_contiguous(), "embedding: weight must be contiguous");
  // Host ids for a GPU weight are uploaded here, and contiguous ones are checked on the host first: the GPU's check
  // and the wait for its answer are skipped.
  const bool host_ids = given_ids.defined() && given_ids.device() == Device::CPU && wv.device() == Device::CUDA;
  const bool checked_on_host = host_ids && given_ids.is_contiguous() &&
                               (given_ids.dtype() == DType::I32 || given_ids.dtype() == DType::I64);
  if (checked_on_host) check_ids(given_ids, wv.size(0));
  const Tensor ids = host_ids ? on_device(given_ids, Device::CUDA) : given_ids;
  HGRN_CHECK(ids.defined() && (ids.dtype() == DType::I32 || ids.dtype() == DType::I64),
             "embedding: ids must be int32 or int64, got ", ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  HGRN_CHECK(ids.device() == wv.device() && ids.is_contiguous(), "embedding: ids must be a contiguous ",
             device_name(wv.device()), " tensor (the weight's device), got one on ", device_name(ids.device()));
  const Device device = wv.device();
  const int64_t vocab = wv.size(0), width = wv.size(1), rows = ids.numel();
  Shape out_shape = ids.shape();
  out_shape.push_back(width);
  auto saved = std::make_shared<EmbeddingSaved>();
  Tensor y;

  if (device == Device::CPU) {
    HGRN_CHECK(out_dtype == wv.dtype(), "embedding: on the CPU the output dtype (", dtype_name(out_dtype),
               ") must be the weight's (", dtype_name(wv.dtype()), ")");
    saved->cpu_ids = checked_ids(ids, vocab);
    y = Tensor::empty(out_shape, wv.dtype());
    HGRN_DISPATCH_FLOAT(wv.dtype(), "embedding", [&] {
      embedding_forward_cpu(wv.data<scalar_t>(), saved->cpu_ids.data(), y.data<scalar_t>(), rows, width);
    });
  } else {
#ifdef HGRN_WITH_CUDA
    HGRN_CHECK(wv.dtype() == DType::F32, "embedding: a GPU weight is a parameter and must be fp32, got ",
               dtype_name(wv.dtype()));
    HGRN_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16,
               "embedding: GPU activations are fp32 or bf16, asked for ", dtype_name(out_dtype));
    if (!checked_on_host) {
      Tensor scratch = Tensor::empty({1}, DType::I64, Device::CUDA);
      int64_t bad_id = 0;
      const int64_t bad_position = embedding_check_ids_cuda(ids.raw_data(), ids.dtype(), rows, vocab,
                                                            scratch.raw_data(), &bad_id);
      HGRN_CHECK(bad_position < 0, "embedding: id ", bad_id, " at position ", bad_position,
                 " is out of range for vocab size ", vocab);
    }
    y = Tensor::empty(out_shape, out_dtype, Device::CUDA);
    embedding_forward_cuda(wv.data<float>(), ids.raw_data(), ids.dtype(), y.raw_data(), out_dtype, rows, width);
#else
    throw Error("embedding: this hgrn was built without CUDA");
#endif
  }

  Var out = op_output(tape, y, {weight});
  if (!out->requires_grad) return out;
  // The caller's own device ids are copied: it may write them again before the backward.
  if (device == Device::CUDA) saved->gpu_ids = host_ids ? ids : ids.clone();
  tape.record([weight, out, saved, rows, vocab, width] {
    if (!out->grad.defined()) return;
    const Tensor& dy = out->grad;
    if (dy.device() == Device::CPU) {
      HGRN_DISPATCH_FLOAT(dy.dtype(), "embedding backward", [&] {
        embedding_backward_cpu(dy.data<scalar_t>(), saved->cpu_ids.data(), grad_buffer(weight).data<scalar_t>(),
                               rows, width);
      });
      return;
    }
#ifdef HGRN_WITH_CUDA
    const Tensor sorted_ids = Tensor::empty({rows}, DType::I32, Device::CUDA),
                 sorted_pos = Tensor::empty({rows}, DType::I32, Device::CUDA),
                 segment_start = Tensor::empty({rows}, DType::I32, Device::CUDA),
                 num_segments = Tensor::empty({1}, DType::I32, Device::CUDA);
    {
      const size_t sort_bytes = embedding_sort_workspace_bytes(rows, vocab);
      const Tensor sort_workspace =
          Tensor::empty({static_cast<int64_t>((sort_bytes + 3) / 4)}, DType::I32, Device::CUDA);
      embedding_sort_cuda(saved->gpu_ids.raw_data(), saved->gpu_ids.dtype(), rows, vocab, sorted_ids.data<int32_t>(),
                          sorted_pos.data<int32_t>(), segment_start.data<int32_t>(), num_segments.data<int32_t>(),
                          sort_workspace.raw_data(), sort_bytes);
    }
    const size_t workspace_bytes = embedding_backward_workspace_bytes(rows, width);
    Tensor workspace = Tensor::empty({static_cast<int64_t>(workspace_bytes / 4)}, DType::F32, Device::CUDA);
    embedding_backward_cuda(dy.raw_data(), dy.dtype(), sorted_ids.data<int32_t>(), sorted_pos.data<int32_t>(),
                            segment_start.data<int32_t>(), num_segments.data<int32_t>(),
                            grad_buffer(weight).data<float>(), rows, vocab, width, workspace.raw_data(),
                            workspace_bytes);
#else
    throw Error("embedding: this hgrn was built without CUDA");
#endif
  });
  return out;
}

Var embedding(Tape& tape, const Var& weight, const Tensor& ids) {
  HGRN_CHECK(weight, "embedding: weight is null");
  return embedding(tape, weight, ids, weight->value.dtype());
}

void embedding_lookup_into(const Tensor& weight, const Tensor& ids, Tensor& y) {
  HGRN_CHECK(weight.dim() == 2 && weight.is_contiguous(), "embedding: weight must be a contiguous [Vocab, D], got ",
             shape_str(weight.shape()));
  HGRN_CHECK(ids.defined() && (ids.dtype() == DType::I32 || ids.dtype() == DType::I64) && ids.is_contiguous() &&
                 ids.device() == weight.device(),
             "embedding: ids must be contiguous int32 or int64 on the weight's device");
  const int64_t vocab = weight.size(0), width = weight.size(1), rows = ids.numel();
  Shape out_shape = ids.shape();
  out_shape.push_back(width);
  HGRN_CHECK(y.shape() == out_shape && y.is_contiguous() && y.device() == weight.device(),
             "embedding: the output buffer ", shape_str(y.shape()), " does not match ", shape_str(out_shape));
  if (weight.device() == Device::CPU) {
    HGRN_CHECK(y.dtype() == weight.dtype(), "embedding: on the CPU the output dtype (", dtype_name(y.dtype()),
               ") must be the weight's (", dtype_name(weight.dtype()), ")");
    const std::vector<int64_t> checked = checked_ids(ids, vocab);
    HGRN_DISPATCH_FLOAT(weight.dtype(), "embedding", [&] {
      embedding_forward_cpu(weight.data<scalar_t>(), checked.data(), y.data<scalar_t>(), rows, width);
    });
    return;
  }
#ifdef HGRN_WITH_CUDA
  HGRN_CHECK(weight.dtype() == DType::F32, "embedding: a GPU weight is a parameter and must be fp32, got ",
             dtype_name(weight.dtype()));
  HGRN_CHECK(y.dtype() == DType::F32 || y.dtype() == DType::BF16,
             "embedding: GPU activations are fp32 or bf16, asked for ", dtype_name(y.dtype()));
  embedding_forward_cuda(weight.data<float>(), ids.raw_data(), ids.dtype(), y.raw_data(), y.dtype(), rows, width);
#else
  throw Error("embedding: this hgrn was built without CUDA");
#endif
}

}  // namespace hgrn
