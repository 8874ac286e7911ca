// linear.h: y = x·Wᵀ (no bias), x [..., in], W [out, in] -> y [..., out]. All hgrn projections are bias-free.
#pragma once
#include <functional>
#include <vector>

#include "core/autograd.h"

namespace hgrn {

// residual (optional, [..., out] like y, same dtype and device): y = residual + x·Wᵀ, the pre-norm residual stream's
// add made by the GEMM (beta 1), whose gradient passes to residual unchanged.
Var linear(Tape& tape, const Var& x, const Var& weight, const Var& residual = nullptr);

// Several projections of one input, y_i = x·W_iᵀ, computed as one: their outputs are the column blocks of one tensor
// [..., out_0 + out_1 + …] (views, row-strided: core/autograd.h column_block_outputs), e.g. the q/f/i projections.
// Where the weights lie adjacent in memory (the model allocates them so: ParamSpec::adjacent_to_previous; on the GPU
// their bf16 copies are made so), each product is one GEMM: the forward's n and dx's k are the summed widths, and dW
// goes to the weights' gradients in one GEMM where those are adjacent too (made so at their first allocation).
// Otherwise one GEMM per weight reads or writes its columns. Consumers that write their gradients row-strided
// (the GPU gates and recurrence) write them straight into dx's operand; others' are copied into it.
std::vector<Var> linear_columns(Tape& tape, const Var& x, const std::vector<Var>& weights);

// The pieces linear is made of, for ops that fuse a projection with what follows it (linear_cross_entropy):
// The tensor linear's GEMMs read for `weight` when the input is `x`: the weight itself, or, for a bf16 input and an
// fp32 master weight on the GPU, its bf16 copy (made once per weight update: Variable::compute_copy). Checks that
// x [..., in] fits weight [out, in] (device, dtype, contiguity).
Tensor weight_for_input(const Var& weight, const Tensor& x);
// The bf16 copy of an fp32 master weight, cast on first use after each update (or after the copy was dropped).
const Tensor& bf16_weight_copy(const Var& weight);
// linear_columns' weights as its GEMMs read them with the input `x`: their values, or their bf16 copies (made
// adjacent in one buffer where the values are adjacent).
std::vector<Tensor> column_weights_for_input(const std::vector<Var>& weights, const Tensor& x);
// linear's three products, with the weight's compute tensor w [out, in] (weight_for_input) and rows = the rows of
// x [..., in] / dy [..., out]. y = x·Wᵀ, a new tensor [..., out]:
// residual non-null: y = residual + x·Wᵀ (one rounding to y's dtype).
Tensor linear_product(const Tensor& x, const Tensor& w, const Tensor* residual = nullptr);
// y (+)= x·[W_0; W_1; …]ᵀ into y [..., Σ out_i] (contiguous, x's dtype and device; accumulate: add to it), from the
// weights' compute tensors: one GEMM where they lie adjacent, else one per weight into its column block. Allocates
// nothing (decoding's buffers made once, models/fused_decoder.h; linear_columns' forward). On the GPU, up to 8 rows
// (decoding's tokens) take matrix-vector products that read each weight once (kernels/small_batch_gemv.h) instead.
void linear_product_into(const Tensor& x, const std::vector<Tensor>& weights, Tensor& y, bool accumulate);
// linear_product_into of an input made from x first, for decoding: where the small-batch GEMV takes every weight it
// makes the input as it stages x (no launch and no buffer of its own; SwiGLU's input rounded to x's dtype as stored,
// the norm's never: GemvInput), else the input's op writes `scratch` (like the input) and linear_product_into reads
// it.
//   RMSNorm(x)·norm_weight (rmsnorm_forward_into's; rstd_scratch [rows] as it takes) for the pre-norms;
void normed_linear_product_into(const Tensor& x, const Tensor& norm_weight, double eps, Tensor& scratch,
                                Tensor& rstd_scratch, const std::vector<Tensor>& weights, Tensor& y, bool accumulate);
//   silu(gate)·up (swiglu_forward's; gate and up may be column blocks) for the MLP's down projection.
void swiglu_linear_product_into(const Tensor& gate, const Tensor& up, Tensor& scratch,
                                const std::vector<Tensor>& weights, Tensor& y, bool accumulate);
// dx = dy·W + beta·dx (beta 0: dx may be a fresh, uninitialised buffer):
void linear_input_gradient(const Tensor& dy, const Tensor& w, float beta, Tensor& dx);
// weight's gradient += dyᵀ·x (into the fp32 master gradient for bf16 inputs: accumulated in fp32, never rounded to
// bf16); the first write after zero_grad overwrites the buffer (beta 0) instead of adding to a filled one:
void linear_weight_gradient(const Tensor& dy, const Tensor& x, const Var& weight);
// The same from dy's FP8 codes (ops/fp8_linear.h: fp8_linear_weight_gradient), for linear and swiglu_linear under an
// Fp8LinearScope:
struct Fp8OutputGradient;
struct Fp8ProducedInput;
void linear_weight_gradient(const Fp8OutputGradient& dy, const Tensor& x, const Var& weight);
// and from x's codes written by its producer (swiglu_linear's backward):
void linear_weight_gradient(const Fp8OutputGradient& dy, const Fp8ProducedInput& x, const Var& weight);
// While a WeightGradientQueue is open in this thread, the weight-gradient GEMMs of linear, linear_columns and
// swiglu_linear (FP8 ones included) wait in it with their operands instead of running, until run() runs them in the
// order they came: the same GEMMs on the same operands, so the same bits, later in the backward. Data parallelism runs
// layer 0's after the embedding's backward, so that the embedding gradient's reduction overlaps them
// (models/decoder_lm.cpp).
class WeightGradientQueue {
 public:
  WeightGradientQueue() = default;
  WeightGradientQueue(const WeightGradientQueue&) = delete;
  WeightGradientQueue& operator=(const WeightGradientQueue&) = delete;
  ~WeightGradientQueue();  // closes it (a backward cut short): nothing waits in a queue that is gone
  void open();
  void run();  // closes it, then runs what waits
  // For the ops: keeps `work` in this thread's open queue and returns true, or returns false where none is open.
  static bool defer(std::function<void()>&& work);

 private:
  std::vector<std::function<void()>> work_;
};
// C[m, n] = op(A)·op(B) + beta·C on the tensors' device, with the gemm_cpu contract (row-major, leading dimensions).
// c_in non-null (contiguous, like C; beta != 0): the addend is beta·c_in instead of beta·C.
void linear_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, int64_t lda,
                 const Tensor& b, int64_t ldb, float beta, Tensor& c, int64_t ldc, const Tensor* c_in = nullptr);

}  // namespace hgrn
