// collectives.h: the in-place collectives data parallelism runs over ranges of its flat gradient and parameter
// buffers (fp32; the gradient sums also in bf16). On the CPU they are MPI calls that complete before returning;
// between GPUs they are NCCL calls queued on a communication stream of their own, so that they overlap the backward
// pass on the compute stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace hgrn {

class Collectives {
 public:
  virtual ~Collectives() = default;
  // The collectives queued next read what the compute stream has queued so far (GPU: an event; CPU: nothing).
  virtual void after_compute() = 0;
  // data[0, count) of `dtype` (F32 or BF16): the sum over all ranks, on every rank. In BF16 every partial sum is
  // rounded to bf16 (fp32 arithmetic inside each addition).
  virtual void all_reduce_sum(void* data, int64_t count, DType dtype) = 0;
  // data[0, count): the elementwise maximum over all ranks, on every rank.
  virtual void all_reduce_max(float* data, int64_t count) = 0;
  // data[0, size * count) in, each rank's share out: data[rank * count, (rank + 1) * count) becomes the sum over
  // all ranks of that range (the rest of data is left unspecified). F32 or BF16, as all_reduce_sum.
  virtual void reduce_scatter_sum(void* data, int64_t count, DType dtype) = 0;
  // Each rank's data[rank * count, (rank + 1) * count) in; every rank ends with all ranks' shares in data.
  virtual void all_gather(float* data, int64_t count) = 0;
  // Blocks until every collective queued so far is complete, inside a PeerWait (world.h) named `what`: a hung peer
  // ends the run after the collective timeout. GPU: an NCCL asynchronous error aborts the communicator and throws
  // an Error naming the rank and `what`.
  virtual void wait(const char* what) = 0;
  // Names the collectives queued so far `mark`; wait_mark(mark, what) then blocks as wait() does, until those alone
  // are complete (GPU: an event on the communication stream; CPU: they completed before returning, nothing waits).
  virtual void record_mark(size_t mark) = 0;
  virtual void wait_mark(size_t mark, const char* what) = 0;
  // Timing for the reduction report: stamp(id, Stream::Compute) notes when the compute stream's work queued so far
  // is done, stamp(id, Stream::Collectives) when the collectives queued so far are (GPU: timing events; CPU: the
  // host clock, the calls having completed). stamp_ms(a, b): milliseconds from stamp a to stamp b, once both are
  // complete (after wait()).
  enum class Stream { Compute, Collectives };
  virtual void stamp(size_t id, Stream stream) = 0;
  virtual double stamp_ms(size_t from, size_t to) = 0;
};

// MPI collectives for CPU tensors, or NCCL ones (communicator bootstrapped through MPI) for GPU tensors.
std::unique_ptr<Collectives> make_collectives(Device device);

}  // namespace hgrn
