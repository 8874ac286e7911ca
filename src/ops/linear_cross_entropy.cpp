// linear_cross_entropy.cpp: the chunked GPU head + loss (see linear_cross_entropy.h) and its CPU composition.
#include "ops/linear_cross_entropy.h"

#include <algorithm>
#include <vector>

#include "ops/elementwise.h"
#include "ops/fp8_linear.h"
#include "ops/linear.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#endif

namespace hgrn {

namespace {
constexpr int64_t kChunkLogitBytes = 256 << 20;
}  // namespace

// Rows per chunk: as few chunks as keep each one's logits within kChunkLogitBytes, made about equal (rounded up to
// whole 128-row GEMM tiles where that stays within the budget). Filling chunks to the budget left a short last chunk
// whose GEMMs ran far below the others' rate (385m: 752 of 32768 rows took 387 us against ~1110 us per 2668 rows).
int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t row_bytes) {
  const int64_t max_rows = std::max<int64_t>(1, kChunkLogitBytes / row_bytes);
  if (rows <= max_rows) return std::max<int64_t>(rows, 1);
  const int64_t chunks = (rows + max_rows - 1) / max_rows;
  const int64_t even = (rows + chunks - 1) / chunks, tiled = (even + 127) / 128 * 128;
  return tiled <= max_rows ? tiled : even;
}

