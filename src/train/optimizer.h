// optimizer.h: AdamW with decoupled weight decay (Loshchilov & Hutter; the update torch.optim.AdamW performs),
// global gradient-norm clipping, and the split of the model's parameters into decayed and undecayed groups.
// Parameters are fp32 or fp64 on the CPU and fp32 on the GPU; the moments have the parameter's dtype and device.
// GPU parameters are handled by multi-tensor kernels (kernels/adamw.h) doing the CPU's arithmetic. Everything
// here is deterministic: the update is element-wise and the norm is summed in a fixed order whatever the thread
// count or GPU scheduling.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "models/params.h"

namespace hgrn {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One optimised parameter. decay=false for norm weights, the lower bounds and (unless the config asks otherwise)
// the embeddings: shrinking those towards zero changes what the model computes rather than regularising it.
// ZeRO-1 (sharded optimiser state): a process updates only elements [begin, begin + count) of the flattened
// parameter and keeps moments for those alone; count -1 (the default) means the whole parameter, count 0 none.
struct ParamRef {
  Var param;
  bool decay;
  int64_t begin = 0, count = -1;
  int64_t updated_elements() const { return count < 0 ? param->value.numel() : count; }
};

class AdamW {
 public:
  AdamW(std::vector<ParamRef> params, AdamWConfig config);

  // One update from the parameters' current gradients at learning rate lr, then step_count() + 1. For each
  // parameter with a gradient: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p *= 1 - lr wd (decayed parameters
  // only); p -= lr m_hat / (sqrt(v_hat) + eps), with m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t) and t the
  // new step count. A parameter whose gradient is undefined is left alone, moments included. The bias
  // correction uses the optimiser's single step count (it is what a checkpoint stores), which equals each
  // parameter's own count whenever every parameter receives a gradient on every step, as in training.
  // grad_scale: the update uses each gradient element as clip_grad_norm's scaling would leave it (the same bits),
  // without writing the gradients: clipping folded into the update's one pass (grad_norm_and_clip_factor).
  void step(double lr, double grad_scale = 1.0);
  // grad_norm_and_clip_factor(params(), max_norm, total_over_ranks), then step(lr, its clip factor); returns a
  // function giving the norm. Where every gradient is on the GPU and no other process shares the norm, all of it
  // happens on the device with nothing waiting for the host (the norm, the factor and the update: the same bits),
  // and the function reads the norm when called, waiting for the device then: call it once the step's work is
  // queued. A non-finite norm (NaN or inf gradients) skips the update: weights, moments and step count stay as
  // they were, on either path. So does a non-finite value among `guards` (scalars, e.g. the step's losses, read
  // on the device where they live): the returned norm is then NaN.
  std::function<double()> clip_and_step(double lr, double max_norm,
                                         const std::function<double(double)>& total_over_ranks = nullptr,
                                         const std::vector<Tensor>& guards = {});
  // Zeroes every defined gradient lazily (mark_grad_zero), so that the next step's first write overwrites or makes
  // the buffer instead of adding to a filled one; the optimiser's own reads (step, the norm) zero whatever stayed
  // unwritten. GPU buffers go back to the allocator until then (as PyTorch's zero_grad(set_to_none=True)), so the
  // next forward's activations do not peak on top of this step's gradients.
  void zero_grad();
  int64_t step_count() const { return step_count_; }

  // Optimiser state for checkpoints: one first and one second moment tensor per parameter (same order as
  // params(), on the parameter's device: GPU moments need a copy to the CPU before writing), plus the step count.
  // A parameter with an element range (ZeRO-1) has 1-D moments of its range's length.
  const std::vector<Tensor>& first_moments() const { return first_moments_; }
  const std::vector<Tensor>& second_moments() const { return second_moments_; }
  // Replaces the state; every tensor must match its parameter's shape and dtype, on any device. The tensors are
  // copied onto the parameter's device (for a parameter with an element range: that range of them).
  void load_state(std::vector<Tensor> first_moments, std::vector<Tensor> second_moments, int64_t step_count);

  const std::vector<ParamRef>& params() const { return params_; }
  const AdamWConfig& config() const { return config_; }

 private:
  // step's work; with device_sum_of_squares (a device double, GPU parameters only) the norm is measured into it and
  // the update clips by max_norm from it on the device.
  void update(double lr, double grad_scale, double* device_sum_of_squares, double max_norm,
              const std::vector<Tensor>& guards = {});

  std::vector<ParamRef> params_;
  AdamWConfig config_;
  struct ResidentSlots;  // the GPU update's slot table, kept on the device (optimizer.cpp)
  std::shared_ptr<ResidentSlots> resident_;  // made by the constructor
  std::vector<Tensor> first_moments_, second_moments_;
  int64_t step_count_ = 0;
};

// The global L2 norm of all defined gradients, accumulated in double in a fixed order (deterministic; GPU
// gradients are summed on the device and their total added after the CPU ones', one device-to-host copy). If
// max_norm > 0 and the norm exceeds it, every gradient is scaled by max_norm / (norm + 1e-6). Returns the norm
// before clipping. With element ranges (ZeRO-1) only those elements are measured and scaled, and
// `total_over_ranks` turns this process's sum of squares into the sum over all ranks' ranges.
double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm,
                      const std::function<double(double)>& total_over_ranks = nullptr);

// clip_grad_norm's measurement without the scaling: the norm and the factor clipping applies (1 when the norm is at
// most max_norm, max_norm <= 0 or the norm is not finite), for AdamW::step(lr, clip_factor), which saves a pass
// over the gradients.
struct GradNorm {
  double norm = 0.0, clip_factor = 1.0;
};
GradNorm grad_norm_and_clip_factor(const std::vector<ParamRef>& params, double max_norm,
                                   const std::function<double(double)>& total_over_ranks = nullptr);

// ParamRefs for the model's named parameters: Mixer, Mlp and LmHead weights decay; Norm and LowerBound never do;
// Embedding decays only when decay_embeddings (a tied lm_head is the embedding, so it follows the same switch).
std::vector<ParamRef> make_param_groups(const std::vector<std::pair<ParamSpec, Var>>& params, bool decay_embeddings);

}  // namespace hgrn
