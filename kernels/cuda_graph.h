// cuda_graph.h: work queued on the compute stream (cuda_context.h) captured once into a CUDA graph and replayed as
// one launch, so that a sequence of small kernels costs the GPU's time alone rather than the host's launch of each.
// A graph replays the very pointers it was captured with: whatever it reads and writes must be allocated before the
// capture and stay allocated while it may be replayed. The caching allocator therefore refuses every request while
// a capture is under way (an hgrn::Error naming the cause), rather than hand out a block the graph would keep using
// after it went back to the cache.
#pragma once
#include <functional>

namespace hgrn {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Runs `enqueue`, which queues work on the compute stream, in capture mode and instantiates what it queued (the
  // work itself does not run). Anything enqueue throws ends the capture first, leaving the stream usable.
  void capture(const std::function<void()>& enqueue);
  bool captured() const { return exec_ != nullptr; }
  // Queues the captured work on the compute stream (asynchronous, as a kernel launch is).
  void replay() const;

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// True while a CudaGraph captures the compute stream (the allocator's guard).
bool cuda_graph_capture_active();

}  // namespace hgrn
