// nccl_collectives.cpp: collectives.h between GPUs, through NCCL. The communicator is bootstrapped through MPI
// (rank 0 makes the unique id and broadcasts it). Collectives run on a communication stream of their own (the
// device's highest priority, so that they start as soon as their inputs are ready) after an event on the compute
// stream, which lets the gradient reduction of one layer overlap the backward of the layers before it. wait()
// polls inside a PeerWait (world.h: the watchdog bounds it) and checks NCCL's asynchronous error state.
#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "core/check.h"
#include "dist/collectives.h"
#include "dist/world.h"

#ifdef HGRN_WITH_NCCL
#include <nccl.h>

#include "dist/mpi_check.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_context.h"

#define NCCL_CHECK(call)                                                                                           \
  do {                                                                                                             \
    ncclResult_t rc_ = (call);                                                                                     \
    if (rc_ != ncclSuccess && rc_ != ncclInProgress)                                                               \
      throw ::hgrn::Error(::hgrn::detail::concat("NCCL error on rank ", ::hgrn::world().rank, " in ", #call, ": ", \
                                                 ncclGetErrorString(rc_), " [", __FILE__, ":", __LINE__,           \
                                                 "]; NCCL_DEBUG=WARN shows NCCL's own diagnosis"));                \
  } while (0)
#endif

namespace hgrn {

#ifdef HGRN_WITH_NCCL
namespace {

ncclDataType_t nccl_type(DType dtype) {
  HGRN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "NCCL sums fp32 or bf16, not ", dtype_name(dtype));
  return dtype == DType::F32 ? ncclFloat : ncclBfloat16;
}

class NcclCollectives : public Collectives {
 public:
  NcclCollectives() {
    // The other ranks may still be setting up their GPU: the start-up floor, not the per-step timeout, applies.
    PeerWait peer_wait("the NCCL communicator set-up", kStartupTimeoutS);
    const World& w = world();
    ncclUniqueId id{};
    if (w.is_root()) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    int lowest = 0, highest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, highest));
    CUDA_CHECK(cudaEventCreateWithFlags(&compute_ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    NCCL_CHECK(ncclCommInitRank(&comm_, w.size, id, w.rank));
  }
  ~NcclCollectives() override {
    if (comm_) ncclCommDestroy(comm_);
    for (cudaEvent_t stamp : stamps_)
      if (stamp) cudaEventDestroy(stamp);
    cudaEventDestroy(compute_ready_);
    cudaEventDestroy(done_);
    for (cudaEvent_t mark : marks_) cudaEventDestroy(mark);
    cudaStreamDestroy(stream_);
  }

  void after_compute() override {
    CUDA_CHECK(cudaEventRecord(compute_ready_, cuda_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_ready_, 0));
  }
  void all_reduce_sum(void* data, int64_t count, DType dtype) override {
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_, stream_));
  }
  void all_reduce_max(float* data, int64_t count) override {
    NCCL_CHECK(ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat, ncclMax, comm_, stream_));
  }
  // In place as NCCL defines it: the receive buffer is the rank's share of the send buffer.
  void reduce_scatter_sum(void* data, int64_t count, DType dtype) override {
    char* bytes = static_cast<char*>(data);
    NCCL_CHECK(ncclReduceScatter(bytes, bytes + world().rank * count * static_cast<int64_t>(dtype_size(dtype)),
                                 static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_, stream_));
  }
  void all_gather(float* data, int64_t count) override {
    NCCL_CHECK(ncclAllGather(data + world().rank * count, data, static_cast<size_t>(count), ncclFloat, comm_, stream_));
  }

  void wait(const char* what) override {
    CUDA_CHECK(cudaEventRecord(done_, stream_));
    wait_for(done_, what);
  }
  void record_mark(size_t mark) override {
    while (marks_.size() <= mark) {
      cudaEvent_t event = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      marks_.push_back(event);
    }
    CUDA_CHECK(cudaEventRecord(marks_[mark], stream_));
  }
  void wait_mark(size_t mark, const char* what) override {
    HGRN_CHECK(mark < marks_.size(), "NCCL: wait for mark ", mark, ", which was never recorded");
    wait_for(marks_[mark], what);
  }
  void stamp(size_t id, Stream stream) override {
    if (stamps_.size() <= id) stamps_.resize(id + 1, nullptr);
    if (!stamps_[id]) CUDA_CHECK(cudaEventCreate(&stamps_[id]));
    CUDA_CHECK(cudaEventRecord(stamps_[id], stream == Stream::Compute ? cuda_stream() : stream_));
  }
  double stamp_ms(size_t from, size_t to) override {
    HGRN_CHECK(std::max(from, to) < stamps_.size() && stamps_[from] && stamps_[to], "NCCL: stamp ",
               std::max(from, to), " never taken");
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, stamps_[from], stamps_[to]));
    return ms;
  }

 private:
  // The watchdog (world.h) bounds the wait; NCCL's asynchronous errors end it at once.
  void wait_for(cudaEvent_t event, const char* what) {
    PeerWait peer_wait(what);
    for (;;) {
      const cudaError_t state = cudaEventQuery(event);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) CUDA_CHECK(state);
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string why = detail::concat(ncclGetErrorString(async), " (", ncclGetLastError(comm_), ")");
        ncclCommAbort(comm_);  // releases this rank's NCCL kernels, so that the process can exit
        comm_ = nullptr;
        throw Error(detail::concat("rank ", world().rank, " of ", world().size, ": NCCL ", what, " failed: ", why,
                                   "; the run stops (resume it from its last checkpoint)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_ready_ = nullptr, done_ = nullptr;
  std::vector<cudaEvent_t> marks_;  // record_mark's events, by mark
  std::vector<cudaEvent_t> stamps_;  // stamp's timing events, by id
};

}  // namespace

std::unique_ptr<Collectives> make_nccl_collectives() { return std::make_unique<NcclCollectives>(); }
#else
std::unique_ptr<Collectives> make_nccl_collectives() {
  throw Error(
      "multi-GPU training needs NCCL, and this hgrn was built without it: install NCCL (libnccl-dev, or the CUDA "
      "Toolkit's) and MPI, and rebuild; or train on the CPU with training.device: cpu");
}
#endif

}  // namespace hgrn
