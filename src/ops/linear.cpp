// linear.cpp: forward y = x·Wᵀ and backward dx += dy·W, dW += dyᵀ·x; on the CPU through the CPU GEMM (OpenBLAS),
// on the GPU through cuBLASLt (linear_product_into's few-row products: kernels/small_batch_gemv.h).
// Mixed precision on the GPU: the weight is an fp32 master parameter while x may be bf16. Then the weight is cast to
// bf16 once (Variable::compute_copy, 2 bytes per weight), after which the GPU optimiser's update writes the copy
// along with the weight (src/train/optimizer.cpp), and that copy feeds the forward GEMM
// and the backward dx GEMM of every use; dW is produced by a bf16 x bf16 GEMM that accumulates in fp32 straight into
// the fp32 gradient, so the weight gradient is never rounded to bf16. The backward fetches the copy again rather than
// holding it, so that a model may drop the copies between its forward and backward (recompute_weight_copies): the
// cast is then made again, with the same bits, at the first backward use.
// The weight gradient waits where x is released until its producer's backward (ops/recompute.h).
// Under an Fp8LinearScope the three products run on FP8 tensor cores instead (ops/fp8_linear.h), same graph.
// With a residual, y = residual + x·Wᵀ: the residual stream's add happens in the GEMM's epilogue (beta 1, the addend
// read from the residual), so the branch's output is never stored on its own, and the sum is rounded once.
#include "ops/linear.h"

#include <functional>
#include <numeric>

#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/fp8_linear.h"
#include "ops/gemm_cpu.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/gemm.h"
#include "kernels/small_batch_gemv.h"
#endif

namespace hgrn {

// One dispatch for the three products, so forward and backward cannot disagree about layouts.
// On the GPU a and b share one dtype.
void linear_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const Tensor& a, int64_t lda,
                 const Tensor& b, int64_t ldb, float beta, Tensor& c, int64_t ldc, const Tensor* c_in) {
  if (c_in) {
    HGRN_CHECK(beta != 0.0f && c_in->shape() == c.shape() && c_in->dtype() == c.dtype() &&
                   c_in->device() == c.device() && c_in->is_contiguous() && c.is_contiguous(),
               "linear: the addend ", dtype_name(c_in->dtype()), " ", shape_str(c_in->shape()), " on ",
               device_name(c_in->device()), " does not match the output ", dtype_name(c.dtype()), " ",
               shape_str(c.shape()), " on ", device_name(c.device()));
  }
  if (c.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    HGRN_CHECK(a.dtype() == b.dtype(), "linear: GEMM operands are ", dtype_name(a.dtype()), " and ",
               dtype_name(b.dtype()));
    cuda_gemm(trans_a, trans_b, m, n, k, 1.0f, a.raw_data(), lda, b.raw_data(), ldb, a.dtype(), beta, c.raw_data(),
              ldc, c.dtype(), c_in ? c_in->raw_data() : nullptr);
    return;
#else
    throw Error("linear: this hgrn was built without CUDA");
#endif
  }
  if (c_in) c.copy_from(*c_in);  // the CPU GEMM adds beta·C in place
  HGRN_DISPATCH_FLOAT(c.dtype(), "linear", [&] {
    gemm_cpu<scalar_t>(trans_a, trans_b, m, n, k, 1, a.data<scalar_t>(), lda, b.data<scalar_t>(), ldb,
                       static_cast<scalar_t>(beta), c.data<scalar_t>(), ldc);
  });
}

// Checks that x fits weight; true where the GEMMs read the weight's bf16 copy instead of its value.
static bool reads_bf16_copy(const Var& weight, const Tensor& xv) {
  const Tensor& wv = weight->value;
  HGRN_CHECK(wv.dim() == 2, "linear: weight must be [out, in], got ", shape_str(wv.shape()));
  const int64_t in = wv.size(1);
  HGRN_CHECK(xv.size(-1) == in, "linear: input ", shape_str(xv.shape()), " does not match weight ",
             shape_str(wv.shape()));
  HGRN_CHECK(xv.device() == wv.device(), "linear: input on ", device_name(xv.device()), ", weight on ",
             device_name(wv.device()));
  HGRN_CHECK(xv.is_contiguous() && wv.is_contiguous(), "linear: input and weight must be contiguous");
  // The GPU's one mixed case: bf16 activations with an fp32 master weight (cast below). Otherwise dtypes agree.
  const bool cast_weight = xv.device() == Device::CUDA && xv.dtype() == DType::BF16 && wv.dtype() == DType::F32;
  HGRN_CHECK(cast_weight || xv.dtype() == wv.dtype(), "linear: input is ", dtype_name(xv.dtype()), ", weight is ",
             dtype_name(wv.dtype()));
  return cast_weight;
}

