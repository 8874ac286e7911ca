// evaluate.cpp: loss accumulation over batches without recording a tape.
#include "train/evaluate.h"

#include <algorithm>

#include "data/token_streams.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "train/lm_loss.h"

namespace hgrn {

namespace {

struct LossSum {
  double nll = 0;
  int64_t targets = 0, correct = 0;
  void add(const CrossEntropyResult& r) {
    nll += r.loss->value.item() * static_cast<double>(r.num_targets);
    targets += r.num_targets;
    correct += r.num_correct;
  }
  EvalResult result() const {
    const double n = static_cast<double>(std::max<int64_t>(targets, 1));
    return {targets, nll / n, static_cast<double>(correct) / n};
  }
};

}  // namespace

EvalResult evaluate_batches(const CausalLM& model, BatchSource& source, int64_t batches, int64_t batch_size) {
  Tape no_grad;
  no_grad.set_enabled(false);
  source.set_cursor(0);
  LossSum sum;
  for (int64_t b = 0; b < batches; ++b) sum.add(language_model_loss(model, no_grad, source.next_batch(batch_size)));
  return sum.result();
}

EvalResult evaluate_shard(const CausalLM& model, const TokenShardReader& shard, const ShardEvalOptions& options) {
  const int64_t T = options.seq_len, B = options.batch_size, N = shard.num_tokens();
  HGRN_CHECK(T >= 1 && B >= 1, "evaluation needs seq_len >= 1 and batch_size >= 1");
  HGRN_CHECK(N >= B * (options.stateful ? 2 : T + 1), shard.prefix(), " has ", N,
             " tokens: too few for one evaluation batch of ",
             options.stateful ? detail::concat(B, " streams") : detail::concat(B, " windows of ", T, " tokens"));
  const int64_t budget = options.max_tokens > 0 ? options.max_tokens : INT64_MAX;
  Tape no_grad;
  no_grad.set_enabled(false);
  LossSum sum;
  // The targets the loop below will score: whole calls until the budget is reached.
  const auto planned = [budget](int64_t all, int64_t per_call) {
    return std::min(all, (budget + per_call - 1) / per_call * per_call);
  };
  const auto report = [&](int64_t total) {
    if (options.on_progress) options.on_progress(sum.targets, total);
  };
  if (!options.stateful) {
    const int64_t windows = (N - 1) / T;
    const int64_t total = budget == INT64_MAX ? windows * T : planned(windows * T, B * T);
    for (int64_t w0 = 0; w0 < windows && sum.targets < budget; w0 += B) {
      std::vector<int64_t> starts;
      for (int64_t w = w0; w < std::min(windows, w0 + B); ++w) starts.push_back(w * T);
      sum.add(language_model_loss(model, no_grad, read_token_spans(shard, starts, T, options.document_eos)));
      report(total);
    }
    return sum.result();
  }
  // B contiguous streams (data/token_streams.h) of L targets each, read T at a time with the states carried.
  const StreamLayout layout(N, B);
  const int64_t L = layout.length;
  const int64_t total = budget == INT64_MAX ? B * L : planned(B * L, B * T);
  std::vector<Var> states;
  for (int64_t offset = 0; offset < L && sum.targets < budget; offset += T) {
    const int64_t len = std::min(T, L - offset);
    std::vector<int64_t> starts;
    for (int64_t b = 0; b < B; ++b) starts.push_back(layout.start(b) + offset);
    TokenBatch batch = read_token_spans(shard, starts, len, options.document_eos);
    Var logits = model.forward(no_grad, batch.inputs, &states, batch.resets);
    sum.add(cross_entropy(no_grad, reshape(no_grad, logits, {B * len, model.config().vocab_size}),
                          on_device(batch.targets.reshape({B * len}), model.device())));
    report(total);
  }
  return sum.result();
}

}  // namespace hgrn
