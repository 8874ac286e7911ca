// tokenizer.cpp: the byte tokenizer (one id per UTF-8 byte plus an end-of-document id) and the factory functions
// that pick it or a Hugging Face byte-level BPE tokenizer.json.
#include "data/tokenizer.h"

#include "core/check.h"
#include "data/byte_level_bpe.h"

namespace hgrn {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEos = 256;

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
  }

  // The end-of-document id has no bytes of its own; it decodes to the same marker the BPE tokenizers use, so that
  // document boundaries stay visible in decoded samples.
  std::string decode(std::span<const int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (const int32_t id : ids) {
      HGRN_CHECK(id >= 0 && id <= kEos, "byte tokenizer: cannot decode id ", id, ": expected 0..255 (a byte) or ",
                 kEos, " (end of document)");
      if (id == kEos)
        text += "<|endoftext|>";
      else
        text += static_cast<char>(static_cast<uint8_t>(id));
    }
    return text;
  }

  int64_t vocab_size() const override { return kEos + 1; }
  int32_t eos_id() const override { return kEos; }
  std::string name() const override { return "byte"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path) {
  return std::make_unique<ByteLevelBpeTokenizer>(tokenizer_json_path);
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  HGRN_CHECK(!spec.empty(), "tokenizer: expected \"byte\" or the path of a Hugging Face tokenizer.json, got an empty "
             "string");
  if (spec == "byte") return make_byte_tokenizer();
  return load_hf_tokenizer(spec);
}

}  // namespace hgrn
