// cuda_graph.cu: CudaGraph (cuda_graph.h): stream capture of the compute stream, instantiation and replay.
#include <atomic>

#include "cuda_check.h"
#include "cuda_context.h"
#include "cuda_graph.h"

namespace hgrn {

namespace {
std::atomic<bool> capture_active{false};
}

bool cuda_graph_capture_active() { return capture_active.load(); }

CudaGraph::~CudaGraph() {
  // Never throws: a failure to destroy only leaks.
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void CudaGraph::capture(const std::function<void()>& enqueue) {
  HGRN_CHECK(!captured(), "CudaGraph::capture: this graph was captured already");
  HGRN_CHECK(!capture_active.exchange(true), "CudaGraph::capture: another capture is under way");
  // Thread-local mode: a call in this thread that is unsafe during capture (a synchronising copy, cudaMalloc) fails
  // instead of silently breaking the graph; other threads are not affected.
  cudaError_t begun = cudaStreamBeginCapture(cuda_stream(), cudaStreamCaptureModeThreadLocal);
  if (begun != cudaSuccess) {
    capture_active = false;
    CUDA_CHECK(begun);
  }
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(cuda_stream(), &graph);  // ends the capture whatever state it is in
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a failed capture leaves its error behind: clear it so that later calls do not report it
    capture_active = false;
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(cuda_stream(), &graph);
  capture_active = false;
  CUDA_CHECK(ended);
  graph_ = graph;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  exec_ = exec;
}

void CudaGraph::replay() const {
  HGRN_CHECK(captured(), "CudaGraph::replay: nothing was captured");
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda_stream()));
}

}  // namespace hgrn
