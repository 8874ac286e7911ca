// fp8_linear.h: FP8 linear layers (training.precision: fp8). A linear layer's three GEMMs run on FP8 tensor cores
// (kernels/fp8.h): the input and the weight in E4M3, the output gradient in E5M2, each with a per-tensor scale from
// delayed scaling (ops/fp8.h: Transformer Engine's default recipe, the amax of the last history_length steps). The
// outputs, the activations between layers, the fp32 master weights and their fp32 gradients stay as in bf16.
// linear, linear_columns, swiglu_linear and the LM head's linear_cross_entropy (ops/linear.h, ops/swiglu_linear.h,
// ops/linear_cross_entropy.h) take this path while an Fp8LinearScope is active, for an input of the scope's
// activation dtype on its device, an fp32 master weight not excluded (the LM head, unless training.fp8_lm_head) and
// sizes that are multiples of 16 (cuBLASLt's FP8 kernels); anything else runs as before.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "ops/fp8.h"

namespace hgrn {

struct Fp8Recipe {
  int64_t history_length = 1024;  // amax history in steps (Transformer Engine's default)
  int margin = 0;                 // scale = fp8_max · 2^-margin / amax
  // Output gradients in E5M2 (Transformer Engine's HYBRID format, the default) or E4M3 (its E4M3 format).
  Fp8Format gradient_format = Fp8Format::E5M2;
};

// FP8 linear layers for the scope's lifetime (one training run or bench): the scaling states of up to
// `max_weights` weights (one per weight, or per block of adjacent weights that linear_columns multiplies as one),
// made on their first use. `excluded` weights (training: the LM head unless training.fp8_lm_head, and embeddings tied
// to it) stay in bf16. One scope at a time.
// On the GPU (bf16 activations; sm_89+) or on the CPU, where the reference arithmetic of ops/fp8.h runs on fp32
// activations: the tests' check of everything around the GPU kernels (training refuses fp8 on the CPU).
class Fp8LinearScope {
 public:
  Fp8LinearScope(const Fp8Recipe& recipe, int64_t max_weights, const std::vector<Var>& excluded,
                 Device device = Device::CUDA);
  ~Fp8LinearScope();
  Fp8LinearScope(const Fp8LinearScope&) = delete;
  Fp8LinearScope& operator=(const Fp8LinearScope&) = delete;
};

// Suspends the active scope for its lifetime (evaluation during training: the model's bf16 forward, as `hgrn eval`
// and the exports see it, and no amax recorded into the training's histories). The weights' codes the scope kept are
// dropped: the next forward after it casts the weights again.
class Fp8LinearPause {
 public:
  Fp8LinearPause();
  ~Fp8LinearPause();
  Fp8LinearPause(const Fp8LinearPause&) = delete;
  Fp8LinearPause& operator=(const Fp8LinearPause&) = delete;

