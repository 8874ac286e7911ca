// host_readback.cu: the pinned slots and events of host_readback.h.
#include "host_readback.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/check.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace hgrn {

HostReadback::HostReadback(size_t slot_bytes, int slots) : slot_bytes_(slot_bytes) {
  HGRN_CHECK(slot_bytes > 0 && slots > 0, "host readback: ", slots, " slots of ", slot_bytes, " bytes");
  CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), slot_bytes * static_cast<size_t>(slots),
                           cudaHostAllocDefault));
  for (int i = 0; i < slots; ++i) {
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    events_.push_back(event);
  }
}

HostReadback::~HostReadback() {
  for (void* event : events_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(event));  // no copy may land in freed memory
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  cudaFreeHost(host_);
}

int64_t HostReadback::queue(const void* src, size_t bytes) {
  HGRN_CHECK(bytes <= slot_bytes_, "host readback: ", bytes, " bytes for slots of ", slot_bytes_);
  const int64_t ticket = next_ticket_++;
  const size_t slot = static_cast<size_t>(ticket % static_cast<int64_t>(events_.size()));
  CUDA_CHECK(cudaMemcpyAsync(host_ + slot * slot_bytes_, src, bytes, cudaMemcpyDeviceToHost, cuda_stream()));
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), cuda_stream()));
  return ticket;
}

const void* HostReadback::collect(int64_t ticket) {
  const int64_t slots = static_cast<int64_t>(events_.size());
  HGRN_CHECK(ticket >= 0 && ticket < next_ticket_ && ticket >= next_ticket_ - slots, "host readback: ticket ",
             ticket, " is not in flight (tickets ", std::max<int64_t>(0, next_ticket_ - slots), " to ",
             next_ticket_ - 1, " are)");
  const size_t slot = static_cast<size_t>(ticket % slots);
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[slot])));
  return host_ + slot * slot_bytes_;
}

}  // namespace hgrn
