// cross_entropy.cpp: cross-entropy forward (stable log-sum-exp per row) and backward
// d logits_row += (dloss / num_targets) · (softmax(row) − onehot(target)) for every non-ignored row.
#include "ops/cross_entropy.h"

#include <cmath>
#include <memory>
#include <vector>

#include "ops/cpu_parallel.h"

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

CrossEntropyResult cross_entropy(Tape& tape, const Var& logits, const Tensor& targets, int64_t ignore_index) {
  HGRN_CHECK(logits, "cross_entropy: logits is null");
  const Tensor& lv = logits->value;
  HGRN_CHECK(lv.dim() == 2 && lv.size(1) > 0, "cross_entropy: logits must be [N, Vocab] with Vocab > 0, got ",
             shape_str(lv.shape()));
  HGRN_CHECK(lv.device() == Device::CPU && lv.is_contiguous(), "cross_entropy: logits must be a contiguous CPU tensor");
  HGRN_CHECK(targets.defined() && (targets.dtype() == DType::I32 || targets.dtype() == DType::I64),
             "cross_entropy: targets must be int32 or int64, got ",
             targets.defined() ? dtype_name(targets.dtype()) : "undefined");
  HGRN_CHECK(targets.device() == Device::CPU && targets.is_contiguous(),
             "cross_entropy: targets must be a contiguous CPU tensor");
  const int64_t rows = lv.size(0), vocab = lv.size(1);
  HGRN_CHECK(targets.dim() == 1 && targets.size(0) == rows, "cross_entropy: targets ", shape_str(targets.shape()),
             " do not match logits ", shape_str(lv.shape()), " (expected [", rows, "])");

  auto row_targets = std::make_shared<const std::vector<int64_t>>(
      targets.dtype() == DType::I32 ? checked_targets(targets.data<int32_t>(), rows, vocab, ignore_index)
                                    : checked_targets(targets.data<int64_t>(), rows, vocab, ignore_index));
  int64_t num_targets = 0;
  for (int64_t t : *row_targets) num_targets += t >= 0;

  Tensor log_sum_exp = Tensor::empty({rows}, lv.dtype());
  std::vector<uint8_t> correct(static_cast<size_t>(rows), 0);
  Tensor loss = Tensor::empty({}, lv.dtype());
  HGRN_DISPATCH_FLOAT(lv.dtype(), "cross_entropy", [&] {
    const double total = cross_entropy_forward_cpu(lv.data<scalar_t>(), row_targets->data(),
                                                   log_sum_exp.data<scalar_t>(), correct.data(), rows, vocab);
    loss.data<scalar_t>()[0] = static_cast<scalar_t>(num_targets > 0 ? total / static_cast<double>(num_targets) : 0.0);
  });
  int64_t num_correct = 0;
  for (uint8_t c : correct) num_correct += c;

  Var out = op_output(tape, loss, {logits});
  if (out->requires_grad) {
    tape.record([logits, out, row_targets, log_sum_exp, num_targets, rows, vocab] {
      if (!out->grad.defined()) return;
      Tensor& dlogits = grad_buffer(logits);
      if (num_targets == 0) return;  // nothing to learn from: the gradient stays zero
      HGRN_DISPATCH_FLOAT(out->grad.dtype(), "cross_entropy backward", [&] {
        const scalar_t scale = out->grad.data<scalar_t>()[0] / static_cast<scalar_t>(num_targets);
        cross_entropy_backward_cpu(logits->value.data<scalar_t>(), row_targets->data(), log_sum_exp.data<scalar_t>(),
                                   scale, dlogits.data<scalar_t>(), rows, vocab);
      });
    });
  }
  return {out, num_targets, num_correct};
}

}  // namespace hgrn