Tensor weight_for_input(const Var& weight, const Tensor& xv) {
  return reads_bf16_copy(weight, xv) ? bf16_weight_copy(weight) : weight->value;
}

const Tensor& bf16_weight_copy(const Var& weight) {
  // The cast happens at the first use after the copy was dropped (recompute_weight_copies, a CPU or ZeRO-1 update,
  // loaded weights), not once per use; the GPU optimiser keeps an existing copy up to date itself.
  if (!weight->compute_copy.defined()) weight->compute_copy = weight->value.to(DType::BF16);
  return weight->compute_copy;
}

// linear_columns' weights as its GEMMs read them: values, or bf16 copies made adjacent (one buffer, cast again
// together whenever they are not: after recompute_weight_copies dropped them, or a copy made alone). The GPU
// optimiser rewrites each copy in place, which keeps them adjacent.
std::vector<Tensor> column_weights_for_input(const std::vector<Var>& weights, const Tensor& xv) {
  HGRN_CHECK(!weights.empty(), "linear_columns: no weights");
  std::vector<Tensor> out;
  const bool cast = reads_bf16_copy(weights[0], xv);
  for (const Var& w : weights) {
    HGRN_CHECK(reads_bf16_copy(w, xv) == cast, "linear_columns: weights '", weights[0]->name, "' and '", w->name,
               "' differ in dtype");
    out.push_back(cast ? w->compute_copy : w->value);
  }
  if (!cast || Tensor::adjacent_rows(out).defined()) return out;
  int64_t rows = 0;
  for (const Var& w : weights) rows += w->value.size(0);
  const Tensor all = Tensor::empty({rows, xv.size(-1)}, DType::BF16, xv.device());
  int64_t row = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const Tensor& value = weights[i]->value;
    Tensor slot = all.rows(row, value.size(0));
    slot.copy_from(value);
    weights[i]->compute_copy = slot;
    out[i] = slot;
    row += value.size(0);
  }
  return out;
}

Tensor linear_product(const Tensor& x, const Tensor& w, const Tensor* residual) {
  const int64_t in = w.size(1), out_features = w.size(0), rows = x.numel() / in;
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  linear_gemm(false, true, rows, out_features, in, x, in, w, in, residual ? 1.0f : 0.0f, y, out_features, residual);
  return y;
}

void linear_input_gradient(const Tensor& dy, const Tensor& w, float beta, Tensor& dx) {
  const int64_t in = w.size(1), out_features = w.size(0), rows = dy.numel() / out_features;
  linear_gemm(false, false, rows, in, out_features, dy, out_features, w, in, beta, dx, in);
}

namespace {
thread_local WeightGradientQueue* open_queue = nullptr;
}  // namespace

WeightGradientQueue::~WeightGradientQueue() {
  if (open_queue == this) open_queue = nullptr;
}

void WeightGradientQueue::open() {
  HGRN_CHECK(open_queue == nullptr, "WeightGradientQueue: another queue is open in this thread");
  open_queue = this;
}

void WeightGradientQueue::run() {
  if (open_queue == this) open_queue = nullptr;
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  for (std::function<void()>& w : work) {
    w();
    w = nullptr;  // its operands go back to the allocator now
  }
}

bool WeightGradientQueue::defer(std::function<void()>&& work) {
  if (!open_queue) return false;
  open_queue->work_.push_back(std::move(work));
  return true;
}

