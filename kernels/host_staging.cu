// host_staging.cu: the pinned staging ring of host_staging.h. Uploads take aligned stretches of the ring in turn;
// each records an event after its copy, and a stretch is written again only once the copies that read it are done
// (usually long since: the ring holds many steps' uploads).
#include "host_staging.h"

#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "cuda_check.h"
#include "cuda_context.h"
#include "cuda_graph.h"

namespace hgrn {
namespace {

constexpr size_t kRingBytes = size_t{16} << 20;  // a step's uploads are well under this (a batch's ids: 128 KiB)
constexpr size_t kAlign = 256;

class StagingRing {
 public:
  // Copies `bytes` in through `fill(host_buffer)` and queues `upload(host_buffer)`; false where they do not fit.
  template <typename Fill, typename Upload>
  bool stage(size_t bytes, Fill fill, Upload upload) {
    if (bytes == 0 || bytes > kRingBytes || cuda_graph_capture_active()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!base_) CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&base_), kRingBytes, cudaHostAllocDefault));
    const size_t begin = reserve(bytes);
    char* host = base_ + begin;
    fill(host);
    upload(host);
    cudaEvent_t done = nullptr;
    if (spare_events_.empty()) {
      CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    } else {
      done = spare_events_.back();
      spare_events_.pop_back();
    }
    CUDA_CHECK(cudaEventRecord(done, cuda_stream()));
    pending_.push_back({begin, begin + bytes, done});
    return true;
  }

 private:
  struct Pending {
    size_t begin, end;  // the ring's bytes an upload still reads
    cudaEvent_t done;
  };

  void retire_oldest(bool wait) {
    if (wait) CUDA_CHECK(cudaEventSynchronize(pending_.front().done));
    spare_events_.push_back(pending_.front().done);
    pending_.pop_front();
  }

  // The start of `bytes` free bytes: after the last stretch taken, or from the ring's start where they would run
  // past its end; uploads still reading them are waited for, oldest first.
  size_t reserve(size_t bytes) {
    while (!pending_.empty()) {
      const cudaError_t state = cudaEventQuery(pending_.front().done);
      if (state == cudaErrorNotReady) {
        (void)cudaGetLastError();  // not an error: leave no trace for the next launch check
        break;
      }
      CUDA_CHECK(state);
      retire_oldest(false);
    }
    const size_t begin = head_ + bytes <= kRingBytes ? head_ : 0;
    const auto overlaps = [&] {
      for (const Pending& p : pending_)
        if (p.begin < begin + bytes && begin < p.end) return true;
      return false;
    };
    while (overlaps()) retire_oldest(true);
    head_ = (begin + bytes + kAlign - 1) / kAlign * kAlign;
    return begin;
  }

  std::mutex mutex_;
  char* base_ = nullptr;  // pinned, never freed (as the caching allocator's memory)
  size_t head_ = 0;
  std::deque<Pending> pending_;  // in the order queued, which is the ring's order
  std::vector<cudaEvent_t> spare_events_;
};

StagingRing& ring() {
  static StagingRing* r = new StagingRing();  // never destroyed (see cuda_context.cu)
  return *r;
}

}  // namespace

bool cuda_staged_upload(void* dst, const void* src, size_t bytes) {
  return ring().stage(
      bytes, [&](char* host) { std::memcpy(host, src, bytes); },
      [&](const char* host) {
        CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, cuda_stream()));
      });
}

bool cuda_staged_upload_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                             size_t rows) {
  return ring().stage(
      row_bytes * rows,
      [&](char* host) {
        for (size_t r = 0; r < rows; ++r)
          std::memcpy(host + r * row_bytes, static_cast<const char*>(src) + r * src_pitch, row_bytes);
      },
      [&](const char* host) {
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, host, row_bytes, row_bytes, rows, cudaMemcpyHostToDevice,
                                     cuda_stream()));
      });
}

}  // namespace hgrn
