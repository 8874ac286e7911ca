// adamw.h: the optimiser's multi-tensor GPU kernels (src/train/optimizer.cpp): the AdamW update, the gradients'
// sum of squares and their in-place scaling, each one launch over every fp32 parameter at once. Declarations only
// (no CUDA types), so the CPU build includes it too, for AdamWStep.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hgrn {

// One fp32 CUDA parameter (cuda_upload_slot_table puts a table of them on the device); fields a launcher does not
// use may be null.
struct MultiTensorSlot {
  float* param = nullptr;   // AdamW: updated in place
  float* grad = nullptr;    // AdamW and the norm: read; the scale: scaled in place
  float* first = nullptr;   // AdamW's moments, updated in place
  float* second = nullptr;
  // AdamW, where non-null: n bf16 values receiving the updated parameter rounded to nearest even, the bits a cast of
  // it afterwards gives (the parameter's bf16 compute copy, kept valid instead of cast again by the next forward).
  void* bf16_copy = nullptr;
  int64_t n = 0;            // elements
  int64_t decay = 0;        // AdamW: 1 = decoupled weight decay applies
  int64_t first_chunk = 0;  // set by the launchers: the slot's first chunk in the launch
};

// The per-step constants of the AdamW update (CPU and GPU alike: src/train/optimizer.cpp includes this header in
// every build): step_size = lr / (1 − β1^t), inv_sqrt_bias_correction2 = 1 / √(1 − β2^t).
struct AdamWStep {
  double step_size;
  double inv_sqrt_bias_correction2;
};

// Bytes of device memory the launchers below need as `workspace` for `count` slots holding `elements` in all.
size_t cuda_multi_tensor_workspace_bytes(int64_t count, int64_t elements);

// Copies the slot table to the start of `workspace` (waiting for the copy) and returns the launches' chunk count. The
// table stays there for any number of launches while the slots are the same.
long long cuda_upload_slot_table(const MultiTensorSlot* slots, int64_t count, void* workspace);
// Where in the workspace cuda_grad_sum_of_squares leaves its total (one double).
double* cuda_multi_tensor_total(void* workspace, int64_t count, long long chunks);

// AdamW for every slot, in double with IEEE-rounded operations in the CPU's order (optimizer.cpp's adamw_update):
// g = float(grad · grad_scale) (the gradient clipping would have left; grad itself is not written);
// m = b1 m + (1-b1) g; v = b2 v + ((1-b2) g) g;
// p = p * (decay ? decay_factor : 1) - (step_size m) / (sqrt(v) inv_sqrt_bias_correction2 + eps);
// and bf16_copy = bf16(p) where the slot has one.
// With clip_sum_of_squares (a device double, Σ grad²) grad_scale is replaced by the clip factor of that sum and
// max_norm, formed on the device as grad_norm_and_clip_factor forms it on the host (the same bits): clipping
// without a round trip through the host.
void cuda_adamw_update(const void* workspace, int64_t count, long long chunks, double beta1, double beta2, double eps,
                       double decay_factor, const AdamWStep& step, double grad_scale,
                       const double* clip_sum_of_squares, double max_norm);
// *total = Σ grad² over every slot, in double, reduced in an order fixed by the slots' sizes alone (bitwise
// reproducible); total is device memory and nothing waits for it.
void cuda_grad_sum_of_squares(void* workspace, int64_t count, long long chunks, double* total);
// *total = NaN where *value (a device fp32 scalar, e.g. a step's loss) is not finite, so that an update guarded by
// total's finiteness is skipped; nothing waits for it.
void cuda_poison_if_nonfinite(double* total, const float* value);
// grad = float(double(grad) * factor) for every slot.
void cuda_scale_grads(const void* workspace, int64_t count, long long chunks, double factor);

}  // namespace hgrn
