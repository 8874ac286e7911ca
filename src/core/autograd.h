// autograd.h: the tape. A Var is a tensor plus the gradient that flows into it; each op's forward computes its
// output and records a closure that runs the op's hand-written backward. Tape::backward seeds the output's gradient
// and runs the closures in reverse order. Backward kernels *accumulate* into gradient buffers (+=), which is what
// makes residual branches, tied weights and gradient accumulation over micro-batches work without special cases.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hgrn {

struct Fp8CodesOut;        // ops/fp8.h
struct Fp8OutputGradient;  // ops/fp8_linear.h
struct Variable;

// The gradient of a tensor read as column blocks (column_block_outputs below), made lazily by the first block whose
// gradient is written whole: each block's gradient is then a column view of `buffer`, so that the blocks' gradients,
// written by their own consumers, are already the whole tensor's gradient, with no copy.
struct SplitGradient {
  Shape shape;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  Tensor buffer;
  // Set by a producer whose GEMMs read the gradient in FP8 (linear_columns): its weight. A consumer that writes every
  // block's gradient, and is the only one, may then write it as that weight's E5M2 output-gradient codes instead
  // (fp8_gradient; swiglu_linear), which the producer's backward takes in place of `buffer`.
  std::shared_ptr<Variable> fp8_weight;  // a Var (declared below)
  std::shared_ptr<Fp8OutputGradient> fp8_gradient;
};

struct Variable {
  Tensor value;
  Tensor grad;  // undefined until a gradient flows in; parameters keep theirs across micro-batches until zero_grad
  // The gradient is zero (mark_grad_zero) but is not held as zeros: `grad` holds old values, or on the GPU its buffer
  // went back to the caching allocator (grad undefined). The next grad_buffer zeroes or makes it, the next
  // grad_buffer_for_write overwrites or makes it, and settle_grad (for code that reads grad directly) makes it
  // zeros. Saves the fill of every weight gradient on every step, and on the GPU the gradients' memory between the
  // optimiser step and the backward that writes them again, where the forward's activations peak.
  bool grad_stale = false;
  // `grad` is a view of a buffer owned elsewhere that must stay in place (data parallelism's flat gradient buffer,
  // which its collectives reduce): mark_grad_zero keeps it.
  bool grad_buffer_fixed = false;
  // `grad` may be held elsewhere too (a buffer taken over by adopt_gradient, which a queued closure may still read):
  // read it freely; grad_buffer and grad_buffer_for_write give this Var a copy of its own before anything writes
  // into it, where its storage is still held by another tensor.
  bool grad_shared = false;
  // Made by op_output: an intermediate, whose gradient lives for one backward (a parameter's persists, and the
  // optimiser and data parallelism write it in place, so it is never shared).
  bool from_op = false;
  bool requires_grad = false;
  std::string name;
  // GPU mixed precision: the bf16 copy of an fp32 weight that GEMMs read, made on first use and kept until the
  // value changes. Whoever changes `value` (loading weights, a CPU or partial optimiser update) must reset it:
  // invalidate_compute_copy; the GPU optimiser rewrites it with the update instead (src/train/optimizer.cpp).
  Tensor compute_copy;
  void invalidate_compute_copy() { compute_copy = Tensor(); }
  // What the gradient buffer is made like once release_value has freed `value`.
  struct {
    Shape shape;
    DType dtype = DType::F32;
    Device device = Device::CPU;
  } released;
  // Set by release_until_producer_backward (ops/recompute.h): `value` is freed after the forward, and the backward
  // of the op that made it, which runs after every consumer's, writes it again (restore_value). A consumer whose
  // backward needs the value queues that part here (when_value_ready) instead of running it.
  bool restored_by_producer = false;
  std::vector<std::function<void()>> waiting_for_value;
  // Set while the only work waiting can take the value as FP8 codes instead (when_value_or_codes_ready): where and at
  // which scale the producer may write them.
  std::shared_ptr<const Fp8CodesOut> codes_wanted;
  // Set by column_block_outputs: this Var is columns [split_column, + width) of a larger tensor, whose gradient is
  // `split`.
  std::shared_ptr<SplitGradient> split;
  int64_t split_column = 0;
};
using Var = std::shared_ptr<Variable>;