namespace {
// A weight's gradient from `gemm(beta, dw)`: queued while a WeightGradientQueue is open (the operands captured by
// gemm wait with it), then written into the weight's fp32 gradient (beta 0) or added to it (beta 1).
void weight_gradient_into(const Var& weight, std::function<void(float, Tensor&)> gemm) {
  if (WeightGradientQueue::defer([weight, gemm] { weight_gradient_into(weight, gemm); })) return;
  bool accumulate = false;
  Tensor& dw = grad_buffer_for_write(weight, &accumulate);
  gemm(accumulate ? 1.0f : 0.0f, dw);
}
}  // namespace

void linear_weight_gradient(const Tensor& dy, const Tensor& x, const Var& weight) {
  weight_gradient_into(weight, [dy, x](float beta, Tensor& dw) {
    const int64_t in = dw.size(1), out_features = dw.size(0), rows = dy.numel() / out_features;
    linear_gemm(true, false, out_features, in, rows, dy, out_features, x, in, beta, dw, in);
  });
}

void linear_weight_gradient(const Fp8OutputGradient& dy, const Tensor& x, const Var& weight) {
  weight_gradient_into(weight, [dy, x, weight](float beta, Tensor& dw) {
    fp8_linear_weight_gradient(weight, dy, 0, x, beta, dw);
  });
}

void linear_weight_gradient(const Fp8OutputGradient& dy, const Fp8ProducedInput& x, const Var& weight) {
  weight_gradient_into(weight, [dy, x, weight](float beta, Tensor& dw) {
    fp8_linear_weight_gradient_produced(weight, dy, 0, x, beta, dw);
  });
}

// dW's wait for an FP8 projection's input x (when_value_ready): where x's value is gone until its producer's backward
// (an RMSNorm's output), the wait offers to read x as FP8 codes at the input's scale, which that producer then writes
// in place of the value where this is all that waits for it (ops/recompute.h): from_codes runs then, else from_value.
// w: the projection's master block (its first weight's scaling state is the input's).
template <typename FromValue, typename FromCodes>
static void fp8_weight_gradient_when_ready(const Var& x, const Var& weight, const Tensor& w, FromValue from_value,
                                           FromCodes from_codes) {
  Fp8ProducedInput codes;
  if (!x->value.defined() && x->restored_by_producer)
    codes = fp8_produced_input(weight, w, x->released.device, x->released.dtype,
                               shape_numel(x->released.shape) / w.size(1), /*forward=*/false);
  if (!codes.codes.defined()) {
    when_value_ready(x, [xp = x.get(), from_value] { from_value(xp->value); });
    return;
  }
  when_value_or_codes_ready(x, codes.out, [xp = x.get(), codes, from_value, from_codes] {
    if (xp->value.defined())
      from_value(xp->value);
    else
      from_codes(codes);
  });
}

// linear's FP8 form: dy is cast once (row-major for dx, transposed for dW), and dW waits for x as above.
static Var fp8_linear(Tape& tape, const Var& x, const Var& weight, const Var& residual) {
  Var out = op_output(tape, fp8_linear_forward(weight, x->value, weight->value, residual ? &residual->value : nullptr),
                      {x, weight, residual});
  if (!out->requires_grad) return out;
  tape.record([x, weight, residual, out] {
    if (!out->grad.defined()) return;
    const Fp8OutputGradient dy = fp8_output_gradient(weight, out->grad);
    if (wants_grad(x)) {
      bool accumulate = false;
      Tensor& dx = grad_buffer_for_write(x, &accumulate);
      fp8_linear_input_gradient(weight, dy, weight->value, accumulate ? 1.0f : 0.0f, dx);
    }
    if (wants_grad(weight))
      fp8_weight_gradient_when_ready(
          x, weight, weight->value, [dy, weight](const Tensor& xv) { linear_weight_gradient(dy, xv, weight); },
          [dy, weight](const Fp8ProducedInput& xc) { linear_weight_gradient(dy, xc, weight); });
    if (wants_grad(residual)) hand_over_gradient(out, residual);
  });
  return out;
}

