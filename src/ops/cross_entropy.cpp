// cross_entropy.cpp: cross-entropy forward (stable log-sum-exp per row) and backward
// d logits_row += (dloss / num_targets) · (softmax(row) − onehot(target)) for every non-ignored row. The CPU reference
// is here; the GPU kernels are in kernels/cross_entropy.cu (there the loss is fp32 whatever the logits' dtype).
#include "ops/cross_entropy.h"

#include <cmath>
#include <memory>
#include <vector>

#include "ops/cpu_parallel.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cross_entropy.h"
#endif

namespace hgrn {

// Row r's target, or -1 when the row is ignored.
template <typename I>
static std::vector<int64_t> checked_targets(const I* targets, int64_t rows, int64_t vocab, int64_t ignore_index) {
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = static_cast<int64_t>(targets[r]);
    if (t == ignore_index) {
      out[static_cast<size_t>(r)] = -1;
      continue;
    }
    HGRN_CHECK(t >= 0 && t < vocab, "cross_entropy: target ", t, " in row ", r, " is out of range for vocab size ",
               vocab, " (ignore_index is ", ignore_index, ")");
    out[static_cast<size_t>(r)] = t;
  }
  return out;
}

// Fills log_sum_exp[r] and correct[r] for every non-ignored row; returns the summed loss, added in row order.
template <typename T>
static double cross_entropy_forward_cpu(const T* logits, const int64_t* targets, T* log_sum_exp, uint8_t* correct,
                                        int64_t rows, int64_t vocab) {
  std::vector<double> row_loss(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static) if (rows * vocab >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    const T* x = logits + r * vocab;
    int64_t argmax = 0;
    for (int64_t v = 1; v < vocab; ++v)
      if (x[v] > x[argmax]) argmax = v;
    const T max_value = x[argmax];
    // exp in the logits' precision, the sum in double: long rows lose no low-order terms.
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += static_cast<double>(std::exp(x[v] - max_value));
    const T lse = max_value + static_cast<T>(std::log(sum));
    log_sum_exp[r] = lse;
    correct[r] = argmax == targets[r];
    row_loss[static_cast<size_t>(r)] = static_cast<double>(lse) - static_cast<double>(x[targets[r]]);
  }
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) total += row_loss[static_cast<size_t>(r)];
  return total;
}

template <typename T>
static void cross_entropy_backward_cpu(const T* logits, const int64_t* targets, const T* log_sum_exp, T scale,
                                       T* dlogits, int64_t rows, int64_t vocab) {
#pragma omp parallel for schedule(static) if (rows * vocab >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    const T* x = logits + r * vocab;
    T* dx = dlogits + r * vocab;
    const T lse = log_sum_exp[r];
    for (int64_t v = 0; v < vocab; ++v) dx[v] += scale * std::exp(x[v] - lse);
    dx[targets[r]] -= scale;
  }
}

// What the backward needs besides the logits: on the CPU each row's target (-1: ignored) and log-sum-exp in the
// logits' dtype; on the GPU the same as device tensors (int32 targets, fp32 log-sum-exp).
struct CrossEntropySaved {
  std::vector<int64_t> cpu_targets;
  Tensor row_target;
  Tensor log_sum_exp;
};

