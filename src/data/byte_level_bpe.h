// byte_level_bpe.h: the byte-level BPE tokenizer of the GPT-2 family (GPT-2, GPT-NeoX-20B, ...) loaded from a Hugging
// Face tokenizer.json, reproducing the `tokenizers` package's pipeline: added tokens split out first, optional NFC,
// the GPT-2 pre-tokenizer regex, the GPT-2 byte-to-unicode mapping and BPE merges applied by rank.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace hgrn {

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  // Throws hgrn::Error naming `tokenizer_json_path` and what is missing, malformed or unsupported.
  explicit ByteLevelBpeTokenizer(const std::string& tokenizer_json_path);
  ~ByteLevelBpeTokenizer() override;

  // Thread-safe: encode and decode may be called from many threads at once (each thread keeps its own word cache).
  // Text that is not well-formed UTF-8 is an Error (the `tokenizers` package only ever sees valid Python strings).
  std::vector<int32_t> encode(std::string_view text) const override;
  // Ids outside the vocabulary are an Error. Added tokens (special ones included) decode to their content.
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;  // largest id + 1, added tokens included (the embedding's row count)
  int32_t eos_id() const override;
  std::string name() const override;

  // The id of a token as tokenizer.json spells it (vocabulary entries in their byte-level form such as "Ġthe", or an
  // added token's content such as "<|padding|>"), or nullopt if there is none.
  std::optional<int32_t> token_to_id(std::string_view token) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hgrn
