// window_sampler.h: training sequences from a token shard: fixed-length windows over the concatenation of all
// documents (prepare puts an EOS after every document, so windows cross document boundaries at an EOS), visited in
// a per-epoch shuffled order that needs O(1) memory, split between data-parallel ranks, resumable from one integer.
//
// Windows: with N tokens and sequence length T, window w covers tokens [w*T, w*T + T + 1) (consecutive windows
// share one token), W = floor((N - 1) / T) windows per epoch; inputs are its first T tokens, targets its last T, so
// every target is a real next token. The last (N - 1) mod T tokens of the shard are never a target.
//
// Order: the stream is a sequence of global positions g = 0, 1, 2, ...; position g belongs to epoch e = g / W and
// visits window pi_e(g mod W), where pi_e is a bijection of [0, W) keyed by (seed, e): a Feistel network on the
// smallest even number of bits that covers W, cycle-walking until the value lands inside [0, W). With shuffle off,
// pi_e is the identity (evaluation: sequential windows).
//
// Data parallelism: rank r of world_size draws positions g = c * world_size + r for its own cursor c = 0, 1, ...
// Every position belongs to exactly one rank, so within an epoch the ranks' windows are disjoint and together cover
// every window exactly once (when world_size does not divide W, the ranks cross into the next epoch at cursors
// that differ by one).
// cursor() is the number of sequences this rank has drawn; set_cursor(c) makes the next batch exactly the one an
// uninterrupted run would draw after c sequences.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "data/batch_source.h"
#include "data/token_shards.h"

namespace hgrn {

// A keyed bijection of [0, size) computed on demand (no index array), used for the per-epoch window order.
class FeistelPermutation {
 public:
  // size >= 1; key selects the permutation.
  FeistelPermutation(uint64_t size, uint64_t key);
  uint64_t operator()(uint64_t index) const;  // index in [0, size)
  uint64_t size() const { return size_; }

 private:
  uint64_t round_function(int round, uint64_t half) const;

  uint64_t size_;
  uint32_t key_lo_, key_hi_;
  int half_bits_;      // each half of the Feistel domain; the domain is [0, 2^(2 * half_bits))
  uint64_t half_mask_;
};

struct WindowSamplerOptions {
  int64_t seq_len = 0;      // T, tokens per sequence (>= 1)
  uint64_t seed = 0;        // selects the shuffled order of every epoch
  bool shuffle = true;      // false: windows in order (evaluation)
  int64_t rank = 0;         // this process's data-parallel rank, in [0, world_size)
  int64_t world_size = 1;
  int64_t document_eos = -1;  // >= 0: batches carry reset flags at the document starts this EOS id marks
                              // (data.reset_state_at_document; data/document_starts.h)
};

class WindowSampler : public BatchSource {
 public:
  // Throws hgrn::Error naming the shard when seq_len < 1, the shard has fewer than seq_len + 1 tokens, or the rank
  // is outside [0, world_size).
  WindowSampler(std::shared_ptr<const TokenShardReader> shard, const WindowSamplerOptions& options);

  // batch_size sequences: inputs and targets int32 [batch_size, seq_len] (and the resets, with document_eos);
  // advances the cursor by batch_size.
  TokenBatch next_batch(int64_t batch_size) override;
  uint64_t cursor() const override { return cursor_; }
  void set_cursor(uint64_t cursor) override { cursor_ = cursor; }

  int64_t num_windows() const { return num_windows_; }  // W, per epoch
  int64_t seq_len() const { return options_.seq_len; }
  // The epoch the next sequence of this rank belongs to.
  uint64_t epoch() const { return global_position(cursor_) / static_cast<uint64_t>(num_windows_); }
  // The window that this rank's sequence number `cursor` reads (the stream's definition, for tests and tools).
  int64_t window_at(uint64_t cursor) const;
  // The first token of window w in the shard.
  int64_t window_start(int64_t window) const { return window * options_.seq_len; }

 private:
  uint64_t global_position(uint64_t cursor) const {
    return cursor * static_cast<uint64_t>(options_.world_size) + static_cast<uint64_t>(options_.rank);
  }
  const FeistelPermutation& permutation_for_epoch(uint64_t epoch) const;

  std::shared_ptr<const TokenShardReader> shard_;
  WindowSamplerOptions options_;
  int64_t num_windows_ = 0;
  uint64_t cursor_ = 0;
  // The permutation of the epoch last used (deriving a key costs a Philox call; batches rarely span epochs).
  mutable uint64_t cached_epoch_ = UINT64_MAX;
  mutable std::unique_ptr<FeistelPermutation> cached_permutation_;
};

}  // namespace hgrn
