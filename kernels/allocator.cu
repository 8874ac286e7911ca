// allocator.cu: the caching allocator behind Tensors on CUDA, and copies between devices.
// cudaMalloc/cudaFree synchronise the device and cost tens of microseconds, so memory is taken from the driver in
// segments and cut into blocks that are cached and handed out again (core/block_pool.h: best fit, split, merge);
// after the first training step the steady state allocates nothing from the driver. All work runs on the one
// compute stream (cuda_context.h), so a block freed on the host can be reused at once: any kernel still reading it
// was queued earlier on the same stream. Requests up to 1 MiB come from 2 MiB segments of their own (so that small
// tensors do not pin large segments); larger ones from segments of their own size rounded to 2 MiB. Blocks round to
// 512 bytes. On out-of-memory the wholly free segments go back to the driver and the request is retried once; if it
// still fails the error says how much was asked, in use and free, and which knobs lower the need.
// HGRN_POISON_CUDA_ALLOC=1 fills every block handed out with 0xFF bytes (NaN in fp32 and bf16), so that a kernel
// that leaves an output element unwritten shows up in tests.
// No block is handed out while a CUDA graph is being captured (cuda_graph.h).
// HGRN_MEMORY_REPORT=1 keeps, per trace range (the innermost one open when a block was asked for), the bytes live
// now and a copy of that table at each new high-water mark; at exit it prints the copy, with the bytes asked for
// beside the blocks that hold them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"
#include "core/block_pool.h"
#include "core/env_flag.h"
#include "core/trace.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "cuda_graph.h"
#include "host_staging.h"

namespace hgrn {

namespace {
// HGRN_MEMORY_REPORT's tables: per tag (a folded range name, or a block size within it), bytes asked for and held.
struct MemoryReport {
  struct Usage {
    size_t asked = 0, held = 0, blocks = 0;
  };
  std::map<std::string, Usage> live, at_peak;
  size_t peak_held = 0;

  void add(const std::string& tag, size_t asked, size_t held, int sign) {
    Usage& u = live[tag];
    u.asked += sign * asked;  // size_t wraps back exactly on the matching subtraction
    u.held += sign * held;
    u.blocks += sign;
  }
  void print() const {
    auto by_held = [](const auto& x, const auto& y) { return x.second.held > y.second.held; };
    std::vector<std::pair<std::string, Usage>> ranges;
    size_t asked = 0;
    for (const auto& [tag, u] : at_peak)
      if (u.blocks && tag.find(" | ") == std::string::npos) ranges.emplace_back(tag, u), asked += u.asked;
    std::sort(ranges.begin(), ranges.end(), by_held);
    std::fprintf(stderr,
                 "---- HGRN_MEMORY_REPORT: live at the high-water mark, %.3f GiB held for %.3f GiB asked ----\n"
                 "%10s %10s %7s  %s\n",
                 peak_held / 1073741824.0, asked / 1073741824.0, "held MiB", "asked MiB", "blocks",
                 "innermost range when asked (its largest block sizes below it)");
    for (const auto& [range, u] : ranges) {
      std::fprintf(stderr, "%10.1f %10.1f %7zu  %s\n", u.held / 1048576.0, u.asked / 1048576.0, u.blocks,
                   range.empty() ? "(outside any range)" : range.c_str());
      std::vector<std::pair<std::string, Usage>> sizes;
      for (auto it = at_peak.lower_bound(range + " | "); it != at_peak.end() && it->first.rfind(range + " | ", 0) == 0;
           ++it)
        if (it->second.blocks) sizes.emplace_back(it->first.substr(range.size() + 3), it->second);
      std::sort(sizes.begin(), sizes.end(), by_held);
      for (size_t i = 0; i < sizes.size() && i < 6; ++i)
        std::fprintf(stderr, "%10.1f %10.1f %7zu      %s each\n", sizes[i].second.held / 1048576.0,
                     sizes[i].second.asked / 1048576.0, sizes[i].second.blocks, sizes[i].first.c_str());
    }
  }
};

// cudaMalloc for a BlockPool: null when the device is out of memory (the error cleared, so that work can go on).
void* driver_segment(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  CUDA_CHECK(err);
  return p;
}
void driver_release(void* p) { CUDA_CHECK(cudaFree(p)); }

constexpr size_t kSmallRequest = 1u << 20, kSegmentGranule = 2u << 20;

struct CachingAllocator {
  struct Block {
    size_t size;   // what the block holds
    size_t asked;  // what the tensor asked for (which also says which pool the block came from)
    std::string tag;  // HGRN_MEMORY_REPORT only
  };
  std::mutex mutex;
  BlockPool small_pool{{512, kSegmentGranule, kSegmentGranule, 512}, driver_segment, driver_release};
  BlockPool large_pool{{512, 0, kSegmentGranule, kSmallRequest}, driver_segment, driver_release};
  std::unordered_map<void*, Block> live_blocks;
  CudaMemoryStats stats;
  bool poison = env_flag("HGRN_POISON_CUDA_ALLOC");
  MemoryReport* report = env_flag("HGRN_MEMORY_REPORT") ? new MemoryReport() : nullptr;  // never destroyed

