// data_sources.cpp: choosing and opening the stream; shard vocabularies are checked against the model here, so a
// mismatch is one clear message instead of an out-of-range id deep inside the embedding.
#include "data/data_sources.h"

#include <filesystem>

#include "data/mqar.h"
#include "data/token_shards.h"
#include "data/token_streams.h"
#include "data/window_sampler.h"

namespace hgrn {

std::shared_ptr<const TokenShardReader> open_token_shard(const Config& config, const std::string& key,
                                                         const std::string& prefix) {
  for (const std::string& file : {shard_bin_path(prefix), shard_idx_path(prefix)})
    HGRN_CHECK(std::filesystem::exists(file), key, " = ", prefix, ": ", file,
               " does not exist: run `hgrn prepare` to write the shards first (see README, Data)");
  auto shard = std::make_shared<const TokenShardReader>(prefix);
  const std::string sidecar = shard_json_path(prefix);
  if (std::filesystem::exists(sidecar)) {
    const ShardMetadata meta = read_shard_metadata(sidecar);
    HGRN_CHECK(meta.vocab_size <= config.model.vocab_size, key, " = ", prefix, " was tokenised with ",
               meta.tokenizer, " (", meta.vocab_size, " ids), but model.vocab_size is ", config.model.vocab_size,
               ": set model.vocab_size to at least ", meta.vocab_size);
  }
  return shard;
}

int32_t document_eos_id(const std::string& key, const std::string& prefix) {
  const std::string sidecar = shard_json_path(prefix);
  try {
    return read_shard_metadata(sidecar).eos_id;
  } catch (const Error& error) {
    throw Error(detail::concat("data.reset_state_at_document restarts the state after each EOS token, whose id it "
                               "reads from the shard's sidecar: ", key, " = ", prefix, ": ", error.what(),
                               " (shards written by `hgrn prepare` have one; or set data.reset_state_at_document: "
                               "false)"));
  }
}

std::unique_ptr<BatchSource> make_training_source(const Config& config, uint64_t seed, int64_t rank,
                                                  int64_t world_size) {
  const DataConfig& d = config.data;
  if (d.task == "mqar")
    return std::make_unique<MqarGenerator>(d.mqar, config.model.vocab_size, d.seq_len, seed, rank, world_size);
  if (d.stateful) {
    const TrainingConfig tc = resolve_batch_for_world(config.training, world_size);
    StreamWindowOptions options;
    options.seq_len = d.seq_len;
    options.rows_per_step = tc.micro_batch_size * tc.grad_accum_steps;
    options.rank = rank;
    options.world_size = world_size;
    if (d.reset_state_at_document) options.document_eos = document_eos_id("data.train_data", d.train_data);
    return std::make_unique<StreamWindowSampler>(open_token_shard(config, "data.train_data", d.train_data), options);
  }
  WindowSamplerOptions options;
  options.seq_len = d.seq_len;
  options.seed = seed;
  options.rank = rank;
  options.world_size = world_size;
  options.shuffle = d.shuffle;
  if (d.reset_state_at_document) options.document_eos = document_eos_id("data.train_data", d.train_data);
  return std::make_unique<WindowSampler>(open_token_shard(config, "data.train_data", d.train_data), options);
}

std::unique_ptr<BatchSource> make_evaluation_source(const Config& config, uint64_t seed) {
  const DataConfig& d = config.data;
  if (d.task == "mqar") {
    MqarConfig held_out = d.mqar;
    held_out.num_train_sequences = 0;  // a fixed set is the training data's; held-out sequences are fresh draws
    return std::make_unique<MqarGenerator>(held_out, config.model.vocab_size, d.seq_len, seed);
  }
  if (d.valid_data.empty()) return nullptr;
  WindowSamplerOptions options;
  options.seq_len = d.seq_len;
  options.shuffle = false;
  if (d.reset_state_at_document) options.document_eos = document_eos_id("data.valid_data", d.valid_data);
  return std::make_unique<WindowSampler>(open_token_shard(config, "data.valid_data", d.valid_data), options);
}

std::optional<int64_t> training_eos_id(const Config& config, std::string* why) {
  if (config.data.task == "mqar") return std::nullopt;
  const std::string sidecar = shard_json_path(config.data.train_data);
  try {
    return read_shard_metadata(sidecar).eos_id;
  } catch (const Error& error) {
    if (why) *why = error.what();
    return std::nullopt;
  }
}

std::optional<double> chance_accuracy(const Config& config) {
  if (config.data.task != "mqar") return std::nullopt;
  return MqarGenerator(config.data.mqar, config.model.vocab_size, config.data.seq_len, 0).chance_accuracy();
}

}  // namespace hgrn