Var linear(Tape& tape, const Var& x, const Var& weight, const Var& residual) {
  reads_bf16_copy(weight, x->value);  // the shape, device and dtype checks
  if (fp8_linear_applies(weight, x->value, weight->value)) return fp8_linear(tape, x, weight, residual);
  const Tensor w_compute = weight_for_input(weight, x->value);
  Var out = op_output(tape, linear_product(x->value, w_compute, residual ? &residual->value : nullptr),
                      {x, weight, residual});
  if (!out->requires_grad) return out;
  const bool copied = w_compute.dtype() != weight->value.dtype();
  tape.record([x, weight, residual, out, copied] {
    if (!out->grad.defined()) return;
    const Tensor dy = out->grad;
    // dx: the first gradient to reach x overwrites a fresh buffer (beta 0) instead of adding to a zero-filled one,
    // which would cost a fill and a read of [rows, in].
    if (wants_grad(x)) {
      bool accumulate = false;
      Tensor& dx = grad_buffer_for_write(x, &accumulate);
      linear_input_gradient(dy, copied ? bf16_weight_copy(weight) : weight->value, accumulate ? 1.0f : 0.0f, dx);
    }
    // dW reads x, which may come back only in its producer's backward (an RMSNorm output: ops/recompute.h); dy is
    // kept until then. x outlives the queued work (its producer runs it), so it is held by pointer, not in a cycle.
    if (wants_grad(weight))
      when_value_ready(x, [dy, xp = x.get(), weight] { linear_weight_gradient(dy, xp->value, weight); });
    // Last: dy may become the residual's own gradient buffer (hand_over_gradient).
    if (wants_grad(residual)) hand_over_gradient(out, residual);
  });
  return out;
}

// linear_columns' GEMMs over its weights' column blocks: one, gemm(all parts joined, 0, total width, 0), where
// `parts` (one tensor per weight: the weights, or their gradients) lie adjacent and `join` allows it; else
// gemm(part, its first column, its width, its index) per defined part.
template <typename Gemm>
static void for_column_blocks(const std::vector<Tensor>& parts, const std::vector<int64_t>& widths, bool join,
                              Gemm&& gemm) {
  const Tensor all = join ? Tensor::adjacent_rows(parts) : Tensor();
  if (all.defined()) return gemm(all, int64_t{0}, all.size(0), size_t{0});
  int64_t col = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].defined()) gemm(parts[i], col, widths[i], i);
    col += widths[i];
  }
}

#ifdef HGRN_WITH_CUDA
// Whether the small-batch GEMV writes y's dtype from x's: the same, or fp32 from bf16 (decoding's logits).
static bool gemv_output_fits(const Tensor& x, const Tensor& y) {
  return y.dtype() == x.dtype() || (x.dtype() == DType::BF16 && y.dtype() == DType::F32);
}
#endif

void linear_product_into(const Tensor& x, const std::vector<Tensor>& weights, Tensor& y, bool accumulate) {
  HGRN_CHECK(!weights.empty(), "linear: no weights");
  const int64_t in = x.size(-1), rows = x.numel() / in, width = y.size(-1);
  std::vector<int64_t> widths;
  int64_t total = 0;
  for (const Tensor& w : weights) {
    HGRN_CHECK(w.dim() == 2 && w.size(1) == in && w.is_contiguous() && w.device() == x.device(), "linear: weight ",
               shape_str(w.shape()), " does not fit the input ", shape_str(x.shape()));
    widths.push_back(w.size(0));
    total += w.size(0);
  }
  HGRN_CHECK(x.is_contiguous() && y.is_contiguous() && y.numel() == rows * total && width == total &&
                 y.device() == x.device(),
             "linear: the output buffer ", shape_str(y.shape()), " does not fit the input ", shape_str(x.shape()),
             " and ", total, " output features");
  for_column_blocks(weights, widths, true, [&](const Tensor& w, int64_t col, int64_t n, size_t) {
    Tensor block = y.columns(col, n);
#ifdef HGRN_WITH_CUDA
    // A few rows (decoding's tokens): matrix-vector products that read W once, in place of the GEMM.
    if (y.device() == Device::CUDA && w.dtype() == x.dtype() && gemv_output_fits(x, y) &&
        small_batch_gemv_applies(rows, n, in, x.raw_data(), w.raw_data(), x.dtype())) {
      cuda_small_batch_gemv(x.raw_data(), w.raw_data(), block.raw_data(), y.dtype(), width, rows, n, in, x.dtype(),
                            accumulate);
      return;
    }
#endif
    linear_gemm(false, true, rows, n, in, x, in, w, in, accumulate ? 1.0f : 0.0f, block, width);
  });
}