Var make_var(Tensor value, bool requires_grad = false, std::string name = {});
// The gradient buffer of v, allocated as zeros (same shape, dtype, device as the value) on first use.
Tensor& grad_buffer(const Var& v);
// Marks v's gradient as zero without filling its buffer (see Variable::grad_stale); no-op without a buffer. A GPU
// buffer goes back to the caching allocator unless grad_buffer_fixed.
void mark_grad_zero(const Var& v);
// Whether v has a gradient: a buffer, or one marked zero whose buffer was given back.
bool has_gradient(const Var& v);
// Makes a buffer marked zero hold zeros; for code that reads or reduces v->grad without asking for a buffer.
void settle_grad(const Var& v);
// The gradient buffer of v for a kernel that writes every element: allocated uninitialised on first use
// (*accumulate = false: the caller must overwrite every element), else the existing buffer (*accumulate = true: the
// caller must add into it). Saves the zero fill and its read-back on the GPU. Two writes into one Var's buffer by one
// op (a tensor passed as two inputs) must ask twice, in the order they write: the second call says accumulate.
// With GradLayout::RowStrided the caller's kernel honours the buffer's row stride (Tensor::row_stride): a column block
// (column_block_outputs) then gets its column view of the whole tensor's gradient (fresh, *accumulate false).
enum class GradLayout { Contiguous, RowStrided };
Tensor& grad_buffer_for_write(const Var& v, bool* accumulate, GradLayout layout = GradLayout::Contiguous);
// Makes g v's gradient buffer itself (no copy) where v is an op output with no gradient yet, and returns true; the
// buffer is marked shared (grad_shared), so it is copied before a write while another tensor still holds it. Else
// does nothing and returns false (the caller adds g into v's gradient). g must be laid out as v's gradient would be.
bool adopt_gradient(const Var& v, Tensor&& g);
// Frees v's value now, keeping its shape, dtype and device for the gradient buffer: for a Var that no backward
// reads (a residual branch's output, only summed into the stream), which the closures of the ops that consumed it
// would otherwise keep alive until the backward. Reading the value afterwards is an error.
void release_value(const Var& v);
// True when v exists and wants a gradient.
inline bool wants_grad(const Var& v) { return v && v->requires_grad; }

class Tape {
 public:
  // Records the backward of an op. Nothing is recorded when the tape is disabled (evaluation).
  void record(std::function<void()> backward_fn);
  // Seeds out's gradient with `seed` (default: ones, which for a scalar loss is dL/dL = 1), runs every recorded
  // backward in reverse order, then clears the tape (releasing the activations the closures held).
  void backward(const Var& out, const Tensor& seed = {});
  void clear() { backward_fns_.clear(); }
  size_t size() const { return backward_fns_.size(); }
  bool enabled() const { return enabled_; }
  void set_enabled(bool enabled) { enabled_ = enabled; }

 private:
  std::vector<std::function<void()>> backward_fns_;
  bool enabled_ = true;
};

// The output Var of an op: requires a gradient when the tape records and any input requires one.
Var op_output(Tape& tape, Tensor value, std::initializer_list<Var> inputs);

// An op's outputs that are column blocks of one tensor `whole` (contiguous; widths summing to its last axis): views
// (Tensor::columns, row-strided), op outputs requiring a gradient when requires_grad is true. Their consumers may read
// them in place and write their gradients into one buffer laid out like `whole` (grad_buffer_for_write with
// GradLayout::RowStrided), which the producer's backward then takes whole (gather_column_gradients): a fused
// projection's q | f | i feeding three ops, whose gradients need no copy to make one dx GEMM's operand.
std::vector<Var> column_block_outputs(const Tensor& whole, const std::vector<int64_t>& widths, bool requires_grad);
// In the producer's backward: the blocks' gradients as one tensor like `whole`: the buffer the blocks wrote in place,
// with blocks whose gradient was written elsewhere copied in and blocks that got none zero. Undefined when no block
// has a gradient. The blocks' own gradients are released (the result alone holds the buffer).
Tensor gather_column_gradients(const std::vector<Var>& blocks);

}  // namespace hgrn
