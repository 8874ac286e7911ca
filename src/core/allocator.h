// allocator.h: raw memory for Storage. CPU memory is 64-byte aligned; CUDA memory comes from the CUDA backend
// (kernels/, built only when nvcc is found), and asking for it in a CPU-only build is a clear error.
#pragma once
#include <cstddef>
#include <string>

#include "core/tensor.h"

namespace hgrn {

void* device_alloc(size_t bytes, Device device);
void device_free(void* ptr, Device device);
// Copies bytes between any two devices (CPU<->CUDA, CUDA<->CUDA, CPU<->CPU).
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// `rows` rows of `row_bytes` each, `dst_pitch` and `src_pitch` bytes apart (row-strided tensors; on the GPU one
// 2-D copy); and the zeroing of such rows.
void device_copy_rows(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device,
                      size_t src_pitch, size_t row_bytes, size_t rows);
void device_zero_rows(void* dst, Device device, size_t pitch, size_t row_bytes, size_t rows);
bool cuda_available();  // true when built with CUDA and a GPU is visible
int cuda_device_count();  // GPUs visible to this process (0 in a CPU-only build)
// One process per GPU: binds this process to visible GPU `index`. Must come before any other GPU use (an Error
// otherwise, since the compute stream and cuBLAS handle belong to the device they were made on).
void cuda_use_device(int index);

// The CUDA caching allocator's counters (kernels/allocator.cu); all zero in a CPU-only build.
struct CudaMemoryStats {
  size_t in_use_bytes = 0;       // held by live tensors
  size_t peak_in_use_bytes = 0;  // high-water mark of in_use_bytes since the last reset
  size_t reserved_bytes = 0;     // obtained from the driver (in use + cached)
  size_t driver_allocations = 0; // cudaMalloc calls so far (flat after warm-up in a steady training loop)
};
CudaMemoryStats cuda_memory_stats();
void cuda_reset_peak_memory();
// HGRN_MEMORY_REPORT=1: the CUDA allocator tags every block with the innermost trace range open when it was asked for
// (trace_innermost_range) and, at exit, prints to stderr what was live at the high-water mark, by range and size:
// which activations a step keeps, and how much the caching allocator's rounding and block reuse add to them.
bool cuda_memory_report_enabled();
void cuda_release_cached_memory();
// Waits for all queued GPU work (a no-op in a CPU-only build); timings and host reads of results need it.
void device_synchronize();
std::string cuda_device_name();  // the GPU's name ("" in a CPU-only build)

}  // namespace hgrn
