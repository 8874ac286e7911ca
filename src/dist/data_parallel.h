// data_parallel.h: data parallelism over the ranks of world.h: every rank holds the whole model, trains on its
// own share of the batch, and the gradients are summed across ranks before the update.
//
// The parameters and their gradients live in two flat fp32 buffers, laid out bucket by bucket: one bucket per
// group of CausalLM::gradient_ready_groups(). During the backward of a step's last micro-batch, each bucket's
// reduction is queued as soon as the model reports its gradients complete, so that (between GPUs, on NCCL's own
// stream) it overlaps the backward of the layers before it. The embedding's bucket, complete last, overlaps layer
// 0's weight gradients, which the model runs after it while the hook is set (models/decoder_lm.h).
//
// With training.grad_reduce_dtype = bf16 each bucket is rounded into a bf16 copy of the flat buffer before its
// reduction, which halves the bytes sent, and this rank's sums are converted back into the fp32 gradients after the
// backward (the accumulation over micro-batches and the update stay fp32).
//
// ZeRO-1 (training.zero1): instead of an all-reduce, each bucket is reduce-scattered: rank r receives the summed
// gradients of the r-th 1/N of every bucket, keeps the AdamW moments for that share only, updates that share of
// the weights, and an all-gather brings every rank the whole updated weights. The all-gathers are queued bucket by
// bucket in the order the forward reads them, and the next forward waits for each bucket only where it first reads
// it (CausalLM's parameters-needed hook), so that they overlap the forward. Deviation from the wording,
// said here and in the README: the fp32 weights stay whole on every rank (the forward reads them directly, as
// norm weights and lower bounds and as the source of the bf16 GEMM copies); the optimiser moments, 2/3 of the fp32
// training state, are what is sharded.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/collectives.h"
#include "models/registry.h"
#include "train/optimizer.h"

namespace hgrn {

struct DataParallelOptions {
  bool zero1 = false;
  DType reduce_dtype = DType::F32;  // F32 or BF16: the dtype the gradients are summed in across ranks (above)
  bool overlap = true;  // reduce each bucket as the backward completes it; false: all of them after the backward
};

// What the options change from plain fp32 all-reduces overlapping the backward, for logs: "ZeRO-1, gradients
// summed in bf16" ("" for none).
std::string describe(const DataParallelOptions& options);

class DataParallel {
 public:
  // Moves the model's parameters (already on their device) into the flat buffers, points every parameter's value
  // and gradient at its place there, and hooks the model's backward. `params` are the optimiser's parameter groups
  // (make_param_groups): every model parameter exactly once.
  DataParallel(CausalLM& model, std::vector<ParamRef> params, const DataParallelOptions& options);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The parameters this rank's optimiser updates: all of them whole, or (ZeRO-1) each with this rank's range.
  const std::vector<ParamRef>& optimizer_params() const { return rank_params_; }
  bool zero1() const { return options_.zero1; }

  // Gradients are reduced in the backward of a step's last micro-batch only (the others accumulate locally): call
  // with true before that backward and with false before the others.
  void reduce_in_next_backward(bool reduce);
  // After the last micro-batch's backward: blocks until every bucket is reduced (see Collectives::wait).
  void finish_gradient_reduction();
  // For clip_grad_norm: under ZeRO-1 each rank measures its share; this adds them up (in rank order). Else null.
  std::function<double(double)> grad_norm_total() const;
  // After the optimiser step, under ZeRO-1: queues the all-gathers of every rank's updated share to all ranks and
  // returns; the next forward waits for each bucket as it reaches it. A no-op without ZeRO-1.
  void finish_update();
  // Blocks until finish_update's all-gathers are complete: before the weights are read other than by the model's
  // forward (a checkpoint's copy to the host).
  void wait_for_weights();
  // data[0, count) on this process's device: the elementwise maximum over the ranks, on every rank, complete on
  // return (the FP8 amaxes, so that every rank derives the same scales). `what` names the wait.
  void all_reduce_max(float* data, int64_t count, const char* what);
  // For checkpoints under ZeRO-1 (a collective: every rank calls it): each parameter's whole first and second
  // moments on the CPU, on rank 0, assembled from every rank's share (the other ranks receive empty vectors).
  void gather_moments(const AdamW& optimizer, std::vector<Tensor>* first, std::vector<Tensor>* second) const;

  // The last finished backward's gradient reductions (for hgrn bench; read before the next backward): how many, how
  // long the communication stream worked on them (each from its bucket's completion, or the end of the one before,
  // to its own end), and how long the last one ran past the end of the backward on the compute stream.
  struct ReductionTiming {
    int64_t buckets = 0;
    double busy_ms = 0, tail_ms = 0;
  };
  ReductionTiming last_reduction_timing();

 private:
  struct Bucket {
    int64_t offset = 0, size = 0;  // in the flat buffers; size is a multiple of (ranks x kAlignment)
  };
  struct Placement {
    int64_t offset = 0, numel = 0;
    size_t bucket = 0;
  };
  void on_gradients_ready(size_t group);
  void reduce_bucket(size_t bucket);
  void on_parameters_needed(size_t group);
  // The range of each parameter (in params_ order) that `rank` updates under ZeRO-1.
  std::vector<ParamRef> params_of_rank(int rank) const;

  CausalLM& model_;
  DataParallelOptions options_;
  std::unique_ptr<Collectives> collectives_;
  std::vector<ParamRef> params_, rank_params_;
  std::vector<Placement> placements_;  // per params_ entry
  std::vector<Bucket> buckets_;
  Tensor flat_params_, flat_grads_;
  Tensor reduce_buffer_;  // reduce_dtype BF16 only: the gradients in bf16, the flat layout again
  bool reduce_ = false;
  std::vector<bool> queued_;
  size_t reduced_ = 0;  // buckets queued for reduction in this backward
  size_t last_reduced_ = 0;  // buckets the last finished backward reduced
  std::vector<bool> gathering_;  // per bucket: all-gather queued by finish_update, not yet waited for
};

}  // namespace hgrn