#ifdef HGRN_WITH_CUDA
// linear_product_into's small-batch GEMVs with the input made from x as they stage it (GemvInput), when they take
// every weight (all checked before any launch); false: nothing was done.
static bool gemv_with_input(const Tensor& x, int64_t rows, int64_t in, const std::vector<Tensor>& weights, Tensor& y,
                            bool accumulate, const GemvInput& input) {
  if (x.device() != Device::CUDA || y.device() != Device::CUDA || !gemv_output_fits(x, y) || !y.is_contiguous())
    return false;
  std::vector<int64_t> widths;
  int64_t total = 0;
  for (const Tensor& w : weights) {
    if (w.dim() != 2 || w.size(1) != in || !w.is_contiguous() || w.device() != x.device() || w.dtype() != x.dtype())
      return false;
    widths.push_back(w.size(0));
    total += w.size(0);
  }
  if (y.size(-1) != total || y.numel() != rows * total) return false;
  bool all = true;
  for_column_blocks(weights, widths, true, [&](const Tensor& w, int64_t, int64_t n, size_t) {
    all = all && small_batch_gemv_applies(rows, n, in, x.raw_data(), w.raw_data(), x.dtype());
  });
  if (!all) return false;
  for_column_blocks(weights, widths, true, [&](const Tensor& w, int64_t col, int64_t n, size_t) {
    cuda_small_batch_gemv(x.raw_data(), w.raw_data(), y.columns(col, n).raw_data(), y.dtype(), total, rows, n, in,
                          x.dtype(), accumulate, &input);
  });
  return true;
}
#endif

void normed_linear_product_into(const Tensor& x, const Tensor& norm_weight, double eps, Tensor& scratch,
                                Tensor& rstd_scratch, const std::vector<Tensor>& weights, Tensor& y, bool accumulate) {
#ifdef HGRN_WITH_CUDA
  const int64_t in = x.dim() >= 1 ? x.size(-1) : 0;
  if (in > 0 && x.is_contiguous() && norm_weight.device() == Device::CUDA && norm_weight.dtype() == DType::F32 &&
      norm_weight.is_contiguous() && norm_weight.numel() == in && eps >= 0) {
    GemvInput input;
    input.norm_weight = norm_weight.data<float>();
    input.eps = static_cast<float>(eps);
    if (gemv_with_input(x, x.numel() / in, in, weights, y, accumulate, input)) return;
  }
#endif
  rmsnorm_forward_into(x, &norm_weight, eps, scratch, rstd_scratch);
  linear_product_into(scratch, weights, y, accumulate);
}

void swiglu_linear_product_into(const Tensor& gate, const Tensor& up, Tensor& scratch,
                                const std::vector<Tensor>& weights, Tensor& y, bool accumulate) {
#ifdef HGRN_WITH_CUDA
  const int64_t in = gate.dim() >= 1 ? gate.size(-1) : 0;
  if (in > 0 && gate.dim() == 2 && gate.is_row_strided() && up.is_row_strided() && up.shape() == gate.shape() &&
      up.dtype() == gate.dtype() && up.device() == gate.device()) {
    GemvInput input;
    input.up = up.raw_data();
    input.x_stride = gate.row_stride();
    input.up_stride = up.row_stride();
    const int64_t pack = 16 / static_cast<int64_t>(dtype_size(gate.dtype()));
    if (input.x_stride % pack == 0 && input.up_stride % pack == 0 &&
        reinterpret_cast<uintptr_t>(input.up) % 16 == 0 &&
        gemv_with_input(gate, gate.size(0), in, weights, y, accumulate, input))
      return;
  }
#endif
  swiglu_forward(gate, &up, scratch);
  linear_product_into(scratch, weights, y, accumulate);
}

