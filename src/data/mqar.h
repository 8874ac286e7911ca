// mqar.h: the Multi-Query Associative Recall task (Arora et al. 2023, "Zoology"; HGRN2 paper section 4.1) as a
// deterministic, resumable generator of token batches.
//
// Vocabulary: token 0 is a neutral filler; ids [1, 1 + K) are keys and ids [1 + K, vocab_size) are values, with
// K = MqarConfig::num_keys, or (vocab_size - 1) / 2 when that is 0.
//
// One sequence of seq_len tokens with P = num_kv_pairs starts with the P key-value pairs k_1 v_1 k_2 v_2 ... k_P v_P
// at positions [0, 2P): P distinct keys drawn uniformly, P distinct values drawn uniformly (distinct, as Zoology
// draws them), independent of the keys. Each pair is then queried exactly once in [2P, T); every other position
// there is filler. Where the queries go (MqarConfig::query_placement):
//   uniform     each query is a 2-token slot (key, value) at a random position t, the queried key's value at t + 1;
//               the P slots are placed uniformly among all non-overlapping placements, in a random order.
//   power_law   Zoology's layout (multiquery_ar): the region after the pairs holds S = (T - 2P) / 2 two-token slots;
//               pair j's key goes to position 2P + 2 g_j, where the gaps g_1, ..., g_P (in pair order) are drawn
//               one after another without replacement from {0, ..., S - 1} with weights (g + 1)^(power_a - 1),
//               each draw renormalised over the gaps not yet taken (numpy's choice(replace=False, p=...)). The
//               value is not shown after the query: position 2P + 2 g_j + 1 is filler, like every other position
//               not holding a query key.
// The filler (MqarConfig::filler) is token 0, or with `random` a token drawn uniformly from the whole vocabulary
// (any id, keys and values included, as Zoology's random_non_queries).
// The model reads inputs[t] and predicts targets[t]. Loss is taken only where the input is a query: targets[t] =
// the queried key's value (with uniform placement also inputs[t + 1]); every other target is -100 (ignored).
// Answering needs the value seen next to that key in the pair section: recall, not local statistics.
// So seq_len >= 4P (2P tokens of pairs, 2P of query slots), K >= P and vocab_size - 1 - K >= P.
//
// Determinism: sequence number i is generated from Rng(seed).fork(i) alone. With num_train_sequences = 0 the
// stream's draw n is sequence n; with num_train_sequences = N > 0 (a fixed training set, as Zoology's) draw n is
// sequence perm_e(n mod N) of the N sequences 0 .. N - 1, with e = n / N the epoch and perm_e a uniformly random
// permutation drawn afresh for each epoch. Either way a batch depends only on the cursor (how many sequences were
// drawn before it) and the batch size, not on how the earlier sequences were split into batches. Restoring the
// cursor restores the stream exactly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/batch_source.h"

namespace hgrn {

// The filler token between queries.
constexpr int32_t kMqarFillerToken = 0;

// The layout settings in words for the training log, e.g. "queries at uniform positions, filler token 0".
std::string mqar_layout_summary(const MqarConfig& config);

class MqarGenerator : public BatchSource {
 public:
  // Throws hgrn::Error when the configuration cannot produce valid sequences (see the size rules above).
  // Data parallelism: rank r of world_size takes the stream's draws c * world_size + r for its cursor c = 0, 1, ...,
  // so the ranks' sequences are disjoint (within an epoch of a fixed set) and a step of N ranks x B sequences covers
  // the same sequences as one process drawing N * B.
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
  bool power_law_placement() const { return !gap_weights_.empty(); }
  bool random_filler() const { return random_filler_; }
  int64_t num_train_sequences() const { return num_train_sequences_; }

 private:
  // Writes sequence number `index` into rows of length seq_len_.
  void generate_sequence(uint64_t index, int32_t* inputs, int32_t* targets) const;
  // The sequence number of the stream's draw `draw` (itself without a fixed set; see Determinism above).
  uint64_t sequence_of_draw(uint64_t draw);

  int64_t num_kv_pairs_, num_keys_, num_values_, vocab_size_, seq_len_;
  Rng base_rng_;
  std::vector<double> gap_weights_;  // power_law: the weight of each gap g = 0 .. S - 1; empty: uniform placement
  bool random_filler_ = false;
  int64_t num_train_sequences_ = 0;
  uint64_t shuffled_epoch_ = UINT64_MAX;      // the epoch whose order epoch_order_ holds (none yet)
  std::vector<uint32_t> epoch_order_;         // a fixed set: the sequence numbers in that epoch's order
  uint64_t rank_ = 0, world_size_ = 1;
  uint64_t cursor_ = 0;
};

}  // namespace hgrn
