// mqar.h: the Multi-Query Associative Recall task (Arora et al. 2023, "Zoology"; HGRN2 paper section 4.1) as a
// deterministic, resumable generator of token batches.
//
// Vocabulary: token 0 is a neutral filler; ids [1, 1 + K) are keys and ids [1 + K, vocab_size) are values, with
// K = MqarConfig::num_keys, or (vocab_size - 1) / 2 when that is 0.
//
// One sequence of seq_len tokens with P = num_kv_pairs:
//   positions [0, 2P)      P key-value pairs k_1 v_1 k_2 v_2 ... k_P v_P: the keys are P distinct keys drawn
//                          uniformly, the values P distinct values drawn uniformly (distinct, as Zoology draws
//                          them), independent of the keys;
//   positions [2P, T)      filler, except for P queries: each pair is queried exactly once, in a random order, at
//                          a random position t, and the queried key's value follows it at t + 1. The P (query,
//                          answer) slots are placed uniformly among all non-overlapping placements.
// The model reads inputs[t] and predicts targets[t] = the next token. Loss is taken only where the input is a
// query: targets[t] = inputs[t + 1] = the queried key's value; every other target is -100 (ignored). Answering
// needs the value seen next to that key in the pair section: recall, not local statistics.
// So seq_len >= 4P (2P tokens of pairs, 2P of query slots), K >= P and vocab_size - 1 - K >= P.
//
// Determinism: sequence number i (counted from the start of the stream) is generated from Rng(seed).fork(i)
// alone, so a batch depends only on the cursor (how many sequences were drawn before it) and the batch size,
// not on how the earlier sequences were split into batches. Restoring the cursor restores the stream exactly.
#pragma once
#include <cstdint>

#include "config/config.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/batch_source.h"

namespace hgrn {

// The filler token between queries.
constexpr int32_t kMqarFillerToken = 0;

class MqarGenerator : public BatchSource {
 public:
  // Throws hgrn::Error when the configuration cannot produce valid sequences (see the size rules above).
  // Data parallelism: rank r of world_size draws stream sequences c * world_size + r for its cursor c = 0, 1, ..., so
  // the ranks' sequences are disjoint and a step of N ranks x B sequences covers the same sequences as one process
  // drawing N * B.
  MqarGenerator(const MqarConfig& config, int64_t vocab_size, int64_t seq_len, uint64_t seed, int64_t rank = 0,
                int64_t world_size = 1);

  // The next batch_size sequences of the stream; advances the cursor by batch_size.
  TokenBatch next_batch(int64_t batch_size) override;

  // The number of sequences this rank has drawn so far. set_cursor(c) makes the next batch start with its sequence c.
  uint64_t cursor() const override { return cursor_; }
  void set_cursor(uint64_t cursor) override { cursor_ = cursor; }

  // The accuracy of guessing a value uniformly at random: 1 / number of value tokens.
  double chance_accuracy() const { return 1.0 / static_cast<double>(num_values_); }

  int64_t num_kv_pairs() const { return num_kv_pairs_; }
  int64_t num_keys() const { return num_keys_; }
  int64_t num_values() const { return num_values_; }
  int64_t first_key() const { return 1; }
  int64_t first_value() const { return 1 + num_keys_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  // Writes sequence number `index` of the stream into rows of length seq_len_.
  void generate_sequence(uint64_t index, int32_t* inputs, int32_t* targets) const;

  int64_t num_kv_pairs_, num_keys_, num_values_, vocab_size_, seq_len_;
  Rng base_rng_;
  uint64_t rank_ = 0, world_size_ = 1;
  uint64_t cursor_ = 0;
};

}  // namespace hgrn