// dW_i (+)= dy[:, columns of W_i]ᵀ·x for linear_columns: one GEMM where the gradients are adjacent and all fresh or
// all accumulating, else one per weight; product(dw, first column, width, beta) makes one.
template <typename Product>
static void columns_weight_gradient(const std::vector<Var>& weights, const std::vector<int64_t>& widths,
                                    Product&& product) {
  const int64_t in = weights[0]->value.size(1), width = std::accumulate(widths.begin(), widths.end(), int64_t{0});
  bool first_gradients = true;
  for (const Var& w : weights) first_gradients = first_gradients && wants_grad(w) && !w->grad.defined();
  if (first_gradients) {  // one buffer, so that they are adjacent for this GEMM and every later one
    const Tensor all = Tensor::empty({width, in}, weights[0]->value.dtype(), weights[0]->value.device());
    int64_t row = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i]->grad = all.rows(row, widths[i]);
      weights[i]->grad_stale = true;  // holds no gradient yet: the GEMM below overwrites it
      row += widths[i];
    }
  }
  std::vector<Tensor> grads;
  std::vector<char> accumulate;
  for (const Var& w : weights) {
    bool add = false;
    grads.push_back(wants_grad(w) ? grad_buffer_for_write(w, &add) : Tensor());
    accumulate.push_back(add);
  }
  bool same = true;
  for (char a : accumulate) same = same && a == accumulate[0];
  for_column_blocks(grads, widths, same, [&](Tensor dw, int64_t col, int64_t n, size_t i) {
    product(dw, col, n, accumulate[i] ? 1.0f : 0.0f);
  });
}

// columns_weight_gradient's GEMMs from dy [rows, Σ out_i] and x [rows, in], or from dy's FP8 codes; while a
// WeightGradientQueue is open they wait in it with their operands, as linear_weight_gradient's.
static void columns_weight_gradient(const Tensor& dy, const Tensor& x, const std::vector<Var>& weights,
                                    const std::vector<int64_t>& widths) {
  if (WeightGradientQueue::defer([dy, x, weights, widths] { columns_weight_gradient(dy, x, weights, widths); }))
    return;
  const int64_t in = x.size(-1), width = dy.size(-1), rows = dy.numel() / width;
  columns_weight_gradient(weights, widths, [&](Tensor& dw, int64_t col, int64_t n, float beta) {
    linear_gemm(true, false, n, in, rows, dy.columns(col, n), width, x, in, beta, dw, in);
  });
}

static void columns_weight_gradient(const Fp8OutputGradient& dy, const Tensor& x, const std::vector<Var>& weights,
                                    const std::vector<int64_t>& widths) {
  if (WeightGradientQueue::defer([dy, x, weights, widths] { columns_weight_gradient(dy, x, weights, widths); }))
    return;
  columns_weight_gradient(weights, widths, [&](Tensor& dw, int64_t col, int64_t, float beta) {
    fp8_linear_weight_gradient(weights[0], dy, col, x, beta, dw);
  });
}

static void columns_weight_gradient(const Fp8OutputGradient& dy, const Fp8ProducedInput& x,
                                    const std::vector<Var>& weights, const std::vector<int64_t>& widths) {
  if (WeightGradientQueue::defer([dy, x, weights, widths] { columns_weight_gradient(dy, x, weights, widths); }))
    return;
  columns_weight_gradient(weights, widths, [&](Tensor& dw, int64_t col, int64_t, float beta) {
    fp8_linear_weight_gradient_produced(weights[0], dy, col, x, beta, dw);
  });
}

// The blocks' gradient as the E5M2 codes their consumer wrote (SplitGradient::fp8_gradient; swiglu_linear), its
// transpose made for dW where wanted; false where it was written in the act dtype.
static bool take_written_fp8_gradient(const std::vector<Var>& blocks, bool transpose, Fp8OutputGradient& dy) {
  SplitGradient* split = blocks[0]->split.get();
  if (!split || !split->fp8_gradient) return false;
  for (const Var& b : blocks)
    HGRN_CHECK(!b->grad.defined(), "linear_columns: '", b->name,
               "' got a gradient besides the FP8 codes that swiglu_linear wrote for every block: under FP8, the "
               "column blocks swiglu_linear reads must have no other consumer");
  dy = std::move(*split->fp8_gradient);
  split->fp8_gradient.reset();
  if (transpose) fp8_output_gradient_transpose(dy);
  return true;
}

