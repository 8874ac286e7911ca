// batch_source.h: what the trainer draws batches from: a deterministic stream of fixed-length token sequences
// whose position (the cursor: sequences drawn so far) is one integer, so that a checkpoint restores it exactly.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace hgrn {

// Targets hold this where no loss is taken (torch's ignore_index convention).
constexpr int32_t kIgnoreTarget = -100;

struct TokenBatch {
  Tensor inputs;   // int32 [B, T]
  Tensor targets;  // int32 [B, T]: the token after each input position; kIgnoreTarget where no loss is taken
  Tensor resets;   // int32 [B, T] with data.reset_state_at_document, else undefined: 1 where a document starts at
                   // that input position (data/document_starts.h), where the model's recurrent state restarts
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // The next batch_size sequences of the stream; advances the cursor by batch_size.
  virtual TokenBatch next_batch(int64_t batch_size) = 0;
  // Sequences drawn so far; set_cursor(c) makes the next batch start with sequence c of the stream.
  virtual uint64_t cursor() const = 0;
  virtual void set_cursor(uint64_t cursor) = 0;
  // Whether each row of the next batch continues the stream that row read one optimiser step before, so that the
  // recurrent state it carried from there applies (data.stateful, data/token_streams.h); false: it starts afresh.
  virtual bool next_batch_continues_streams() const { return false; }
};

}  // namespace hgrn
