// host_readback.h: device-to-host copies that the host collects later. Each is queued on the compute stream
// (cuda_context.h) into a slot of pinned host memory, with an event after it, so that the host can queue more work
// before it waits for the bytes: greedy decoding reads each step's choices while the GPU runs the next steps.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hgrn {

class HostReadback {
 public:
  // `slots` copies of at most slot_bytes each in flight at once.
  HostReadback(size_t slot_bytes, int slots);
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // Queues a copy of `bytes` from device memory `src`; returns its ticket (0, 1, …). Its slot is taken again by the
  // ticket `slots` later: collect it before queuing that one.
  int64_t queue(const void* src, size_t bytes);
  // Waits for the ticket's copy; its bytes, valid until its slot is taken again.
  const void* collect(int64_t ticket);

 private:
  size_t slot_bytes_;
  char* host_ = nullptr;       // slots × slot_bytes, pinned
  std::vector<void*> events_;  // cudaEvent_t, one a slot
  int64_t next_ticket_ = 0;
};

}  // namespace hgrn
