// token_streams.cpp: reading a shard as contiguous streams (layout in token_streams.h).
#include "data/token_streams.h"

#include <algorithm>

#include "data/document_starts.h"

namespace hgrn {

TokenBatch read_token_spans(const TokenShardReader& shard, const std::vector<int64_t>& starts, int64_t len,
                            std::optional<int32_t> document_eos) {
  const int64_t rows = static_cast<int64_t>(starts.size());
  TokenBatch batch{Tensor::empty({rows, len}, DType::I32), Tensor::empty({rows, len}, DType::I32)};
  if (document_eos) batch.resets = Tensor::empty({rows, len}, DType::I32);
  std::vector<int32_t> span(static_cast<size_t>(len + 1));
  for (int64_t r = 0; r < rows; ++r) {
    shard.read(starts[r], len + 1, span.data());
    std::copy(span.begin(), span.end() - 1, batch.inputs.data<int32_t>() + r * len);
    std::copy(span.begin() + 1, span.end(), batch.targets.data<int32_t>() + r * len);
    if (document_eos)
      mark_document_starts(shard, starts[r], len, span.data(), *document_eos, batch.resets.data<int32_t>() + r * len);
  }
  return batch;
}

StreamLayout::StreamLayout(int64_t tokens, int64_t num_streams)
    : streams(num_streams), length(num_streams >= 1 && tokens >= 1 ? (tokens - 1) / num_streams : 0) {}

StreamWindowSampler::StreamWindowSampler(std::shared_ptr<const TokenShardReader> shard,
                                         const StreamWindowOptions& options)
    : shard_(std::move(shard)),
      options_(options),
      layout_(shard_ ? shard_->num_tokens() : 0, options.world_size * options.rows_per_step) {
  HGRN_CHECK(shard_ != nullptr, "StreamWindowSampler: no token shard");
  HGRN_CHECK(options_.seq_len >= 1 && options_.rows_per_step >= 1, "StreamWindowSampler: seq_len and rows per step "
             "must be >= 1, got ", options_.seq_len, " and ", options_.rows_per_step);
  HGRN_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
             "StreamWindowSampler: rank ", options_.rank, " is outside [0, world_size = ", options_.world_size, ")");
  const int64_t T = options_.seq_len, S = layout_.streams;
  windows_per_stream_ = layout_.length / T;
  HGRN_CHECK(windows_per_stream_ >= 2, "data.stateful: data.train_data = ", shard_->prefix(), " has ",
             shard_->num_tokens(), " tokens, too few for ", S, " streams (training.micro_batch_size x "
             "training.grad_accum_steps x ", options_.world_size, " rank(s)) of at least two data.seq_len = ", T,
             "-token windows each: it needs at least 2 x ", S, " x ", T, " + 1 = ", 2 * S * T + 1,
             " tokens. Use a larger corpus, or fewer or shorter rows (a state is carried only from one window of a "
             "stream to the next)");
}

int64_t StreamWindowSampler::window_at(uint64_t cursor) const {
  const uint64_t step = cursor / static_cast<uint64_t>(options_.rows_per_step);
  return static_cast<int64_t>(step % static_cast<uint64_t>(windows_per_stream_));
}

bool StreamWindowSampler::next_batch_continues_streams() const { return window_at(cursor_) != 0; }

TokenBatch StreamWindowSampler::next_batch(int64_t batch_size) {
  const int64_t R = options_.rows_per_step, T = options_.seq_len;
  const int64_t first_row = static_cast<int64_t>(cursor_ % static_cast<uint64_t>(R));
  HGRN_CHECK(batch_size >= 1 && first_row + batch_size <= R, "StreamWindowSampler: a batch of ", batch_size,
             " rows from row ", first_row, " runs past the ", R, " rows of a step");
  const int64_t offset = window_at(cursor_) * T;
  std::vector<int64_t> starts;
  for (int64_t row = first_row; row < first_row + batch_size; ++row)
    starts.push_back(layout_.start(stream_of_row(row)) + offset);
  cursor_ += static_cast<uint64_t>(batch_size);
  return read_token_spans(*shard_, starts, T, options_.document_eos);
}

}  // namespace hgrn
