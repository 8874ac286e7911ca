// adamw.h: the optimiser's multi-tensor GPU kernels (src/train/optimizer.cpp): the AdamW update, the gradients'
// sum of squares and their in-place scaling, each one launch over every fp32 parameter at once.
#pragma once
#include <cstddef>
#include <cstdint>

namespace hgrn {

// One fp32 CUDA parameter. The launchers copy the table to the device; fields a launcher does not use may be null.
struct MultiTensorSlot {
  float* param = nullptr;   // AdamW: updated in place
  float* grad = nullptr;    // AdamW and the norm: read; the scale: scaled in place
  float* first = nullptr;   // AdamW's moments, updated in place
  float* second = nullptr;
  int64_t n = 0;            // elements
  int64_t decay = 0;        // AdamW: 1 = decoupled weight decay applies
  int64_t first_chunk = 0;  // set by the launchers: the slot's first chunk in the launch
};

// Bytes of device memory the launchers below need as `workspace` for `count` slots holding `elements` in all.
size_t cuda_multi_tensor_workspace_bytes(int64_t count, int64_t elements);

// AdamW for every slot, in double with IEEE-rounded operations in the CPU's order (optimizer.cpp's adamw_update):
// g = float(grad · grad_scale) (the gradient clipping would have left; grad itself is not written);
// m = b1 m + (1-b1) g; v = b2 v + ((1-b2) g) g; p = p * (decay ? decay_factor : 1) - lr (m/bc1) / (sqrt(v/bc2) + eps).
void cuda_adamw_update(const MultiTensorSlot* slots, int64_t count, void* workspace, double lr, double beta1,
                       double beta2, double eps, double decay_factor, double bias_correction1,
                       double bias_correction2, double grad_scale);
// Σ grad² over every slot, in double, reduced in an order fixed by the slots' sizes alone (bitwise reproducible).
// Waits for the result (one device-to-host copy).
double cuda_grad_sum_of_squares(const MultiTensorSlot* slots, int64_t count, void* workspace);
// grad = float(double(grad) * factor) for every slot.
void cuda_scale_grads(const MultiTensorSlot* slots, int64_t count, void* workspace, double factor);

}  // namespace hgrn
