// mqar.cpp: the MQAR sequence generator of mqar.h.
#include "data/mqar.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/check.h"

namespace hgrn {

namespace {

// `count` distinct integers drawn uniformly from [0, n), in random order: a partial Fisher-Yates shuffle of the
// identity permutation, stored sparsely (only swapped entries, in a small open-addressing table) so the cost is
// O(count), not O(n), with no allocation per entry.
std::vector<int64_t> sample_distinct(Rng& rng, int64_t n, int64_t count) {
  size_t capacity = 16;
  while (capacity < 2 * static_cast<size_t>(count)) capacity *= 2;
  std::vector<int64_t> keys(capacity, -1), values(capacity);
  auto slot = [&](int64_t i) {  // where i is, or the empty slot where it would go
    size_t at = static_cast<size_t>(i * 0x9E3779B97F4A7C15ULL >> 7) & (capacity - 1);
    while (keys[at] != -1 && keys[at] != i) at = (at + 1) & (capacity - 1);
    return at;
  };
  auto value_at = [&](int64_t i) {
    const size_t at = slot(i);
    return keys[at] == i ? values[at] : i;
  };
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - i)));
    const int64_t vi = value_at(i), vj = value_at(j);
    const size_t at = slot(j);
    keys[at] = j;
    values[at] = vi;
    out[static_cast<size_t>(i)] = vj;
  }
  return out;
}

}  // namespace

MqarGenerator::MqarGenerator(const MqarConfig& config, int64_t vocab_size, int64_t seq_len, uint64_t seed,
                             int64_t rank, int64_t world_size)
    : num_kv_pairs_(config.num_kv_pairs), vocab_size_(vocab_size), seq_len_(seq_len), base_rng_(seed) {
  HGRN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "mqar: rank ", rank, " outside a world of ",
             world_size);
  rank_ = static_cast<uint64_t>(rank);
  world_size_ = static_cast<uint64_t>(world_size);
  HGRN_CHECK(num_kv_pairs_ >= 1, "mqar: num_kv_pairs must be at least 1, got ", num_kv_pairs_);
  HGRN_CHECK(vocab_size_ >= 3 && vocab_size_ <= std::numeric_limits<int32_t>::max(),
             "mqar: vocab_size must be in [3, 2^31 - 1] (a filler, a key and a value token), got ", vocab_size_);
  HGRN_CHECK(config.num_keys >= 0, "mqar: num_keys must be non-negative (0 picks (vocab_size - 1) / 2), got ",
             config.num_keys);
  num_keys_ = config.num_keys == 0 ? (vocab_size_ - 1) / 2 : config.num_keys;
  num_values_ = vocab_size_ - 1 - num_keys_;
  HGRN_CHECK(num_values_ >= 1, "mqar: num_keys = ", num_keys_, " leaves no value tokens in a vocabulary of ",
             vocab_size_, " (token 0 is the filler; keys + values must fit in vocab_size - 1)");
  HGRN_CHECK(num_keys_ >= num_kv_pairs_, "mqar: ", num_kv_pairs_, " distinct keys per sequence need num_keys >= ",
             num_kv_pairs_, ", got ", num_keys_);
  HGRN_CHECK(num_values_ >= num_kv_pairs_, "mqar: ", num_kv_pairs_,
             " distinct values per sequence need at least that many value tokens, but vocab_size ", vocab_size_,
             " with ", num_keys_, " keys leaves ", num_values_);
  HGRN_CHECK(seq_len_ >= 4 * num_kv_pairs_, "mqar: seq_len ", seq_len_, " is too short for ", num_kv_pairs_,
             " pairs: it needs 2 tokens per pair and 2 per query, so at least ", 4 * num_kv_pairs_);
}

void MqarGenerator::generate_sequence(uint64_t index, int32_t* inputs, int32_t* targets) const {
  Rng rng = base_rng_.fork(index);
  const int64_t P = num_kv_pairs_, T = seq_len_;
  const std::vector<int64_t> keys = sample_distinct(rng, num_keys_, P);
  const std::vector<int64_t> values = sample_distinct(rng, num_values_, P);
  const std::vector<int64_t> query_order = sample_distinct(rng, P, P);
  // Non-overlapping 2-token slots in the R = T - 2P query positions: choosing P distinct offsets from R - P and
  // adding j to the j-th smallest is a bijection onto the placements, so each placement is equally likely.
  const int64_t query_region = T - 2 * P;
  std::vector<int64_t> offsets = sample_distinct(rng, query_region - P, P);
  std::sort(offsets.begin(), offsets.end());

  std::fill(inputs, inputs + T, kMqarFillerToken);
  std::fill(targets, targets + T, kIgnoreTarget);
  for (int64_t j = 0; j < P; ++j) {
    inputs[2 * j] = static_cast<int32_t>(first_key() + keys[static_cast<size_t>(j)]);
    inputs[2 * j + 1] = static_cast<int32_t>(first_value() + values[static_cast<size_t>(j)]);
  }
  for (int64_t j = 0; j < P; ++j) {
    const int64_t position = 2 * P + offsets[static_cast<size_t>(j)] + j;
    const int64_t pair = query_order[static_cast<size_t>(j)];
    inputs[position] = inputs[2 * pair];
    inputs[position + 1] = inputs[2 * pair + 1];
    targets[position] = inputs[2 * pair + 1];
  }
}

TokenBatch MqarGenerator::next_batch(int64_t batch_size) {
  HGRN_CHECK(batch_size >= 1, "mqar: batch size must be at least 1, got ", batch_size);
  HGRN_CHECK(cursor_ <= std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(batch_size),
             "mqar: the sequence cursor would overflow");
  TokenBatch batch{Tensor::empty({batch_size, seq_len_}, DType::I32),
                   Tensor::empty({batch_size, seq_len_}, DType::I32)};
  int32_t* inputs = batch.inputs.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  // Each sequence has its own forked generator, so the rows are independent and can be filled in parallel.
#pragma omp parallel for schedule(static) if (batch_size * seq_len_ >= (1 << 15))
  for (int64_t b = 0; b < batch_size; ++b)
    generate_sequence((cursor_ + static_cast<uint64_t>(b)) * world_size_ + rank_, inputs + b * seq_len_,
                      targets + b * seq_len_);
  cursor_ += static_cast<uint64_t>(batch_size);
  return batch;
}

}  // namespace hgrn
