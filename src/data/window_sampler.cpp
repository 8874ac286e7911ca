// window_sampler.cpp: the per-epoch Feistel permutation and the window sampler (definitions in window_sampler.h).
#include "data/window_sampler.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "core/check.h"
#include "core/rng.h"
#include "data/document_starts.h"

namespace hgrn {

namespace {

// Six rounds: a balanced Feistel network with pseudo-random round functions is already a strong pseudo-random
// permutation after four (Luby-Rackoff); the extra two cost little next to reading a window.
constexpr int kFeistelRounds = 6;

}  // namespace

FeistelPermutation::FeistelPermutation(uint64_t size, uint64_t key)
    : size_(size), key_lo_(static_cast<uint32_t>(key)), key_hi_(static_cast<uint32_t>(key >> 32)) {
  HGRN_CHECK(size >= 1, "FeistelPermutation: size must be >= 1");
  HGRN_CHECK(size <= (uint64_t{1} << 62), "FeistelPermutation: size ", size, " is larger than 2^62");
  // Bits needed for the largest index; the domain 2^(2h) is below 4 * size, so cycle-walking takes fewer than four
  // steps on average.
  const int bits = std::bit_width(size - 1);
  half_bits_ = std::max(1, (bits + 1) / 2);
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t FeistelPermutation::round_function(int round, uint64_t half) const {
  // half has at most 31 bits (size <= 2^62), so it fits one counter word.
  const auto block = philox4x32_10({static_cast<uint32_t>(half), static_cast<uint32_t>(round), 0x7e57u, 0x3a11u},
                                   {key_lo_, key_hi_});
  return ((static_cast<uint64_t>(block[1]) << 32) | block[0]) & half_mask_;
}

uint64_t FeistelPermutation::operator()(uint64_t index) const {
  HGRN_CHECK(index < size_, "FeistelPermutation: index ", index, " is outside [0, ", size_, ")");
  if (size_ == 1) return 0;
  // Cycle-walking: the network permutes the whole power-of-two domain; following the cycle from an index inside
  // [0, size) until it returns inside gives a permutation of [0, size).
  uint64_t value = index;
  do {
    uint64_t left = value >> half_bits_, right = value & half_mask_;
    for (int round = 0; round < kFeistelRounds; ++round) {
      const uint64_t mixed = left ^ round_function(round, right);
      left = right;
      right = mixed;
    }
    value = (left << half_bits_) | right;
  } while (value >= size_);
  return value;
}

WindowSampler::WindowSampler(std::shared_ptr<const TokenShardReader> shard, const WindowSamplerOptions& options)
    : shard_(std::move(shard)), options_(options) {
  HGRN_CHECK(shard_ != nullptr, "WindowSampler: no token shard");
  const std::string& name = shard_->prefix();
  HGRN_CHECK(options_.seq_len >= 1, "WindowSampler for shard ", name, ": seq_len must be >= 1, got ",
             options_.seq_len);
  HGRN_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
             "WindowSampler for shard ", name, ": rank ", options_.rank, " is outside [0, world_size = ",
             options_.world_size, ")");
  const int64_t tokens = shard_->num_tokens();
  HGRN_CHECK(tokens >= options_.seq_len + 1, "WindowSampler: shard ", name, " has ", tokens,
             " tokens, fewer than one window of seq_len + 1 = ", options_.seq_len + 1,
             " (use a shorter seq_len or a larger corpus)");
  num_windows_ = (tokens - 1) / options_.seq_len;
}

const FeistelPermutation& WindowSampler::permutation_for_epoch(uint64_t epoch) const {
  if (cached_permutation_ == nullptr || cached_epoch_ != epoch) {
    const uint64_t key = Rng(options_.seed).fork(epoch).next_u64();
    cached_permutation_ = std::make_unique<FeistelPermutation>(static_cast<uint64_t>(num_windows_), key);
    cached_epoch_ = epoch;
  }
  return *cached_permutation_;
}

int64_t WindowSampler::window_at(uint64_t cursor) const {
  const uint64_t position = global_position(cursor);
  const uint64_t windows = static_cast<uint64_t>(num_windows_);
  const uint64_t index = position % windows;
  if (!options_.shuffle) return static_cast<int64_t>(index);
  return static_cast<int64_t>(permutation_for_epoch(position / windows)(index));
}

TokenBatch WindowSampler::next_batch(int64_t batch_size) {
  HGRN_CHECK(batch_size >= 1, "WindowSampler: batch_size must be >= 1, got ", batch_size);
  const int64_t seq_len = options_.seq_len;
  TokenBatch batch{Tensor::empty({batch_size, seq_len}, DType::I32), Tensor::empty({batch_size, seq_len}, DType::I32)};
  int32_t* inputs = batch.inputs.data<int32_t>();
  int32_t* targets = batch.targets.data<int32_t>();
  if (options_.document_eos >= 0) batch.resets = Tensor::empty({batch_size, seq_len}, DType::I32);
  for (int64_t row = 0; row < batch_size; ++row) {
    const int64_t start = window_start(window_at(cursor_ + static_cast<uint64_t>(row)));
    shard_->read(start, seq_len, inputs + row * seq_len);
    shard_->read(start + 1, seq_len, targets + row * seq_len);
    if (batch.resets.defined())
      mark_document_starts(*shard_, start, seq_len, inputs + row * seq_len,
                           static_cast<int32_t>(options_.document_eos), batch.resets.data<int32_t>() + row * seq_len);
  }
  cursor_ += static_cast<uint64_t>(batch_size);
  return batch;
}

}  // namespace hgrn
