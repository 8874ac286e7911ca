// allocator.cpp: CPU allocation, and the CPU-only stand-ins for the CUDA allocator (real one: kernels/allocator.cu).
#include "core/allocator.h"

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>

namespace hgrn {

#ifndef HGRN_WITH_CUDA
static void* cuda_alloc(size_t) { throw Error("this hgrn was built without CUDA: use device: cpu"); }
static void cuda_free(void*) {}
static void cuda_copy(void*, Device, const void*, Device, size_t) {
  throw Error("this hgrn was built without CUDA: use device: cpu");
}
static void cuda_copy_rows(void*, Device, size_t, const void*, Device, size_t, size_t, size_t) {
  throw Error("this hgrn was built without CUDA: use device: cpu");
}
static void cuda_zero_rows(void*, size_t, size_t, size_t) {
  throw Error("this hgrn was built without CUDA: use device: cpu");
}
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
void cuda_use_device(int) { throw Error("this hgrn was built without CUDA: use device: cpu"); }
CudaMemoryStats cuda_memory_stats() { return {}; }
void cuda_reset_peak_memory() {}
bool cuda_memory_report_enabled() { return false; }
void cuda_release_cached_memory() {}
void device_synchronize() {}
std::string cuda_device_name() { return ""; }
#else
void* cuda_alloc(size_t bytes);  // kernels/allocator.cu
void cuda_free(void* ptr);
void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
void cuda_copy_rows(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device,
                    size_t src_pitch, size_t row_bytes, size_t rows);
void cuda_zero_rows(void* dst, size_t pitch, size_t row_bytes, size_t rows);
#endif

// A training step frees and allocates the same activation and gradient buffers again. glibc by default serves large
// blocks with fresh mmaps and hands the top of its heap back to the kernel once enough of it is free, so that every
// step faults its buffers in again and the kernel zeroes every page (a tenth of a small model's step). Blocks up to
// glibc's largest mmap threshold (32 MiB) come from the heap instead, which keeps what was freed for the next step.
static void keep_freed_host_memory() {
  constexpr int kHeapBlockLimit = 32 << 20;
  mallopt(M_MMAP_THRESHOLD, kHeapBlockLimit);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

void* device_alloc(size_t bytes, Device device) {
  if (device == Device::CUDA) return cuda_alloc(bytes);
  static const bool heap_configured = (keep_freed_host_memory(), true);
  (void)heap_configured;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw Error("out of host memory: could not allocate " + std::to_string(bytes) + " bytes");
  return p;
}

void device_free(void* ptr, Device device) {
  if (device == Device::CUDA) return cuda_free(ptr);
  std::free(ptr);
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    if (bytes) std::memcpy(dst, src, bytes);
    return;
  }
  cuda_copy(dst, dst_device, src, src_device, bytes);
}

void device_copy_rows(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device,
                      size_t src_pitch, size_t row_bytes, size_t rows) {
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    for (size_t r = 0; r < rows; ++r)
      if (row_bytes)
        std::memcpy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
    return;
  }
  cuda_copy_rows(dst, dst_device, dst_pitch, src, src_device, src_pitch, row_bytes, rows);
}

void device_zero_rows(void* dst, Device device, size_t pitch, size_t row_bytes, size_t rows) {
  if (device == Device::CPU) {
    for (size_t r = 0; r < rows; ++r)
      if (row_bytes) std::memset(static_cast<char*>(dst) + r * pitch, 0, row_bytes);
    return;
  }
  cuda_zero_rows(dst, pitch, row_bytes, rows);
}

}  // namespace hgrn
