// data_sources.h: the batch streams a config asks for: the built-in MQAR task, or windows over token shards that
// `hgrn prepare` wrote (data.task: tokens), for training (shuffled) and for evaluation (in order, from the start).
#pragma once
#include <memory>
#include <optional>

#include "config/config.h"
#include "data/batch_source.h"

namespace hgrn {
class TokenShardReader;
}

namespace hgrn {

// The training stream of data-parallel rank `rank` of `world_size`, seeded by `seed`; with data.stateful, its rows'
// contiguous streams (data/token_streams.h).
std::unique_ptr<BatchSource> make_training_source(const Config& config, uint64_t seed, int64_t rank = 0,
                                                  int64_t world_size = 1);
// The held-out stream (read from cursor 0 at every evaluation): MQAR sequences of another seed, or the validation
// shard's windows in order. nullptr when the config has no held-out data (tokens without data.valid_data).
std::unique_ptr<BatchSource> make_evaluation_source(const Config& config, uint64_t seed);
// Opens the shard at `prefix` (named `key` in messages: the config key or option it came from) and checks its
// vocabulary (sidecar) against model.vocab_size, so that a mismatch is one clear message.
std::shared_ptr<const TokenShardReader> open_token_shard(const Config& config, const std::string& key,
                                                         const std::string& prefix);
// The EOS id that marks the document starts of the shard at `prefix` (data.reset_state_at_document), from its sidecar
// PREFIX.json; throws hgrn::Error naming `key` and the file when the sidecar is missing or unreadable.
int32_t document_eos_id(const std::string& key, const std::string& prefix);
// The end-of-document token id of the tokenizer a run trains with, from its training shard's sidecar: nullopt for
// MQAR (no tokenizer) and where the sidecar cannot be read (`why`, when given, then says what is missing).
std::optional<int64_t> training_eos_id(const Config& config, std::string* why = nullptr);
// For MQAR: the accuracy of guessing among the values; nullopt for real text.
std::optional<double> chance_accuracy(const Config& config);

}  // namespace hgrn
