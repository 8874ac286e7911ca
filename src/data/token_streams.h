// token_streams.h: a token shard read as contiguous streams, each one window after another, so that a recurrent
// state can be carried from one window of a stream to the next. `hgrn eval --stateful` (train/evaluate.h) and
// stateful training (data.stateful) read this one layout.
//
// Layout: a shard of N tokens cut into S streams: stream s covers tokens [s·L, s·L + L] with L = floor((N − 1) / S),
// so it has L targets (consecutive streams share one token, as consecutive windows do) and the last (N − 1) mod S
// tokens of the shard are never a target. Reading `len` tokens of stream s from offset o gives the inputs
// [s·L + o, s·L + o + len) and, as targets, the tokens one position later.
//
// Training (StreamWindowSampler): an optimiser step of rank r (of world_size) draws R = micro_batch_size ×
// grad_accum_steps rows, its micro-batches in order: row b of micro-batch m is the rank's row j = m·micro_batch_size
// + b. Row j reads stream s = r·R + j of S = world_size·R streams, the same stream in every step, so the ranks read
// disjoint streams and together all of them. Step t reads window k = t mod K of every stream (T = seq_len tokens
// from offset k·T), K = floor(L / T) windows per stream; after K steps (an epoch) every stream starts again from its
// beginning. The last L mod T targets of each stream are never trained on. Changing how R splits into micro-batches
// keeps every row's stream.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "data/batch_source.h"
#include "data/token_shards.h"

namespace hgrn {

// Inputs [rows, len] and targets (the next tokens) from the len + 1 tokens of the shard at each of `starts`, and with
// document_eos the reset flags at the document starts that EOS id marks (data/document_starts.h).
TokenBatch read_token_spans(const TokenShardReader& shard, const std::vector<int64_t>& starts, int64_t len,
                            std::optional<int32_t> document_eos = std::nullopt);

// S contiguous streams over a shard of N tokens (the layout above).
struct StreamLayout {
  int64_t streams = 0;  // S
  int64_t length = 0;   // L, targets per stream: floor((N − 1) / S)
  StreamLayout(int64_t tokens, int64_t streams);
  int64_t start(int64_t stream) const { return stream * length; }  // the stream's first token in the shard
};

struct StreamWindowOptions {
  int64_t seq_len = 0;        // T, tokens per window
  int64_t rows_per_step = 0;  // R, this rank's rows per optimiser step (micro_batch_size × grad_accum_steps)
  int64_t rank = 0;           // this process's data-parallel rank, in [0, world_size)
  int64_t world_size = 1;
  std::optional<int32_t> document_eos;  // batches carry reset flags at the document starts this EOS id marks
};

// The training stream of data.stateful. cursor() counts the rank's rows drawn so far: row cursor mod R of step
// cursor / R, so that a checkpoint's cursor restores the position exactly.
class StreamWindowSampler : public BatchSource {
 public:
  // Throws hgrn::Error naming data.train_data and the keys that set S and T when the shard is too short for two
  // windows of every stream (a state is carried only from a stream's window to its next).
  StreamWindowSampler(std::shared_ptr<const TokenShardReader> shard, const StreamWindowOptions& options);

  // Rows [cursor mod R, + batch_size) of the current step: inputs and targets int32 [batch_size, T]. A batch must not
  // run past the step's R rows (the trainer draws a step's micro-batches in order).
  TokenBatch next_batch(int64_t batch_size) override;
  uint64_t cursor() const override { return cursor_; }
  void set_cursor(uint64_t cursor) override { cursor_ = cursor; }
  // False at the first window of an epoch, where every stream starts again.
  bool next_batch_continues_streams() const override;

  const StreamLayout& layout() const { return layout_; }
  int64_t windows_per_stream() const { return windows_per_stream_; }  // K
  int64_t stream_of_row(int64_t row) const { return options_.rank * options_.rows_per_step + row; }
  // The window index k the rows at `cursor` read.
  int64_t window_at(uint64_t cursor) const;

 private:
  std::shared_ptr<const TokenShardReader> shard_;
  StreamWindowOptions options_;
  StreamLayout layout_;
  int64_t windows_per_stream_ = 0;
  uint64_t cursor_ = 0;
};

}  // namespace hgrn
