// linear_cross_entropy.cpp: the chunked GPU head + loss (see linear_cross_entropy.h) and its CPU composition.
#include "ops/linear_cross_entropy.h"

#include <algorithm>
#include <memory>

#include "ops/elementwise.h"
#include "ops/linear.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cross_entropy.h"
#endif

namespace hgrn {

namespace {
constexpr int64_t kChunkLogitBytes = 256 << 20;

#ifdef HGRN_WITH_CUDA
// What the backward needs: per-row log-sum-exp and targets (-1: ignored), the input and weight as the GEMMs read them.
struct HeadSaved {
  Tensor log_sum_exp, row_target, x, w;
  int64_t rows = 0, vocab = 0, width = 0, chunk = 0, num_targets = 0;
};

// The logits of rows [r0, r0 + n) into `logits` ([n, vocab] at its start).
void chunk_logits(const HeadSaved& s, int64_t r0, int64_t n, Tensor& logits) {
  linear_gemm(false, true, n, s.vocab, s.width, s.x.flat_view(r0 * s.width, n * s.width), s.width, s.w, s.width, 0.0f,
              logits, s.vocab);
}

CrossEntropyResult linear_cross_entropy_cuda(Tape& tape, const Var& x, const Var& weight, const Tensor& targets,
                                             int64_t ignore_index, int64_t chunk_rows) {
  auto s = std::make_shared<HeadSaved>();
  s->w = weight_for_input(weight, x->value);
  s->vocab = s->w.size(0);
  s->width = s->w.size(1);
  s->rows = x->value.numel() / s->width;
  s->x = x->value.reshape({s->rows, s->width});
  const DType act = s->x.dtype();
  HGRN_CHECK(targets.defined() && (targets.dtype() == DType::I32 || targets.dtype() == DType::I64) &&
                 targets.device() == Device::CUDA && targets.is_contiguous() && targets.numel() == s->rows,
             "linear_cross_entropy: targets must be a contiguous int32/int64 GPU tensor of ", s->rows,
             " elements (one per row of x)");
  const int64_t auto_rows = std::max<int64_t>(1, kChunkLogitBytes / (s->vocab * static_cast<int64_t>(dtype_size(act))));
  s->chunk = std::min(s->rows, chunk_rows > 0 ? chunk_rows : auto_rows);
  s->log_sum_exp = Tensor::empty({s->rows}, DType::F32, Device::CUDA);
  s->row_target = Tensor::empty({s->rows}, DType::I32, Device::CUDA);
  Tensor logits = Tensor::empty({std::max<int64_t>(s->chunk, 1) * s->vocab}, act, Device::CUDA);
  Tensor chunk_loss = Tensor::empty({}, DType::F32, Device::CUDA);
  Tensor scratch = Tensor::empty({static_cast<int64_t>((cross_entropy_scratch_bytes(s->chunk) + 7) / 8)}, DType::I64,
                                 Device::CUDA);
  const char* target_bytes = static_cast<const char*>(targets.raw_data());
  double loss_sum = 0;  // the chunks' summed losses, added in chunk order
  int64_t num_correct = 0;
  for (int64_t r0 = 0; r0 < s->rows; r0 += s->chunk) {
    const int64_t n = std::min(s->chunk, s->rows - r0);
    chunk_logits(*s, r0, n, logits);
    const CrossEntropyCounts counts = cross_entropy_forward_cuda(
        logits.raw_data(), act, target_bytes + r0 * static_cast<int64_t>(dtype_size(targets.dtype())),
        targets.dtype(), n, s->vocab, ignore_index, chunk_loss.data<float>(), s->log_sum_exp.data<float>() + r0,
        s->row_target.data<int32_t>() + r0, scratch.raw_data());
    HGRN_CHECK(counts.bad_row < 0, "cross_entropy: target ", counts.bad_target, " in row ", r0 + counts.bad_row,
               " is out of range for vocab size ", s->vocab, " (ignore_index is ", ignore_index, ")");
    s->num_targets += counts.num_targets;
    num_correct += counts.num_correct;
    if (counts.num_targets > 0) loss_sum += chunk_loss.item() * static_cast<double>(counts.num_targets);
  }
  const double mean = s->num_targets > 0 ? loss_sum / static_cast<double>(s->num_targets) : 0.0;
  Var out = op_output(tape, on_device(Tensor::full({}, mean, DType::F32), Device::CUDA), {x, weight});
  if (out->requires_grad) {
    tape.record([x, weight, out, s] {
      if (!out->grad.defined() || s->num_targets == 0) return;  // no target: zero gradients, nothing to add
      Tensor chunk = Tensor::empty({s->chunk * s->vocab}, s->x.dtype(), Device::CUDA);
      Tensor dx = wants_grad(x) ? grad_buffer(x).reshape({s->rows, s->width}) : Tensor();
      for (int64_t r0 = 0; r0 < s->rows; r0 += s->chunk) {
        const int64_t n = std::min(s->chunk, s->rows - r0);
        chunk_logits(*s, r0, n, chunk);
        cross_entropy_backward_cuda(chunk.raw_data(), chunk.dtype(), s->log_sum_exp.data<float>() + r0,
                                    s->row_target.data<int32_t>() + r0, out->grad.data<float>(), s->num_targets,
                                    chunk.raw_data(), n, s->vocab, /*accumulate=*/false);
        if (dx.defined()) {
          Tensor dx_rows = dx.flat_view(r0 * s->width, n * s->width);
          linear_gemm(false, false, n, s->width, s->vocab, chunk, s->vocab, s->w, s->width, 1.0f, dx_rows, s->width);
        }
        if (wants_grad(weight))
          linear_gemm(true, false, s->vocab, s->width, n, chunk, s->vocab, s->x.flat_view(r0 * s->width, n * s->width),
                      s->width, 1.0f, grad_buffer(weight), s->width);
      }
    });
  }
  return {out, s->num_targets, num_correct};
}
#endif
}  // namespace

CrossEntropyResult linear_cross_entropy(Tape& tape, const Var& x, const Var& weight, const Tensor& targets,
                                        int64_t ignore_index, int64_t chunk_rows) {
  HGRN_CHECK(x && weight, "linear_cross_entropy: x or weight is null");
  HGRN_CHECK(chunk_rows >= 0, "linear_cross_entropy: chunk_rows must be >= 0, got ", chunk_rows);
  if (x->value.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    return linear_cross_entropy_cuda(tape, x, weight, targets, ignore_index, chunk_rows);
#endif
  }
  const int64_t width = weight->value.size(-1);
  Var rows = reshape(tape, x, {x->value.numel() / std::max<int64_t>(width, 1), width});
  return cross_entropy(tape, linear(tape, rows, weight), targets, ignore_index);
}

}  // namespace hgrn
