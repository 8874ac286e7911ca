// document_starts.h: the per-token reset flags of data.reset_state_at_document. In a token stream whose documents
// each end with an EOS token (`hgrn prepare` appends one to every document), a document starts at the stream's first
// token and at every token that follows an EOS; a window of the stream restarts the model's recurrent state there
// (TokenBatch::resets), whether the start falls inside the window or on its first token.
#pragma once
#include <cstdint>

namespace hgrn {

class TokenShardReader;

// flags[t] = 1 where token start + t of the shard starts a document, else 0, for t in [0, count); tokens[t] holds
// token start + t (the window's inputs, already read), and the token before the window is read from the shard.
void mark_document_starts(const TokenShardReader& shard, int64_t start, int64_t count, const int32_t* tokens,
                          int32_t eos_id, int32_t* flags);

}  // namespace hgrn
