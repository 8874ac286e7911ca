// rotary_embedding.cpp: the rotary position embedding, forward and backward: the CPU reference here, the GPU through
// kernels/rotary_embedding.h, both on the RotaryRows layout (queries and keys, or a state's key axis).
#include "ops/rotary_embedding.h"

#include <cmath>
#include <type_traits>

#include "kernels/rotary_embedding.h"
#include "ops/cpu_parallel.h"

namespace hgrn {
namespace {

// out (+)= the rotation of in (RotaryRows). The angle p·θᵢ (rotary_frequency) in A: fp64 for fp64 tensors, fp32
// otherwise, as fla's fp32 tables.
template <typename T>
void rotary_cpu(const T* in, T* out, bool add, const RotaryRows& d) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t half = d.head_dim / 2, width = d.row_width();
  const int64_t in_stride = d.in_stride ? d.in_stride : width, out_stride = d.out_stride ? d.out_stride : width;
#pragma omp parallel for schedule(static) if (d.rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < d.rows; ++r) {
    const A position = static_cast<A>(d.first_position + r % d.time);
    const T* x = in + r * in_stride;
    T* y = out + r * out_stride;
    for (int64_t i = 0; i < half; ++i) {
      const A angle = position * rotary_frequency<A>(i, d.head_dim);
      const T c = static_cast<T>(std::cos(angle)), s = static_cast<T>(d.inverse ? -std::sin(angle) : std::sin(angle));
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t w = 0; w < d.inner; ++w) {
          const int64_t e0 = (h * d.head_dim + i) * d.inner + w, e1 = e0 + half * d.inner;
          const T x0 = x[e0], x1 = x[e1];
          const T y0 = x0 * c - x1 * s, y1 = x0 * s + x1 * c;
          y[e0] = add ? y[e0] + y0 : y0;
          y[e1] = add ? y[e1] + y1 : y1;
        }
    }
  }
}

void rotate(const Tensor& in, Tensor& out, bool add, const RotaryRows& d) {
  if (in.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    HGRN_CHECK(d.head_dim <= 2 * kMaxRotaryPairs, "rotary_embedding: the GPU takes heads up to ", 2 * kMaxRotaryPairs,
               " wide (as fla), got ", d.head_dim);
    RotaryFrequencies f{};
    for (int64_t i = 0; i < d.head_dim / 2; ++i) f.inv_freq[i] = rotary_frequency<float>(i, d.head_dim);
    cuda_rotary_embedding(in.raw_data(), out.raw_data(), add, d, f, in.dtype());
    return;
#else
    throw Error("rotary_embedding: this hgrn was built without CUDA");
#endif
  }
  HGRN_DISPATCH_FLOAT(in.dtype(), "rotary_embedding",
                      [&] { rotary_cpu(in.data<scalar_t>(), out.data<scalar_t>(), add, d); });
}

// The op on x viewed as d, into a fresh contiguous tensor of x's shape (or over x itself: in_place); the backward
// rotates the output's gradient back into x's. strided_rows: d's rows are x's last-axis rows, x->value.row_stride()
// apart (a column block of a fused projection, whose gradient is then written in place); else x is contiguous.
// In place is safe for both devices' loops: each pair is read whole before it is written, by the one thread.
Var rotary_op(Tape& tape, const Var& x, RotaryRows d, bool strided_rows, bool in_place, const char* op) {
  const Tensor& xv = x->value;
  HGRN_CHECK(xv.device() == Device::CPU || xv.dtype() == DType::F32 || xv.dtype() == DType::BF16, op,
             ": a GPU tensor must be fp32 or bf16, got ", dtype_name(xv.dtype()));
  Tensor y = in_place ? xv : Tensor::empty(xv.shape(), xv.dtype(), xv.device());
  d.in_stride = strided_rows ? xv.row_stride() : 0;
  d.out_stride = in_place ? d.in_stride : 0;
  rotate(xv, y, /*add=*/false, d);
  Var out = op_output(tape, y, {x});
  if (!out->requires_grad) return out;
  tape.record([x, out, d, strided_rows, op] {
    if (!out->grad.defined() || !wants_grad(x)) return;
    HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(), op,
               " backward: the output's gradient must be contiguous ", dtype_name(out->value.dtype()));
    bool add = false;
    Tensor& dx = grad_buffer_for_write(x, &add, strided_rows ? GradLayout::RowStrided : GradLayout::Contiguous);
    RotaryRows back = d;
    back.inverse = !d.inverse;
    back.in_stride = 0;
    back.out_stride = strided_rows ? dx.row_stride() : 0;
    rotate(out->grad, dx, add, back);
  });
  return out;
}

Var rotary_embedding_op(Tape& tape, const Var& x, int64_t num_heads, int64_t first_position, bool in_place) {
  HGRN_CHECK(x, "rotary_embedding: input is null");
  const Tensor& xv = x->value;
  HGRN_CHECK(xv.dim() == 3 && num_heads > 0 && xv.size(2) % num_heads == 0 && xv.size(2) / num_heads % 2 == 0,
             "rotary_embedding: x must be [B, T, H*K] with ", num_heads, " heads of an even width K, got ",
             shape_str(xv.shape()));
  HGRN_CHECK(xv.is_row_strided(), "rotary_embedding: x must be contiguous or row-strided");
  RotaryRows d;
  d.rows = xv.size(0) * xv.size(1);
  d.time = xv.size(1);
  d.heads = num_heads;
  d.head_dim = xv.size(2) / num_heads;
  d.first_position = first_position;
  if (d.rows == 0 || d.time == 0) d.time = 1;  // an empty batch: nothing to rotate
  return rotary_op(tape, x, d, /*strided_rows=*/true, in_place, "rotary_embedding");
}

}  // namespace

Var rotary_embedding(Tape& tape, const Var& x, int64_t num_heads, int64_t first_position) {
  return rotary_embedding_op(tape, x, num_heads, first_position, /*in_place=*/false);
}

Var rotary_embedding_in_place(Tape& tape, const Var& x, int64_t num_heads, int64_t first_position) {
  return rotary_embedding_op(tape, x, num_heads, first_position, /*in_place=*/true);
}

Var rotary_state_shift(Tape& tape, const Var& state, int64_t shift) {
  HGRN_CHECK(state, "rotary_state_shift: state is null");
  const Tensor& sv = state->value;
  HGRN_CHECK(sv.dim() == 4 && sv.size(2) % 2 == 0, "rotary_state_shift: state must be [B, H, K, V] with K even, got ",
             shape_str(sv.shape()));
  HGRN_CHECK(sv.is_contiguous(), "rotary_state_shift: state must be contiguous");
  RotaryRows d;
  d.rows = sv.size(0);
  d.time = 1;
  d.heads = sv.size(1);
  d.head_dim = sv.size(2);
  d.inner = sv.size(3);
  d.first_position = shift;
  return rotary_op(tape, state, d, /*strided_rows=*/false, /*in_place=*/false, "rotary_state_shift");
}

}  // namespace hgrn
