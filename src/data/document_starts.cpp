// document_starts.cpp: reset flags at document starts (document_starts.h).
#include "data/document_starts.h"

#include "data/token_shards.h"

namespace hgrn {

void mark_document_starts(const TokenShardReader& shard, int64_t start, int64_t count, const int32_t* tokens,
                          int32_t eos_id, int32_t* flags) {
  if (count <= 0) return;
  int32_t before = eos_id;  // the stream's first token starts a document
  if (start > 0) shard.read(start - 1, 1, &before);
  flags[0] = before == eos_id;
  for (int64_t t = 1; t < count; ++t) flags[t] = tokens[t - 1] == eos_id;
}

}  // namespace hgrn
