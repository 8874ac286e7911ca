// allocator.cu: device memory for Tensors on CUDA (plain cudaMalloc/cudaFree for now) and copies between devices.
// An out-of-memory failure reports how much was asked for and how much the device has free.
#include <cstdio>

#include "core/allocator.h"
#include "cuda_check.h"

namespace hgrn {

bool cuda_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

void* cuda_alloc(size_t bytes) {
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky error so the caller can recover
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "CUDA out of memory: asked for %.1f MiB with %.1f MiB free of %.1f MiB; reduce "
                  "training.micro_batch_size or data.seq_len",
                  bytes / 1048576.0, free_bytes / 1048576.0, total_bytes / 1048576.0);
    throw Error(msg);
  }
  CUDA_CHECK(err);
  return p;
}

void cuda_free(void* ptr) {
  if (ptr) cudaFree(ptr);  // never throws from a destructor; a failure here means the context is already gone
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  cudaMemcpyKind kind = dst_device == Device::CUDA
                            ? (src_device == Device::CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                            : cudaMemcpyDeviceToHost;
  if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
}

}  // namespace hgrn