 private:
  void* paused_;
};

// Whether an Fp8LinearScope is active.
bool fp8_linear_active();

// Whether the GEMMs of `weight` (master block w [out, in], the value of one weight or the adjacent values of several)
// with input x take the FP8 path.
bool fp8_linear_applies(const Var& weight, const Tensor& x, const Tensor& w);

// The same test for an input of `rows` rows of the given dtype and device, with no tensor yet.
bool fp8_linear_applies(const Var& weight, Device device, DType dtype, int64_t rows, const Tensor& w);

// y = x·Wᵀ, or residual + x·Wᵀ, a new tensor [..., out] of x's dtype: x and W cast to E4M3 with their scales (their amaxes
// recorded for this step), one FP8 GEMM with fp32 accumulation. W is cast once a step, at the weight's first forward:
// its codes are kept until fp8_end_step for the step's later forwards (micro-batches, recomputed layers) and input
// gradients, since neither the weight nor its scale changes within a step.
Tensor fp8_linear_forward(const Var& weight, const Tensor& x, const Tensor& w, const Tensor* residual);

// y = x·Wᵀ into y ([rows, out], contiguous, x's dtype), as fp8_linear_forward computes it without a residual: for
// callers that own the output's buffer (the language-model head's chunks).
void fp8_linear_forward_into(const Var& weight, const Tensor& x, const Tensor& w, Tensor& y);

// The output gradient dy [rows, width] cast once to E5M2 for both backward GEMMs: row-major and transposed codes.
struct Fp8OutputGradient {
  Tensor codes, codes_transposed;  // FP8 codes in I32 storage (four a element): [rows, width] and [width, rows]
  int64_t rows = 0, width = 0;
};
Fp8OutputGradient fp8_output_gradient(const Var& weight, const Tensor& dy);
// The same written by the op that computes dy (the LM head's cross-entropy gradient) instead of cast from it: g gets
// the codes buffer [rows, width] and the returned Fp8CodesOut (ops/fp8.h) the gradient's scale and step amax to
// write it with; then fp8_output_gradient_transpose makes the transposed codes. Where dy has no scale yet (its first
// cast takes the scale from its own values) the returned codes pointer is null and g is left empty: cast dy then.
Fp8CodesOut fp8_output_gradient_codes(const Var& weight, int64_t rows, int64_t width, Fp8OutputGradient& g);
void fp8_output_gradient_transpose(Fp8OutputGradient& g);

// Wᵀ's codes [in, out] for w [out, in]: the transpose of those the weight's forward cast this step; without a forward
// since the step began, w is cast again.
Tensor fp8_weight_codes_transposed(const Var& weight, const Tensor& w);
// dx = dy·W + beta·dx (dx [rows, in] of the activation dtype or fp32, contiguous), with Wᵀ's codes from
// fp8_weight_codes_transposed: made here, or passed in by a caller with several input gradients of one weight.
void fp8_linear_input_gradient(const Var& weight, const Fp8OutputGradient& dy, const Tensor& w, float beta,
                               Tensor& dx, const Tensor* weight_codes_transposed = nullptr);
// dw = dy[:, first_column .. first_column + n)ᵀ·x + beta·dw, dw the fp32 gradient [n, in] (contiguous).
void fp8_linear_weight_gradient(const Var& weight, const Fp8OutputGradient& dy, int64_t first_column,
                                const Tensor& x, float beta, Tensor& dw);

// A projection's FP8 input written by the op that computes it (swiglu_linear: SwiGLU's output) instead of in the act
// dtype and cast afterwards: one 1-byte write an element where there were a 2-byte write, a 2-byte read and a 1-byte
// write. The producer writes `out` (ops/fp8.h: the codes [rows, in] at the input's scale; in the forward also its
// amax for the step, in the backward none). The codes are those the cast would make, so the results keep their bits.
struct Fp8ProducedInput {
  Tensor codes;  // undefined where the producer cannot write codes (below)
  Fp8CodesOut out;
  int64_t rows = 0, in = 0;
};
// The buffer and scale for `weight`'s input of `rows` rows (w its master block), or an undefined one where the weight
// does not take the FP8 path (fp8_linear_applies) or, in the forward, its input has no scale yet: a tensor's first
// cast takes its scale from its own values (scale_on_first_cast), so the producer writes them in the act dtype then.
Fp8ProducedInput fp8_produced_input(const Var& weight, const Tensor& w, Device device, DType dtype, int64_t rows,
                                    bool forward);
// fp8_linear_forward with the input's codes written by its producer: y [..., out] of `shape` (x's shape with its last
// size out) and `dtype`.
Tensor fp8_linear_forward_produced(const Var& weight, const Fp8ProducedInput& x, const Tensor& w,
                                   const Tensor* residual, const Shape& shape, DType dtype);
// fp8_linear_weight_gradient with the input's codes written by its producer in the backward (transposed here).
void fp8_linear_weight_gradient_produced(const Var& weight, const Fp8OutputGradient& dy, int64_t first_column,
                                         const Fp8ProducedInput& x, float beta, Tensor& dw);
// The CPU producers' cast, the reference the GPU producers' codes are held to: values (as stored; fp32 or fp64 on the
// CPU) cast at *codes.scale, their amax folded where codes.amax is set.
void fp8_cast_into_codes_cpu(const Tensor& values, const Fp8CodesOut& codes);

// With several ranks: reduce_max(data, count) makes `count` amaxes (device floats) the maximum over the ranks, in
// place. The active scope passes every amax its scales come from through it (each step's, and a tensor's first cast's),
// so that every rank derives the same scales. Null (one rank) by default; a new scope starts without one.
void fp8_set_amax_reduction(const std::function<void(float*, int64_t)>& reduce_max);

// End of a training step, after the optimiser's update: each tensor's amax of the step (reduced over the ranks) goes
// into its history and its scale is updated (fp8_update_scale's rule on the GPU), and the weights' codes kept through
// the step are dropped, so the next forward casts the updated weights. Nothing without an active scope.
void fp8_end_step();

// The scaling states as named CPU arrays for a checkpoint, and back. "slot_params" (int64) names each state's owner
// by its index in `params` (the model's parameters, in order); then per format its histories, ring positions and
// scales ("forward_*": inputs and weights, "gradient_*": output gradients). Empty without an active scope. Restoring (before the first step) gives each weight its saved state;
// anything that does not fit the scope (history length, a parameter index) is an Error naming `source`.
std::vector<std::pair<std::string, Tensor>> fp8_scaling_save(const std::vector<Var>& params);
void fp8_scaling_restore(const std::vector<std::pair<std::string, Tensor>>& saved, const std::vector<Var>& params,
                         const std::string& source);

// The scaling state of `weight` as the host sees it, for tests and checkpoints: per tensor (input, weight, output
// gradient) its scale, and the amax recorded so far this step. Empty where the weight has none yet.
struct Fp8ScalingSnapshot {
  std::vector<float> scales, step_amax;  // [input, weight, output gradient]
  std::vector<float> amax_history;       // 3 × history_length, the same order
  std::vector<int64_t> positions;
};
Fp8ScalingSnapshot fp8_scaling_snapshot(const Var& weight);

}  // namespace hgrn
