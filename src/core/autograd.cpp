// autograd.cpp: the tape and gradient buffers.
#include "core/autograd.h"

namespace hgrn {

Var make_var(Tensor value, bool requires_grad, std::string name) {
  auto v = std::make_shared<Variable>();
  v->value = std::move(value);
  v->requires_grad = requires_grad;
  v->name = std::move(name);
  return v;
}

void release_value(const Var& v) {
  HGRN_CHECK(v && v->value.defined(), "release_value: the value is missing (released twice?)");
  v->released = {v->value.shape(), v->value.dtype(), v->value.device()};
  v->value = Tensor();
}

namespace {
// What v's gradient is made like: its value, or the value release_value freed.
struct GradientLayout {
  Shape shape;
  DType dtype;
  Device device;
};
GradientLayout gradient_layout(const Var& v) {
  if (v->value.defined()) return {v->value.shape(), v->value.dtype(), v->value.device()};
  return {v->released.shape, v->released.dtype, v->released.device};
}

Tensor new_gradient(const Var& v, bool zero) {
  const GradientLayout l = gradient_layout(v);
  return zero ? Tensor::zeros(l.shape, l.dtype, l.device) : Tensor::empty(l.shape, l.dtype, l.device);
}

// A gradient adopted from elsewhere (adopt_gradient) becomes v's own copy before anything writes into it,
// unless nothing else holds its storage any more (a queued closure that read it has run and let it go).
void unshare_grad(const Var& v) {
  if (!v->grad_shared) return;
  v->grad_shared = false;
  if (v->grad.defined() && v->grad.storage_shared()) v->grad = v->grad.clone();
}
}  // namespace

Tensor& grad_buffer(const Var& v) {
  unshare_grad(v);
  settle_grad(v);
  if (!v->grad.defined()) v->grad = new_gradient(v, true);
  return v->grad;
}

Tensor& grad_buffer_for_write(const Var& v, bool* accumulate, GradLayout layout) {
  unshare_grad(v);
  *accumulate = v->grad.defined() && !v->grad_stale;
  if (!v->grad.defined() && v->split && layout == GradLayout::RowStrided) {
    SplitGradient& s = *v->split;
    if (!s.buffer.defined()) s.buffer = Tensor::empty(s.shape, s.dtype, s.device);
    const GradientLayout l = gradient_layout(v);
    v->grad = s.buffer.columns(v->split_column, l.shape.back());
    HGRN_CHECK(v->grad.shape() == l.shape && s.dtype == l.dtype && s.device == l.device, "grad_buffer_for_write: '",
               v->name, "' (", shape_str(l.shape), ") does not fit its split's gradient ", shape_str(s.shape));
  }
  if (!v->grad.defined()) v->grad = new_gradient(v, false);
  v->grad_stale = false;
  return v->grad;
}

bool adopt_gradient(const Var& v, Tensor&& g) {
  if (!v->from_op || v->grad.defined()) return false;
  const GradientLayout l = gradient_layout(v);
  HGRN_CHECK(g.shape() == l.shape && g.dtype() == l.dtype && g.device() == l.device, "adopt_gradient: ",
             dtype_name(g.dtype()), " ", shape_str(g.shape()), " on ", device_name(g.device()), " does not fit '",
             v->name, "', ", dtype_name(l.dtype), " ", shape_str(l.shape), " on ", device_name(l.device));
  v->grad = std::move(g);
  v->grad_shared = true;
  return true;
}

void mark_grad_zero(const Var& v) {
  if (!v->grad.defined()) return;
  v->grad_stale = true;
  // On the GPU a block given back is reused at once by the next forward's activations (one stream: nothing still
  // queued can read it after its reuse); a CPU buffer would go back to malloc, so it is kept.
  if (v->grad.device() == Device::CUDA && !v->grad_buffer_fixed) v->grad = Tensor();
}

bool has_gradient(const Var& v) { return v->grad.defined() || v->grad_stale; }

void settle_grad(const Var& v) {
  if (!v->grad_stale) return;
  v->grad_stale = false;
  if (v->grad.defined())
    v->grad.zero();
  else
    v->grad = new_gradient(v, true);
}

void Tape::record(std::function<void()> backward_fn) {
  if (enabled_) backward_fns_.push_back(std::move(backward_fn));
}

void Tape::backward(const Var& out, const Tensor& seed) {
  HGRN_CHECK(out->requires_grad, "backward from '", out->name, "', which does not require a gradient");
  Tensor& g = grad_buffer(out);
  if (seed.defined()) {
    g.copy_from(seed);
  } else {
    g.fill(1.0);
  }
  // Each closure is destroyed as soon as it has run: it releases the activations it saved and its references to
  // intermediate Vars, so activations and their gradients are freed progressively during the backward instead of
  // all at its end (on the GPU this halves the peak memory of a training step).
  for (auto it = backward_fns_.rbegin(); it != backward_fns_.rend(); ++it) {
    (*it)();
    *it = nullptr;
  }
  backward_fns_.clear();
}

Var op_output(Tape& tape, Tensor value, std::initializer_list<Var> inputs) {
  bool needs = false;
  if (tape.enabled())
    for (const Var& v : inputs) needs = needs || wants_grad(v);
  Var out = make_var(std::move(value), needs);
  out->from_op = true;
  return out;
}

std::vector<Var> column_block_outputs(const Tensor& whole, const std::vector<int64_t>& widths, bool requires_grad) {
  HGRN_CHECK(whole.is_contiguous() && whole.dim() >= 1, "column blocks of a tensor that is not contiguous: ",
             shape_str(whole.shape()));
  int64_t total = 0;
  for (int64_t w : widths) {
    HGRN_CHECK(w >= 0, "column blocks: negative width ", w);
    total += w;
  }
  HGRN_CHECK(total == whole.size(-1), "column blocks: widths sum to ", total, ", the last axis is ", whole.size(-1));
  auto split = std::make_shared<SplitGradient>();
  split->shape = whole.shape();
  split->dtype = whole.dtype();
  split->device = whole.device();
  std::vector<Var> blocks;
  int64_t column = 0;
  for (int64_t w : widths) {
    Var block = make_var(whole.columns(column, w), requires_grad);
    block->from_op = true;
    if (requires_grad) {
      block->split = split;
      block->split_column = column;
    }
    blocks.push_back(std::move(block));
    column += w;
  }
  return blocks;
}

Tensor gather_column_gradients(const std::vector<Var>& blocks) {
  bool any = false;
  for (const Var& b : blocks) any = any || b->grad.defined();
  if (!any) return Tensor();
  HGRN_CHECK(blocks[0]->split, "gather_column_gradients: the Vars are not column blocks");
  SplitGradient& s = *blocks[0]->split;
  if (!s.buffer.defined()) s.buffer = Tensor::empty(s.shape, s.dtype, s.device);
  for (const Var& b : blocks) {
    HGRN_CHECK(b->split.get() == &s, "gather_column_gradients: blocks of different tensors");
    Tensor home = s.buffer.columns(b->split_column, gradient_layout(b).shape.back());
    if (!b->grad.defined())
      home.zero();
    else if (b->grad.raw_data() != home.raw_data() || b->grad.strides() != home.strides())
      home.copy_from(b->grad);  // a gradient written elsewhere (contiguous): into place
    b->grad = Tensor();
  }
  Tensor g = std::move(s.buffer);
  s.buffer = Tensor();
  return g;
}

}  // namespace hgrn
