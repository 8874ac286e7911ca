// sequence_resets.cpp: checking the reset flags, and their per-chunk masks for the GPU kernels.
#include "ops/sequence_resets.h"

#include "core/check.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/sequence_resets.h"
#endif

namespace hgrn {

void check_resets(const Tensor& resets, int64_t batch, int64_t time, Device device, const char* op) {
  if (!resets.defined()) return;
  HGRN_CHECK(resets.dtype() == DType::I32 && resets.dim() == 2 && resets.size(0) == batch && resets.size(1) == time,
             op, ": resets must be int32 [", batch, ", ", time, "] (one flag per sequence and step), got ",
             dtype_name(resets.dtype()), " ", shape_str(resets.shape()));
  HGRN_CHECK(resets.device() == device, op, ": resets are on ", device_name(resets.device()), ", the inputs on ",
             device_name(device));
  HGRN_CHECK(resets.is_contiguous(), op, ": resets must be contiguous");
}

Tensor reset_chunk_masks(const Tensor& resets) {
  if (!resets.defined()) return Tensor();
  HGRN_CHECK(resets.device() == Device::CUDA, "reset_chunk_masks: the flags must be on the GPU");
#ifdef HGRN_WITH_CUDA
  const int64_t batch = resets.size(0), time = resets.size(1);
  Tensor masks = Tensor::empty({batch, reset_chunk_count(time)}, DType::I64, Device::CUDA);
  reset_chunk_masks_cuda(resets.data<int32_t>(), batch, time, reinterpret_cast<uint64_t*>(masks.data<int64_t>()));
  return masks;
#else
  throw Error("reset_chunk_masks: this hgrn was built without CUDA");
#endif
}

}  // namespace hgrn
