// token_shard_fixtures.h: a token shard of random documents for tests that train or read on tokens without a corpus.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/token_shards.h"

namespace hgrn::testing {

// Writes PREFIX.bin/.idx holding exactly `tokens` ids uniform in [0, vocab_size), as documents of 20 to 59 tokens
// (the last one shorter), drawn from `seed`; no sidecar.
inline void write_random_token_shard(const std::string& prefix, int64_t vocab_size, int64_t tokens, uint64_t seed) {
  Rng rng(seed);
  TokenShardWriter writer(prefix, vocab_size);
  for (int64_t written = 0; written < tokens;) {
    const int64_t length = std::min<int64_t>(20 + static_cast<int64_t>(rng.below(40)), tokens - written);
    std::vector<int32_t> ids(static_cast<size_t>(length));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab_size)));
    writer.append_document(ids);
    written += length;
  }
  writer.finish();
}

// Documents of random ids in [0, eos) closed by `eos`: the first one 6 tokens + EOS (so the second starts at token 7,
// a window boundary for windows of 7), then lengths 1 to 30; `tokens` tokens in all, with a sidecar naming the EOS.
inline void write_document_shard(const std::string& prefix, int32_t eos, int64_t tokens, uint64_t seed) {
  Rng rng(seed);
  TokenShardWriter writer(prefix, eos + 1);
  for (int64_t written = 0, d = 0; written < tokens; ++d) {
    const int64_t drawn = d == 0 ? 6 : 1 + static_cast<int64_t>(rng.below(30));
    const int64_t length = std::min<int64_t>(drawn, tokens - written - 1);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < length; ++t) ids.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(eos))));
    ids.push_back(eos);
    writer.append_document(ids);
    written += static_cast<int64_t>(ids.size());
  }
  ShardMetadata meta;
  meta.tokenizer = "test";
  meta.vocab_size = eos + 1;
  meta.eos_id = eos;
  writer.finish(meta);
}

}  // namespace hgrn::testing
