// evaluate.h: held-out loss of a model: over a number of batches of a stream (the trainer's periodic evaluation,
// MQAR), or over a whole token shard (`hgrn eval`), either window by window or with the recurrent state carried
// across consecutive windows (unlimited context, which an RNN can do and softmax attention cannot).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>

#include "data/batch_source.h"
#include "data/token_shards.h"
#include "models/registry.h"

namespace hgrn {

struct EvalResult {
  int64_t targets = 0;   // predictions scored
  double loss = 0;       // mean negative log-likelihood per target, in nats
  double accuracy = 0;   // fraction of targets that are the argmax
};

// `batches` batches of `batch_size` from `source`, restarted at cursor 0 (the same held-out set every time).
EvalResult evaluate_batches(const CausalLM& model, BatchSource& source, int64_t batches, int64_t batch_size);

struct ShardEvalOptions {
  int64_t seq_len = 512;     // tokens per forward call
  int64_t batch_size = 8;    // sequences per forward call
  bool stateful = false;     // carry the recurrent state from each window to the next
  int64_t max_tokens = 0;    // score at most about this many targets (0: the whole shard)
  // Restart the recurrent state at every document start (the token after this EOS id; data.reset_state_at_document),
  // within a window and, stateful, across windows too. nullopt: never.
  std::optional<int32_t> document_eos;
  // Called after each forward call with the targets scored so far and the number that will be scored in all.
  std::function<void(int64_t scored, int64_t total)> on_progress;
};

// Scores every token of the shard but the first. Window mode: windows [w*T, w*T + T + 1), each read from the zero
// state (the last (N - 1) mod T tokens are left out). Stateful mode: the shard is cut into batch_size contiguous
// streams (data/token_streams.h, the layout data.stateful trains on), each read in consecutive windows with the
// state carried, so every token after a stream's first is predicted from all of that stream before it.
EvalResult evaluate_shard(const CausalLM& model, const TokenShardReader& shard, const ShardEvalOptions& options);

}  // namespace hgrn