// linear_columns' FP8 form over the weights' adjacent master values w_all [Σ out_i, in], which share one scaling
// state (the first weight's). A consumer of every block may write their gradient as FP8 codes (SplitGradient).
static std::vector<Var> fp8_linear_columns(Tape& tape, const Var& x, const std::vector<Var>& weights,
                                           const Tensor& w_all, const std::vector<int64_t>& widths, bool records) {
  const Tensor y = fp8_linear_forward(weights[0], x->value, w_all, nullptr);
  std::vector<Var> blocks = column_block_outputs(y, widths, records);
  if (!records) return blocks;
  blocks[0]->split->fp8_weight = weights[0];
  bool weight_grads = false;
  for (const Var& w : weights) weight_grads = weight_grads || wants_grad(w);
  tape.record([x, weights, w_all, widths, blocks, weight_grads] {
    Fp8OutputGradient dy;
    if (!take_written_fp8_gradient(blocks, weight_grads, dy)) {
      const Tensor dy_tensor = gather_column_gradients(blocks);
      if (!dy_tensor.defined()) return;
      dy = fp8_output_gradient(weights[0], dy_tensor);
    }
    if (wants_grad(x)) {
      bool accumulate = false;
      Tensor& dx = grad_buffer_for_write(x, &accumulate);
      fp8_linear_input_gradient(weights[0], dy, w_all, accumulate ? 1.0f : 0.0f, dx);
    }
    if (weight_grads)
      fp8_weight_gradient_when_ready(
          x, weights[0], w_all,
          [dy, weights, widths](const Tensor& xv) { columns_weight_gradient(dy, xv, weights, widths); },
          [dy, weights, widths](const Fp8ProducedInput& xc) { columns_weight_gradient(dy, xc, weights, widths); });
  });
  return blocks;
}

std::vector<Var> linear_columns(Tape& tape, const Var& x, const std::vector<Var>& weights) {
  HGRN_CHECK(x, "linear_columns: input is null");
  const Tensor& xv = x->value;
  if (!weights.empty() && fp8_linear_active()) {
    std::vector<Tensor> values;
    std::vector<int64_t> widths;
    bool weight_grads = false;
    for (const Var& w : weights) {
      reads_bf16_copy(w, xv);
      values.push_back(w->value);
      widths.push_back(w->value.size(0));
      weight_grads = weight_grads || wants_grad(w);
    }
    const Tensor w_all = Tensor::adjacent_rows(values);
    if (w_all.defined() && fp8_linear_applies(weights[0], xv, w_all))
      return fp8_linear_columns(tape, x, weights, w_all, widths, tape.enabled() && (wants_grad(x) || weight_grads));
  }
  const std::vector<Tensor> w = column_weights_for_input(weights, xv);
  std::vector<int64_t> widths;
  int64_t width = 0;
  for (const Tensor& wi : w) widths.push_back(wi.size(0)), width += wi.size(0);
  Shape out_shape = xv.shape();
  out_shape.back() = width;
  Tensor y = Tensor::empty(out_shape, xv.dtype(), xv.device());
  linear_product_into(xv, w, y, /*accumulate=*/false);
  bool weight_grads = false;
  for (const Var& wv : weights) weight_grads = weight_grads || wants_grad(wv);
  const bool records = tape.enabled() && (wants_grad(x) || weight_grads);
  std::vector<Var> blocks = column_block_outputs(y, widths, records);
  if (!records) return blocks;
  tape.record([x, weights, widths, blocks, weight_grads] {
    const Tensor dy = gather_column_gradients(blocks);
    if (!dy.defined()) return;
    const int64_t in = weights[0]->value.size(1), width = dy.size(-1), rows = dy.numel() / width;
    if (wants_grad(x)) {
      bool accumulate = false;
      Tensor& dx = grad_buffer_for_write(x, &accumulate);
      for_column_blocks(column_weights_for_input(weights, dx), widths, true,
                        [&](const Tensor& wi, int64_t col, int64_t n, size_t) {
                          linear_gemm(false, false, rows, in, n, dy.columns(col, n), width, wi, in,
                                      accumulate || col > 0 ? 1.0f : 0.0f, dx, in);
                        });
    }
    // dW reads x, which may come back only in its producer's backward (ops/recompute.h); dy is kept until then.
    if (weight_grads)
      when_value_ready(x, [dy, xp = x.get(), weights, widths] {
        columns_weight_gradient(dy, xp->value, weights, widths);
      });
  });
  return blocks;
}

}  // namespace hgrn
