// tokenizer.h: text <-> token ids. Two kinds: byte-level (no files: one id per UTF-8 byte, the default) and
// byte-level BPE loaded from a Hugging Face tokenizer.json (GPT-2, GPT-NeoX-20B and others of that family), whose
// ids equal the `tokenizers` Python package's byte for byte.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hgrn {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text` as the `tokenizers` package's encode(text, add_special_tokens=False) gives them.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids` (the inverse of encode for valid UTF-8 input).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // number of ids, added tokens included
  virtual int32_t eos_id() const = 0;      // the end-of-document token written between documents
  virtual std::string name() const = 0;    // "byte" or the tokenizer.json path, for metadata and messages
};

// Ids 0..255 are the bytes of the UTF-8 text; 256 is the end-of-document token (vocab_size 257).
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Loads a Hugging Face tokenizer.json with a BPE model, ByteLevel pre-tokenizer (GPT-2 regex) and optional NFC
// normaliser, plus its added tokens. The EOS is the added token "<|endoftext|>". Throws hgrn::Error naming the
// file and what is unsupported or malformed.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path);

// "byte" -> make_byte_tokenizer(); anything else is a tokenizer.json path.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec);

}  // namespace hgrn
