// allocator.h: raw memory for Storage. CPU memory is 64-byte aligned; CUDA memory comes from the CUDA backend
// (kernels/, built only when nvcc is found), and asking for it in a CPU-only build is a clear error.
#pragma once
#include <cstddef>

#include "core/tensor.h"

namespace hgrn {

void* device_alloc(size_t bytes, Device device);
void device_free(void* ptr, Device device);
// Copies bytes between any two devices (CPU<->CUDA, CUDA<->CUDA, CPU<->CPU).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
bool cuda_available();  // true when built with CUDA and a GPU is visible

}  // namespace hgrn