namespace {
#ifdef HGRN_WITH_CUDA

CrossEntropyResult linear_cross_entropy_cuda(Tape& tape, const Var& x, const Var& weight, const Tensor& targets,
                                             int64_t ignore_index, int64_t chunk_rows) {
  const int64_t vocab = weight->value.size(0), width = weight->value.size(1), rows = x->value.numel() / width;
  const Tensor xr = x->value.reshape({rows, width});
  const DType act = xr.dtype();
  HGRN_CHECK(targets.defined() && (targets.dtype() == DType::I32 || targets.dtype() == DType::I64) &&
                 targets.device() == Device::CUDA && targets.is_contiguous() && targets.numel() == rows,
             "linear_cross_entropy: targets must be a contiguous int32/int64 GPU tensor of ", rows,
             " elements (one per row of x)");
  // FP8 (ops/fp8_linear.h): the three GEMMs on FP8 tensor cores, each chunk's dlogits cast to FP8 beside it (two
  // more bytes an element, so the chunks hold half the rows for the same memory). Every chunk's rows must then be a
  // multiple of 16, as the whole is.
  const bool fp8 = fp8_linear_applies(weight, xr, weight->value) && (chunk_rows == 0 || chunk_rows % 16 == 0);
  const Tensor w = fp8 ? weight->value : weight_for_input(weight, x->value);
  const int64_t row_bytes = vocab * static_cast<int64_t>(dtype_size(act) + (fp8 ? 2 : 0));
  int64_t chunk = chunk_rows > 0 ? std::min(rows, chunk_rows) : linear_cross_entropy_chunk_rows(rows, row_bytes);
  if (fp8 && chunk < rows) chunk = std::max<int64_t>(16, chunk / 16 * 16);
  const bool records = tape.enabled() && (wants_grad(x) || wants_grad(weight));
  // The gradient is computed here, from each chunk's logits while they exist, rather than by computing the logits
  // again in the backward (one GEMM fewer). The factor dloss / num_targets is not known yet: each chunk's
  // dlogits = softmax − onehot is unscaled, dx and dW are kept unscaled in fp32, and the backward scales them into
  // the gradients (one rounding to x's dtype, as a single GEMM would do).
  const auto fp32_buffer = [](int64_t r, int64_t c) { return Tensor::empty({r, c}, DType::F32, Device::CUDA); };
  Tensor dx_unscaled = records && wants_grad(x) ? fp32_buffer(rows, width) : Tensor();
  Tensor dw_unscaled = records && wants_grad(weight) ? fp32_buffer(vocab, width) : Tensor();
  // dloss 1 for the backward kernel: made (a host-to-device copy) only where the one-pass kernel does not fit.
  Tensor one;
  Tensor log_sum_exp = Tensor::empty({rows}, DType::F32, Device::CUDA);
  Tensor row_target = Tensor::empty({rows}, DType::I32, Device::CUDA);
  Tensor logits = Tensor::empty({std::max<int64_t>(chunk, 1) * vocab}, act, Device::CUDA);
  // Each chunk's loss and counts get their own device slots, read back once after the loop: the chunks' kernels queue
  // up without a host round trip between them (a bad target is reported then; its row was treated as ignored).
  const int64_t num_chunks = rows > 0 ? (rows + chunk - 1) / chunk : 0;
  Tensor chunk_losses = Tensor::empty({std::max<int64_t>(num_chunks, 1)}, DType::F32, Device::CUDA);
  Tensor chunk_counts =
      Tensor::empty({std::max<int64_t>(num_chunks, 1) * kCrossEntropyCountSlots}, DType::I64, Device::CUDA);
  Tensor scratch = Tensor::empty({static_cast<int64_t>((cross_entropy_scratch_bytes(chunk) + 7) / 8)}, DType::I64,
                                 Device::CUDA);
  const char* target_bytes = static_cast<const char*>(targets.raw_data());
  Tensor w_codes_transposed;  // FP8: Wᵀ's codes for every chunk's dx, transposed once after the first forward
  for (int64_t r0 = 0, i = 0; r0 < rows; r0 += chunk, ++i) {
    const int64_t n = std::min(chunk, rows - r0);
    const Tensor x_rows = xr.flat_view(r0 * width, n * width);
    Tensor chunk_logits = logits.flat_view(0, n * vocab).reshape({n, vocab});
    if (fp8)
      fp8_linear_forward_into(weight, x_rows, w, chunk_logits);
    else
      linear_gemm(false, true, n, vocab, width, x_rows, width, w, width, 0.0f, logits, vocab);
    const void* chunk_targets = target_bytes + r0 * static_cast<int64_t>(dtype_size(targets.dtype()));
    float* chunk_loss = chunk_losses.data<float>() + i;
    int64_t* chunk_count_slots = chunk_counts.data<int64_t>() + i * kCrossEntropyCountSlots;
    int32_t* chunk_row_target = row_target.data<int32_t>() + r0;
    float* chunk_lse = log_sum_exp.data<float>() + r0;
    // dlogits (unscaled) in place of the logits, in the loss's own pass over them where a row fits in shared memory
    // (else by the backward kernel), then this chunk's share of dx and of the sum over rows of dW. FP8: that pass
    // writes dlogits as E5M2 codes instead, once their scale exists (fp8_output_gradient_codes).
    Fp8OutputGradient dlogits;
    const Fp8CodesOut dlogits_codes =
        fp8 && records ? fp8_output_gradient_codes(weight, n, vocab, dlogits) : Fp8CodesOut{};
    const bool fused = records && cross_entropy_forward_gradient_cuda(
                                      logits.raw_data(), act, chunk_targets, targets.dtype(), n, vocab, ignore_index,
                                      chunk_loss, chunk_lse, chunk_row_target, chunk_count_slots, scratch.raw_data(),
                                      dlogits_codes.codes ? &dlogits_codes : nullptr);
    if (!fused)
      cross_entropy_forward_cuda(logits.raw_data(), act, chunk_targets, targets.dtype(), n, vocab, ignore_index,
                                 chunk_loss, chunk_lse, chunk_row_target, chunk_count_slots, scratch.raw_data());
    if (!records) continue;
    if (!fused) {
      if (!one.defined()) one = on_device(Tensor::full({}, 1.0, DType::F32), Device::CUDA);
      cross_entropy_backward_cuda(logits.raw_data(), act, chunk_lse, chunk_row_target, one.data<float>(),
                                  /*num_targets=*/1, logits.raw_data(), n, vocab, /*accumulate=*/false);
    }
    const float dw_beta = r0 == 0 ? 0.0f : 1.0f;
    if (fp8) {
      if (fused && dlogits_codes.codes)
        fp8_output_gradient_transpose(dlogits);
      else
        dlogits = fp8_output_gradient(weight, chunk_logits);
      if (dx_unscaled.defined()) {
        if (!w_codes_transposed.defined()) w_codes_transposed = fp8_weight_codes_transposed(weight, w);
        Tensor dx_rows = dx_unscaled.flat_view(r0 * width, n * width).reshape({n, width});
        fp8_linear_input_gradient(weight, dlogits, w, 0.0f, dx_rows, &w_codes_transposed);
      }
      if (dw_unscaled.defined()) fp8_linear_weight_gradient(weight, dlogits, 0, x_rows, dw_beta, dw_unscaled);
      continue;
    }
    if (dx_unscaled.defined()) {
      Tensor dx_rows = dx_unscaled.flat_view(r0 * width, n * width);
      linear_gemm(false, false, n, width, vocab, logits, vocab, w, width, 0.0f, dx_rows, width);
    }
    if (dw_unscaled.defined())
      linear_gemm(true, false, vocab, width, n, logits, vocab, x_rows, width, dw_beta, dw_unscaled, width);
  }
  std::vector<float> losses(static_cast<size_t>(num_chunks));
  const std::vector<CrossEntropyCounts> counts =
      cross_entropy_counts_to_host(chunk_counts.data<int64_t>(), num_chunks, targets.raw_data(), targets.dtype(), chunk,
                                   chunk_losses.data<float>(), losses.data());
  double loss_sum = 0;  // the chunks' summed losses, added in chunk order
  int64_t num_targets = 0, num_correct = 0;
  for (int64_t i = 0; i < num_chunks; ++i) {
    const CrossEntropyCounts& c = counts[static_cast<size_t>(i)];
    HGRN_CHECK(c.bad_row < 0, "cross_entropy: target ", c.bad_target, " in row ", i * chunk + c.bad_row,
               " is out of range for vocab size ", vocab, " (ignore_index is ", ignore_index, ")");
    num_targets += c.num_targets;
    num_correct += c.num_correct;
    if (c.num_targets > 0)
      loss_sum += static_cast<double>(losses[static_cast<size_t>(i)]) * static_cast<double>(c.num_targets);
  }
  const double mean = num_targets > 0 ? loss_sum / static_cast<double>(num_targets) : 0.0;
  Var out = op_output(tape, on_device(Tensor::full({}, mean, DType::F32), Device::CUDA), {x, weight});
  if (out->requires_grad) {
    tape.record([x, weight, out, dx_unscaled, dw_unscaled, num_targets] {
      if (!out->grad.defined() || num_targets == 0) return;  // no target: zero gradients, nothing to add
      const float per_target = 1.0f / static_cast<float>(num_targets);
      bool accumulate = false;
      if (dx_unscaled.defined()) {
        Tensor& dx = grad_buffer_for_write(x, &accumulate);
        cuda_scaled_accumulate(dx.raw_data(), dx.dtype(), dx_unscaled.data<float>(), out->grad.data<float>(),
                               per_target, accumulate, dx.numel());
      }
      if (dw_unscaled.defined()) {
        Tensor& dw = grad_buffer_for_write(weight, &accumulate);
        HGRN_CHECK(dw.dtype() == DType::F32, "linear_cross_entropy backward: the weight's gradient is ",
                   dtype_name(dw.dtype()), ", expected fp32");
        cuda_scaled_accumulate(dw.raw_data(), DType::F32, dw_unscaled.data<float>(), out->grad.data<float>(),
                               per_target, accumulate, dw.numel());
      }
    });
  }
  return {out, num_targets, num_correct};
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