  // Report bookkeeping for a block handed out (sign +1) or returned (-1); caller holds the mutex.
  void account(const Block& b, int sign) {
    if (!report) return;
    report->add(b.tag, b.asked, b.size, sign);
    report->add(b.tag + " | " + std::to_string(b.asked) + " B", b.asked, b.size, sign);
    if (sign > 0 && stats.in_use_bytes > report->peak_held) {
      report->peak_held = stats.in_use_bytes;
      report->at_peak = report->live;
    }
  }

  BlockPool& pool_for(size_t asked) { return asked <= kSmallRequest ? small_pool : large_pool; }

  // A block from the pool for this size, counting new segments; null when the driver has no memory left.
  void* take(BlockPool& pool, size_t bytes, size_t* held) {
    const size_t segments = pool.segment_count();
    void* p = pool.allocate(bytes, held);
    stats.driver_allocations += pool.segment_count() - segments;
    return p;
  }
  void update_reserved() { stats.reserved_bytes = small_pool.reserved_bytes() + large_pool.reserved_bytes(); }

  void release_cache() {  // caller holds the mutex
    cudaStreamSynchronize(cuda_stream());
    small_pool.release_free_segments();
    large_pool.release_free_segments();
    update_reserved();
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
  // A captured graph keeps the pointers it was captured with: a block handed out now would go back to the cache when
  // its tensor dies and be reused while the graph still writes it (cuda_graph.h).
  HGRN_CHECK(!cuda_graph_capture_active(), "GPU memory (", bytes, " bytes) asked for while a CUDA graph is being "
             "captured: everything a captured graph uses must be allocated before the capture");
  CachingAllocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  BlockPool& pool = a.pool_for(bytes);
  size_t held = 0;
  void* p = a.take(pool, bytes, &held);
  if (!p) {
    a.release_cache();
    p = a.take(pool, bytes, &held);
  }
  a.update_reserved();
  if (!p) {
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "CUDA out of memory: asked for %.1f MiB; hgrn tensors hold %.1f MiB, the device has %.1f MiB "
                  "free of %.1f MiB. Lower training.micro_batch_size (raise grad_accum_steps to keep the batch), "
                  "lower data.seq_len, or set model.memory.recompute: true",
                  bytes / 1048576.0, a.stats.in_use_bytes / 1048576.0, free_bytes / 1048576.0,
                  total_bytes / 1048576.0);
    throw Error(msg);
  }
  const CachingAllocator::Block& block = a.live_blocks[p] = {held, bytes,
                                                             a.report ? trace_innermost_range() : ""};
  a.stats.in_use_bytes += held;
  if (a.stats.in_use_bytes > a.stats.peak_in_use_bytes) a.stats.peak_in_use_bytes = a.stats.in_use_bytes;
  a.account(block, +1);
  if (a.poison) CUDA_CHECK(cudaMemsetAsync(p, 0xFF, held, cuda_stream()));
  return p;
}

void cuda_free(void* ptr) {
  if (!ptr) return;
  CachingAllocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mutex);
  auto it = a.live_blocks.find(ptr);
  if (it == a.live_blocks.end()) return;  // never throws from a destructor
  a.stats.in_use_bytes -= it->second.size;
  a.account(it->second, -1);
  a.pool_for(it->second.asked).free(ptr);
  a.live_blocks.erase(it);
}

bool cuda_memory_report_enabled() { return env_flag("HGRN_MEMORY_REPORT"); }

namespace {
// Prints HGRN_MEMORY_REPORT's table when the process ends (the allocator itself is never destroyed).
struct MemoryReportAtExit {
  ~MemoryReportAtExit() {
    if (allocator().report) allocator().report->print();
  }
} memory_report_at_exit;
}  // namespace

CudaMemoryStats cuda_memory_stats() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  return allocator().stats;
}

void cuda_reset_peak_memory() {
  std::lock_guard<std::mutex> lock(allocator().mutex);
  CachingAllocator& a = allocator();
  a.stats.peak_in_use_bytes = a.stats.in_use_bytes;
  if (a.report) a.report->peak_held = a.stats.in_use_bytes, a.report->at_peak = a.report->live;
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
  // An upload goes through pinned staging (no wait); a download is read by the caller at once, so it waits.
  if (kind == cudaMemcpyHostToDevice && cuda_staged_upload(dst, src, bytes)) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cuda_stream()));
  // Host memory may be pageable and reused by the caller right after return: finish copies that touch it.
  if (kind != cudaMemcpyDeviceToDevice) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

void cuda_copy_rows(void* dst, Device dst_device, size_t dst_pitch, const void* src, Device src_device,
                    size_t src_pitch, size_t row_bytes, size_t rows) {
  if (!row_bytes || !rows) return;
  cudaMemcpyKind kind = dst_device == Device::CUDA
                            ? (src_device == Device::CUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                            : cudaMemcpyDeviceToHost;
  if (kind == cudaMemcpyHostToDevice && cuda_staged_upload_rows(dst, dst_pitch, src, src_pitch, row_bytes, rows))
    return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, kind, cuda_stream()));
  if (kind != cudaMemcpyDeviceToDevice) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

void cuda_zero_rows(void* dst, size_t pitch, size_t row_bytes, size_t rows) {
  if (row_bytes && rows) CUDA_CHECK(cudaMemset2DAsync(dst, pitch, 0, row_bytes, rows, cuda_stream()));
}

}  // namespace hgrn
