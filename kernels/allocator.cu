// allocator.cu: the caching allocator behind Tensors on CUDA, and copies between devices.
// cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so freed blocks go to a free list keyed
// by their rounded size and are handed out again; after the first training step the steady state allocates nothing
// from the driver. All work runs on the one compute stream (cuda_context.h), so a block freed on the host can be
// reused at once: any kernel still reading it was queued earlier on the same stream.
// Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, which bounds waste while keeping reuse likely.
// On out-of-memory the cache is released to the driver and the allocation retried once; if it still fails the
// error says how much was asked, in use and free, and which knobs lower the need.
// HGRN_POISON_CUDA_ALLOC=1 fills every block handed out with 0xFF bytes (NaN in fp32 and bf16), so that a kernel
// that leaves an output element unwritten shows up in tests.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace hgrn {

namespace {
struct CachingAllocator {
  std::mutex mutex;
  std::multimap<size_t, void*> free_blocks;     // rounded size -> block
  std::unordered_map<void*, size_t> live_blocks;  // block -> rounded size
  CudaMemoryStats stats;
  bool poison = [] {
    const char* v = std::getenv("HGRN_POISON_CUDA_ALLOC");
    return v && *v && std::string(v) != "0";
  }();

  static size_t round_size(size_t bytes) {
    if (bytes == 0) bytes = 1;
    const size_t unit = bytes < (1u << 20) ? 512 : (2u << 20);
    return (bytes + unit - 1) / unit * unit;
  }

  void release_cache() {  // caller holds the mutex
    if (free_blocks.empty()) return;
    cudaStreamSynchronize(cuda_stream());
    for (auto& [size, ptr] : free_blocks) {
      cudaFree(ptr);
      stats.reserved_bytes -= size;
    }
    free_blocks.clear();
  }
};
CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed (see cuda_context.cu)
  return *a;
}
}  // namespace

bool cuda_available() { return cuda_device_count() > 0; }

int cuda_device_count() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

void* cuda_alloc(size_t bytes) {
  CachingAllocator& a = allocator();
  const size_t size = CachingAllocator::round_size(bytes);
  std::lock_guard<std::mutex> lock(a.mutex);
  void* p = nullptr;
  // Best fit among cached blocks no more than 2x the request (a huge block is not spent on a tiny tensor).
  auto it = a.free_blocks.lower_bound(size);
  if (it != a.free_blocks.end() && it->first <= 2 * size) {
    p = it->second;
    a.live_blocks[p] = it->first;
    a.stats.in_use_bytes += it->first;
    a.free_blocks.erase(it);
  } else {
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error so that the retry (and the caller) can go on
      a.release_cache();
      err = cudaMalloc(&p, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "CUDA out of memory: asked for %.1f MiB; hgrn tensors hold %.1f MiB, the device has %.1f MiB "
                    "free of %.1f MiB. Lower training.micro_batch_size (raise grad_accum_steps to keep the batch), "
                    "lower data.seq_len, or set training.recompute: true",
                    bytes / 1048576.0, a.stats.in_use_bytes / 1048576.0, free_bytes / 1048576.0,
                    total_bytes / 1048576.0);
      throw Error(msg);
    }
    CUDA_CHECK(err);
    a.live_blocks[p] = size;
    a.stats.in_use_bytes += size;
    a.stats.reserved_bytes += size;
    a.stats.driver_allocations += 1;
  }
  if (a.stats.in_use_bytes > a.stats.peak_in_use_bytes) a.stats.peak_in_use_bytes = a.stats.in_use_bytes;
  if (a.poison) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, size, cuda_stream()));
  return p;
}

void cuda_free(void* ptr) {
  if (!ptr) return;
  CachingAllocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  auto it = a.live_blocks.find(ptr);
  if (it == a.live_blocks.end()) return;  // never throws from a destructor
  a.stats.in_use_bytes -= it->second;
  a.free_blocks.emplace(it->second, ptr);
  a.live_blocks.erase(it);
}

CudaMemoryStats cuda_memory_stats() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  return allocator().stats;
}

void cuda_reset_peak_memory() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  allocator().stats.peak_in_use_bytes = allocator().stats.in_use_bytes;
}

void cuda_release_cached_memory() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  allocator().release_cache();
}

void cuda_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (!bytes) return;
  cudaMemcpyKind kind = dst_device == Device::CUDA
                            ? (src_device == Device::CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                            : cudaMemcpyDeviceToHost;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cuda_stream()));
  // Host memory may be pageable and reused by the caller right after return: finish copies that touch it.
  if (kind != cudaMemcpyDeviceToDevice) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

}  // namespace hgrn