CrossEntropyResult cross_entropy(Tape& tape, const Var& logits, const Tensor& targets, int64_t ignore_index) {
  HGRN_CHECK(logits, "cross_entropy: logits is null");
  const Tensor& lv = logits->value;
  HGRN_CHECK(lv.dim() == 2 && lv.size(1) > 0, "cross_entropy: logits must be [N, Vocab] with Vocab > 0, got ",
             shape_str(lv.shape()));
  HGRN_CHECK(lv.is_contiguous(), "cross_entropy: logits must be contiguous");
  HGRN_CHECK(targets.defined() && (targets.dtype() == DType::I32 || targets.dtype() == DType::I64),
             "cross_entropy: targets must be int32 or int64, got ",
             targets.defined() ? dtype_name(targets.dtype()) : "undefined");
  HGRN_CHECK(targets.device() == lv.device() && targets.is_contiguous(), "cross_entropy: targets must be a contiguous ",
             device_name(lv.device()), " tensor (the logits' device), got one on ", device_name(targets.device()));
  const int64_t rows = lv.size(0), vocab = lv.size(1);
  HGRN_CHECK(targets.dim() == 1 && targets.size(0) == rows, "cross_entropy: targets ", shape_str(targets.shape()),
             " do not match logits ", shape_str(lv.shape()), " (expected [", rows, "])");

  auto saved = std::make_shared<CrossEntropySaved>();
  Tensor loss;
  int64_t num_targets = 0, num_correct = 0;
  if (lv.device() == Device::CPU) {
    saved->cpu_targets = targets.dtype() == DType::I32
                             ? checked_targets(targets.data<int32_t>(), rows, vocab, ignore_index)
                             : checked_targets(targets.data<int64_t>(), rows, vocab, ignore_index);
    for (int64_t t : saved->cpu_targets) num_targets += t >= 0;
    saved->log_sum_exp = Tensor::empty({rows}, lv.dtype());
    std::vector<uint8_t> correct(static_cast<size_t>(rows), 0);
    loss = Tensor::empty({}, lv.dtype());
    HGRN_DISPATCH_FLOAT(lv.dtype(), "cross_entropy", [&] {
      const double total = cross_entropy_forward_cpu(lv.data<scalar_t>(), saved->cpu_targets.data(),
                                                     saved->log_sum_exp.data<scalar_t>(), correct.data(), rows, vocab);
      loss.data<scalar_t>()[0] =
          static_cast<scalar_t>(num_targets > 0 ? total / static_cast<double>(num_targets) : 0.0);
    });
    for (uint8_t c : correct) num_correct += c;
  } else {
#ifdef HGRN_WITH_CUDA
    loss = Tensor::empty({}, DType::F32, Device::CUDA);
    saved->log_sum_exp = Tensor::empty({rows}, DType::F32, Device::CUDA);
    saved->row_target = Tensor::empty({rows}, DType::I32, Device::CUDA);
    Tensor scratch = Tensor::empty({static_cast<int64_t>((cross_entropy_scratch_bytes(rows) + 7) / 8)}, DType::I64,
                                   Device::CUDA);
    Tensor device_counts = Tensor::empty({kCrossEntropyCountSlots}, DType::I64, Device::CUDA);
    cross_entropy_forward_cuda(lv.raw_data(), lv.dtype(), targets.raw_data(), targets.dtype(), rows, vocab,
                               ignore_index, loss.data<float>(), saved->log_sum_exp.data<float>(),
                               saved->row_target.data<int32_t>(), device_counts.data<int64_t>(), scratch.raw_data());
    const CrossEntropyCounts counts =
        cross_entropy_counts_to_host(device_counts.data<int64_t>(), 1, targets.raw_data(), targets.dtype(), rows)[0];
    HGRN_CHECK(counts.bad_row < 0, "cross_entropy: target ", counts.bad_target, " in row ", counts.bad_row,
               " is out of range for vocab size ", vocab, " (ignore_index is ", ignore_index, ")");
    num_targets = counts.num_targets;
    num_correct = counts.num_correct;
#else
    throw Error("cross_entropy: this hgrn was built without CUDA");
#endif
  }

  Var out = op_output(tape, loss, {logits});
  if (out->requires_grad) {
    tape.record([logits, out, saved, num_targets, rows, vocab] {
      if (!out->grad.defined()) return;
      Tensor& dlogits = grad_buffer(logits);
      if (num_targets == 0) return;  // nothing to learn from: the gradient stays zero
      const Tensor& dloss = out->grad;
      if (dloss.device() == Device::CPU) {
        HGRN_DISPATCH_FLOAT(dloss.dtype(), "cross_entropy backward", [&] {
          const scalar_t scale = dloss.data<scalar_t>()[0] / static_cast<scalar_t>(num_targets);
          cross_entropy_backward_cpu(logits->value.data<scalar_t>(), saved->cpu_targets.data(),
                                     saved->log_sum_exp.data<scalar_t>(), scale, dlogits.data<scalar_t>(), rows,
                                     vocab);
        });
        return;
      }
#ifdef HGRN_WITH_CUDA
      cross_entropy_backward_cuda(logits->value.raw_data(), logits->value.dtype(), saved->log_sum_exp.data<float>(),
                                  saved->row_target.data<int32_t>(), dloss.data<float>(), num_targets,
                                  dlogits.raw_data(), rows, vocab);
#else
      throw Error("cross_entropy: this hgrn was built without CUDA");
#endif
    });
  }
  return {out, num_targets, num_correct};
}

}  // namespace hgrn
