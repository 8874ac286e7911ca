// mqar.cpp: the MQAR sequence generator of mqar.h.
#include "data/mqar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
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

std::string mqar_layout_summary(const MqarConfig& config) {
  std::ostringstream out;
  if (config.query_placement == "power_law")
    out << "queries at power-law gaps (Zoology's layout, power_a " << config.power_a << ")";
  else
    out << "queries at uniform positions";
  out << (config.filler == "random" ? ", random filler tokens" : ", filler token 0");
  if (config.num_train_sequences > 0)
    out << ", a fixed training set of " << config.num_train_sequences << " sequences";
  return out.str();
}

// The stream (of Rng(seed).fork) that shuffles a fixed set's epochs: far above any sequence number of such a set.
constexpr uint64_t kEpochOrderStream = UINT64_MAX;

MqarGenerator::MqarGenerator(const MqarConfig& config, int64_t vocab_size, int64_t seq_len, uint64_t seed,
                             int64_t rank, int64_t world_size)
    : num_kv_pairs_(config.num_kv_pairs),
      vocab_size_(vocab_size),
      seq_len_(seq_len),
      base_rng_(seed),
      random_filler_(config.filler == "random"),
      num_train_sequences_(config.num_train_sequences) {
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
  HGRN_CHECK(config.query_placement == "uniform" || config.query_placement == "power_law",
             "mqar: query_placement must be uniform or power_law, got '", config.query_placement, "'");
  HGRN_CHECK(config.filler == "zero" || config.filler == "random", "mqar: filler must be zero or random, got '",
             config.filler, "'");
  HGRN_CHECK(num_train_sequences_ >= 0 && num_train_sequences_ <= kMqarMaxTrainSequences,
             "mqar: num_train_sequences must be in [0, ", kMqarMaxTrainSequences, "], got ", num_train_sequences_);
  if (config.query_placement == "power_law") {
    HGRN_CHECK(config.power_a > 0 && config.power_a <= 1, "mqar: power_a must be in (0, 1], got ", config.power_a);
    // In (0, 1] the weights fall (or stay flat) with the gap and lie in [S^-1, 1]: none vanishes.
    gap_weights_.resize(static_cast<size_t>((seq_len_ - 2 * num_kv_pairs_) / 2));
    for (size_t g = 0; g < gap_weights_.size(); ++g)
      gap_weights_[g] = std::pow(static_cast<double>(g + 1), config.power_a - 1.0);
  }
}

uint64_t MqarGenerator::sequence_of_draw(uint64_t draw) {
  if (num_train_sequences_ == 0) return draw;
  const uint64_t count = static_cast<uint64_t>(num_train_sequences_), epoch = draw / count;
  if (epoch != shuffled_epoch_) {  // a uniformly random order of the set for this epoch (Fisher-Yates)
    Rng rng = Rng(base_rng_.fork(kEpochOrderStream).next_u64()).fork(epoch);
    epoch_order_.resize(count);
    for (uint64_t i = 0; i < count; ++i) epoch_order_[i] = static_cast<uint32_t>(i);
    for (uint64_t i = count - 1; i > 0; --i) std::swap(epoch_order_[i], epoch_order_[rng.below(i + 1)]);
    shuffled_epoch_ = epoch;
  }
  return epoch_order_[draw % count];
}

void MqarGenerator::generate_sequence(uint64_t index, int32_t* inputs, int32_t* targets) const {
  Rng rng = base_rng_.fork(index);
  const int64_t P = num_kv_pairs_, T = seq_len_;
  const std::vector<int64_t> keys = sample_distinct(rng, num_keys_, P);
  const std::vector<int64_t> values = sample_distinct(rng, num_values_, P);

  std::fill(inputs, inputs + T, kMqarFillerToken);
  std::fill(targets, targets + T, kIgnoreTarget);
  for (int64_t j = 0; j < P; ++j) {
    inputs[2 * j] = static_cast<int32_t>(first_key() + keys[static_cast<size_t>(j)]);
    inputs[2 * j + 1] = static_cast<int32_t>(first_value() + values[static_cast<size_t>(j)]);
  }
  if (!power_law_placement()) {
    const std::vector<int64_t> query_order = sample_distinct(rng, P, P);
    // Non-overlapping 2-token slots in the R = T - 2P query positions: choosing P distinct offsets from R - P and
    // adding j to the j-th smallest is a bijection onto the placements, so each placement is equally likely.
    const int64_t query_region = T - 2 * P;
    std::vector<int64_t> offsets = sample_distinct(rng, query_region - P, P);
    std::sort(offsets.begin(), offsets.end());
    for (int64_t j = 0; j < P; ++j) {
      const int64_t position = 2 * P + offsets[static_cast<size_t>(j)] + j;
      const int64_t pair = query_order[static_cast<size_t>(j)];
      inputs[position] = inputs[2 * pair];
      inputs[position + 1] = inputs[2 * pair + 1];
      targets[position] = inputs[2 * pair + 1];
    }
  } else {
    // Successive weighted draws without replacement: a taken gap's weight drops to 0. O(P * S), small next to a step.
    std::vector<double> weights = gap_weights_;
    for (int64_t j = 0; j < P; ++j) {
      double total = 0;
      for (double w : weights) total += w;
      double left = rng.uniform() * total;
      size_t gap = 0;
      for (size_t g = 0; g < weights.size(); ++g) {
        if (weights[g] == 0) continue;
        gap = g;  // the last gap still free, should rounding carry `left` past the end
        left -= weights[g];
        if (left < 0) break;
      }
      weights[gap] = 0;
      const int64_t position = 2 * P + 2 * static_cast<int64_t>(gap);
      inputs[position] = inputs[2 * j];
      targets[position] = inputs[2 * j + 1];
    }
  }
  // Keys and values are never token 0, so the filler is exactly what still holds it.
  if (random_filler_)
    for (int64_t t = 2 * P; t < T; ++t)
      if (inputs[t] == kMqarFillerToken)
        inputs[t] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size_)));
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
  std::vector<uint64_t> sequences(static_cast<size_t>(batch_size));
  for (int64_t b = 0; b < batch_size; ++b)
    sequences[static_cast<size_t>(b)] = sequence_of_draw((cursor_ + static_cast<uint64_t>(b)) * world_size_ + rank_);
#pragma omp parallel for schedule(static) if (batch_size * seq_len_ >= (1 << 15))
  for (int64_t b = 0; b < batch_size; ++b)
    generate_sequence(sequences[static_cast<size_t>(b)], inputs + b * seq_len_, targets + b * seq_len_);
  cursor_ += static_cast<uint64_t>(batch_size);
  return batch;
}

}  // namespace hgrn
