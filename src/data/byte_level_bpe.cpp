// byte_level_bpe.cpp: loading a Hugging Face byte-level BPE tokenizer.json and encoding text exactly as the
// `tokenizers` package does with encode(text, add_special_tokens=False):
//   1. cut the text at added tokens whose "normalized" flag is false (matched in the raw text),
//   2. NFC-normalise each remaining piece (if the normaliser is NFC),
//   3. cut those pieces at added tokens whose "normalized" flag is true,
//   4. split what is left with the GPT-2 regex (optionally after prefixing a space),
//   5. run BPE on the bytes of each regex word, applying merges lowest rank first, with a per-thread word cache.
// Decoding maps every vocabulary token back through the inverse of GPT-2's byte-to-unicode table.
#include "data/byte_level_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "core/check.h"
#include "data/utf8.h"

namespace hgrn {

namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// UTF-8 and Unicode helpers (the input is validated before any of these run).

// The code point starting at text[pos]; advances pos past it.
char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) {
    pos += 1;
    return lead;
  }
  if (lead < 0xE0) {
    const char32_t cp = (char32_t(lead & 0x1F) << 6) | (byte(pos + 1) & 0x3F);
    pos += 2;
    return cp;
  }
  if (lead < 0xF0) {
    const char32_t cp = (char32_t(lead & 0x0F) << 12) | (char32_t(byte(pos + 1) & 0x3F) << 6) | (byte(pos + 2) & 0x3F);
    pos += 3;
    return cp;
  }
  const char32_t cp = (char32_t(lead & 0x07) << 18) | (char32_t(byte(pos + 1) & 0x3F) << 12) |
                      (char32_t(byte(pos + 2) & 0x3F) << 6) | (byte(pos + 3) & 0x3F);
  pos += 4;
  return cp;
}

// The code point that ends just before text[end] (end > 0).
char32_t previous_code_point(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Unicode's White_Space property, which is what Rust's char::is_whitespace (used by lstrip/rstrip) tests.
bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// A regex \w character (Unicode's Alphabetic, marks, decimal digits, connector punctuation, joiners): what a
// single_word added token must not touch on either side. This is the rule the `tokenizers` package applies (checked
// against it: "1", "é", "Ⅰ", U+0301 and "_" block a match; "²", "€", "-" and U+200B do not).
bool is_word_character(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  // Symbols that Unicode counts as Alphabetic (Other_Alphabetic): circled and squared Latin letters.
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
      (cp >= 0x1F170 && cp <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

std::string nfc(std::string_view text) {
  utf8proc_uint8_t* composed = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  HGRN_CHECK(length >= 0, "byte_level_bpe.cpp: NFC normalisation failed: ", utf8proc_errmsg(length));
  std::string result(reinterpret_cast<const char*>(composed), static_cast<size_t>(length));
  std::free(composed);
  return result;
}

bool is_ascii(char c) { return static_cast<uint8_t>(c) < 0x80; }

// Every code point below U+0300 is unchanged by NFC and composes with nothing before it (combining marks start at
// U+0300, whose UTF-8 lead byte is 0xCC).
bool may_change_under_nfc(char c) { return static_cast<uint8_t>(c) >= 0xCC; }

// The NFC form of `text` (in `storage` if it differs). Running utf8proc over whole documents is slow, and nearly all
// of a typical document is ASCII, so only the stretches of non-ASCII text that contain a byte >= 0xCC go through
// it, each together with the ASCII character before it (a base letter that a combining mark may compose with).
// Cutting just before an ASCII character is safe: ASCII characters are starters that never compose with what
// precedes them, so normalisation cannot reach across such a cut.
std::string_view nfc_of(std::string_view text, std::string& storage) {
  size_t pos = 0;
  while (pos < text.size() && !may_change_under_nfc(text[pos])) ++pos;
  if (pos == text.size()) return text;
  storage.clear();
  storage.reserve(text.size() + 16);
  size_t copied = 0;  // text[0, copied) is in storage; `copied` is 0 or the index of an ASCII character
  while (pos < text.size()) {
    size_t start = pos;
    while (start > copied && !is_ascii(text[start])) --start;
    size_t end = pos;
    while (end < text.size() && !is_ascii(text[end])) ++end;
    storage.append(text.substr(copied, start - copied));
    storage += nfc(text.substr(start, end - start));
    copied = end;
    pos = end;
    while (pos < text.size() && !may_change_under_nfc(text[pos])) ++pos;
  }
  storage.append(text.substr(copied));
  return storage;
}

// ---------------------------------------------------------------------------------------------------------------
// GPT-2's byte-to-unicode table: bytes that are printable Latin-1 stand for themselves, the other 68 are shifted to
// U+0100..U+0143 so that every byte has a visible, non-space character in vocab.json and merges.

struct ByteLevelAlphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::unordered_map<char32_t, uint8_t> byte_of_char;

  ByteLevelAlphabet() {
    char32_t next_shifted = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char_of_byte[b] = printable ? static_cast<char32_t>(b) : next_shifted++;
      byte_of_char[char_of_byte[b]] = static_cast<uint8_t>(b);
    }
  }

  // The bytes a vocabulary token stands for, or nullopt if one of its characters is outside the alphabet.
  std::optional<std::string> bytes_of_token(std::string_view token) const {
    std::string bytes;
    size_t pos = 0;
    while (pos < token.size()) {
      const auto it = byte_of_char.find(next_code_point(token, pos));
      if (it == byte_of_char.end()) return std::nullopt;
      bytes += static_cast<char>(it->second);
    }
    return bytes;
  }

  std::string token_of_byte(uint8_t byte) const {
    std::string token;
    append_utf8(token, char_of_byte[byte]);
    return token;
  }
};

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

// ---------------------------------------------------------------------------------------------------------------
// The GPT-2 pre-tokenizer regex. The `tokenizers` package runs it with Oniguruma, whose Unicode \s is
// [\t\n\v\f\r\x85] plus the Z categories; PCRE2's \s differs from that in a few code points (U+180E in some
// versions), so the class is spelled out. (\v inside a PCRE2 class means "vertical space", hence the hex range.)

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?\\p{L}+| ?\\p{N}+"
    "| ?[^\\x{09}-\\x{0D}\\x{20}\\x{85}\\p{Z}\\p{L}\\p{N}]+"
    "|[\\x{09}-\\x{0D}\\x{20}\\x{85}\\p{Z}]+(?![^\\x{09}-\\x{0D}\\x{20}\\x{85}\\p{Z}])"
    "|[\\x{09}-\\x{0D}\\x{20}\\x{85}\\p{Z}]+";

class Gpt2Regex {
 public:
  explicit Gpt2Regex(const std::string& path) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &error_code, &error_offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof message);
      HGRN_CHECK(false, path, ": could not compile the GPT-2 pre-tokenizer regex (PCRE2 with Unicode support is "
                 "required): ", reinterpret_cast<const char*>(message), " at offset ", error_offset);
    }
    // JIT is several times faster; a PCRE2 built without it still works through the interpreter.
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Gpt2Regex() { pcre2_code_free(code_); }
  Gpt2Regex(const Gpt2Regex&) = delete;
  Gpt2Regex& operator=(const Gpt2Regex&) = delete;

  // Calls on_word for every piece of `text`: the regex matches and (the pattern covers every character, so this
  // does not happen in practice) any unmatched gap between them, as the `tokenizers` package's Isolated split does.
  template <typename OnWord>
  void split(std::string_view text, OnWord&& on_word) const {
    pcre2_match_data* match = thread_match_data();
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, 0, match, nullptr)
                          : pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        HGRN_CHECK(false, "byte_level_bpe.cpp: the GPT-2 pre-tokenizer regex failed on a ", text.size(),
                   "-byte piece of text: ", reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match);
      const size_t start = bounds[0], end = bounds[1];
      if (start > pos) on_word(text.substr(pos, start - pos));
      if (end == start) {  // an empty match cannot come from this pattern; step over a character to stay safe
        size_t next = start;
        next_code_point(text, next);
        on_word(text.substr(start, next - start));
        pos = next;
        continue;
      }
      on_word(text.substr(start, end - start));
      pos = end;
    }
    if (pos < text.size()) on_word(text.substr(pos));
  }

 private:
  // Match data holds the result of one match; each thread needs its own, and one ovector pair suffices.
  static pcre2_match_data* thread_match_data() {
    struct Holder {
      pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
      ~Holder() { pcre2_match_data_free(data); }
    };
    thread_local Holder holder;
    HGRN_CHECK(holder.data != nullptr, "byte_level_bpe.cpp: out of memory creating PCRE2 match data");
    return holder.data;
  }

  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// Added tokens: a byte trie searched leftmost-first, longest-match (the `tokenizers` package uses an Aho-Corasick
// automaton with MatchKind::LeftmostLongest, which yields the same non-overlapping matches).

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  // "special" is not kept: it only matters for skip_special_tokens in decoding, and hgrn decodes every token.
};

class AddedTokenSplitter {
 public:
  void add(const std::string& match_text, const AddedToken& token) {
    if (match_text.empty()) return;  // an empty pattern would match everywhere; the package ignores such tokens too
    int32_t node = 0;
    for (const char c : match_text) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t child = child_of(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        nodes_[node].children.emplace_back(byte, child);
      }
      node = child;
    }
    if (nodes_[node].token < 0) {  // a duplicate content keeps the first token, as the first pattern wins there
      nodes_[node].token = static_cast<int32_t>(tokens_.size());
      tokens_.push_back(token);
    }
  }

  // Cuts `text` at the added tokens: on_text(piece) for each non-empty stretch between matches, on_token(id) for
  // each match, in order. The single_word / lstrip / rstrip flags follow the package's AddedVocabulary rules.
  template <typename OnText, typename OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    if (tokens_.empty()) {
      if (!text.empty()) on_text(text);
      return;
    }
    size_t emitted_until = 0;  // text[0, emitted_until) has been handed out
    size_t pos = 0;
    while (pos < text.size()) {
      if (root_child_[static_cast<uint8_t>(text[pos])] < 0) {  // the common case: no token starts with this byte
        ++pos;
        continue;
      }
      size_t match_end = 0;
      const AddedToken* token = longest_match_at(text, pos, match_end);
      if (token == nullptr) {
        ++pos;
        continue;
      }
      size_t start = pos, stop = match_end;
      pos = match_end;  // the automaton resumes after the match whether or not the match is kept
      if (token->single_word) {
        const bool free_before = start == 0 || !is_word_character(previous_code_point(text, start));
        size_t after = stop;
        const bool free_after = stop == text.size() || !is_word_character(next_code_point(text, after));
        if (!free_before || !free_after) continue;
      }
      if (token->lstrip) {
        size_t new_start = start;
        while (new_start > 0 && is_white_space(previous_code_point(text, new_start))) {
          --new_start;
          while (new_start > 0 && (static_cast<uint8_t>(text[new_start]) & 0xC0) == 0x80) --new_start;
        }
        start = std::max(new_start, emitted_until);
      }
      if (token->rstrip) {
        size_t next = stop;
        while (next < text.size()) {
          size_t after = next;
          if (!is_white_space(next_code_point(text, after))) break;
          next = after;
        }
        stop = next;
        pos = std::max(pos, stop);  // the stripped white space is consumed; a token inside it is not matched again
      }
      if (emitted_until < start) on_text(text.substr(emitted_until, start - emitted_until));
      on_token(token->id);
      emitted_until = stop;
    }
    if (emitted_until < text.size()) on_text(text.substr(emitted_until));
  }

  // Builds the table of the root's children (the hot lookup in split); called once after the last add().
  void finish() {
    root_child_.fill(-1);
    for (const auto& [byte, child] : nodes_[0].children) root_child_[byte] = child;
  }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t token = -1;  // index into tokens_ if an added token ends here
  };

  int32_t child_of(int32_t node, uint8_t byte) const {
    for (const auto& [b, child] : nodes_[node].children)
      if (b == byte) return child;
    return -1;
  }

  const AddedToken* longest_match_at(std::string_view text, size_t pos, size_t& match_end) const {
    const AddedToken* best = nullptr;
    int32_t node = root_child_[static_cast<uint8_t>(text[pos])];
    size_t k = pos + 1;
    while (true) {
      if (nodes_[node].token >= 0) {
        best = &tokens_[nodes_[node].token];
        match_end = k;
      }
      if (k >= text.size()) break;
      node = child_of(node, static_cast<uint8_t>(text[k]));
      if (node < 0) break;
      ++k;
    }
    return best;
  }

  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<int32_t, 256> root_child_ = [] {
    std::array<int32_t, 256> empty;
    empty.fill(-1);
    return empty;
  }();
  std::vector<AddedToken> tokens_;
};

// ---------------------------------------------------------------------------------------------------------------
// The per-thread word cache. Regex words repeat heavily in natural text ("the", " of", ","), so remembering each
// word's ids skips almost all BPE work. Each thread has its own cache per tokenizer, so encode() needs no lock.

struct TransparentStringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

struct WordCache {
  struct Entry {
    uint32_t offset;  // into ids
    uint32_t count;
  };
  // Bounded so a long run over varied text (code, URLs, numbers) cannot grow it without limit; when full it is
  // emptied and refills with the words now in use, which keeps it useful if the text's vocabulary drifts.
  static constexpr size_t kMaxWords = 1 << 16;
  static constexpr size_t kMaxWordBytes = 128;  // longer words are rare and not worth keeping

  uint64_t owner = 0;  // the serial number of the tokenizer it belongs to
  std::unordered_map<std::string, Entry, TransparentStringHash, std::equal_to<>> words;
  std::vector<int32_t> ids;
};

// Serial numbers rather than addresses identify tokenizers, so a new tokenizer allocated where a destroyed one
// lived can never see the old one's cache.
std::atomic<uint64_t> next_tokenizer_serial{1};

WordCache& thread_word_cache(uint64_t owner) {
  // A thread rarely uses more than one or two tokenizers; the oldest cache is dropped past that.
  constexpr size_t kMaxCachesPerThread = 4;
  thread_local std::vector<std::unique_ptr<WordCache>> caches;
  for (auto& cache : caches)
    if (cache->owner == owner) return *cache;
  if (caches.size() >= kMaxCachesPerThread) caches.erase(caches.begin());
  caches.push_back(std::make_unique<WordCache>());
  caches.back()->owner = owner;
  return *caches.back();
}

// ---------------------------------------------------------------------------------------------------------------
// Reading tokenizer.json.

Json read_json_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  HGRN_CHECK(fs::is_regular_file(path, ec), "tokenizer file '", path,
             "' does not exist or is not a file: expected a Hugging Face tokenizer.json (or \"byte\")");
  std::ifstream in(path, std::ios::binary);
  HGRN_CHECK(in.good(), "tokenizer file '", path, "' cannot be opened for reading");
  std::stringstream contents;
  contents << in.rdbuf();
  try {
    return Json::parse(contents.str());
  } catch (const Json::exception& e) {
    HGRN_CHECK(false, "tokenizer file '", path, "' is not valid JSON (expected a Hugging Face tokenizer.json): ",
               e.what());
  }
  return {};
}

std::string describe_type(const Json& value) {
  if (value.is_object() && value.contains("type") && value["type"].is_string())
    return "type \"" + value["type"].get<std::string>() + "\"";
  return value.dump().substr(0, 80);
}

bool flag(const Json& object, const char* key, bool default_value, const std::string& path, const char* where) {
  if (!object.contains(key) || object[key].is_null()) return default_value;
  HGRN_CHECK(object[key].is_boolean(), path, ": ", where, ".", key, " must be true or false, got ", object[key].dump());
  return object[key].get<bool>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct ByteLevelBpeTokenizer::Impl {
  struct Merge {
    uint32_t rank;
    int32_t merged_id;
  };

  std::string path;
  uint64_t serial = next_tokenizer_serial.fetch_add(1);
  bool nfc = false;
  bool add_prefix_space = false;
  bool use_regex = true;
  bool ignore_merges = false;
  std::unique_ptr<Gpt2Regex> regex;
  std::array<int32_t, 256> byte_id{};              // the id of each single byte's token
  std::unordered_map<uint64_t, Merge> merges;       // (left id << 32 | right id) -> rank and merged id
  std::unordered_map<std::string, int32_t> vocab;   // byte-level spelling -> id
  std::unordered_map<std::string, int32_t, TransparentStringHash, std::equal_to<>> word_ids;  // bytes -> id
  std::unordered_map<std::string, int32_t> added_ids;  // added token content -> id
  AddedTokenSplitter raw_added;         // "normalized": false, matched before normalisation
  AddedTokenSplitter normalized_added;  // "normalized": true, matched in the normalised text
  std::vector<std::string> text_of_id;  // what decode writes for each id
  std::vector<bool> has_id;
  int32_t eos = -1;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  const Merge* find_merge(int32_t left, int32_t right) const {
    const auto it = merges.find(pair_key(left, right));
    return it == merges.end() ? nullptr : &it->second;
  }

  void load(const Json& root);
  void load_model(const Json& model);
  void load_normalizer(const Json& normalizer);
  void load_pre_tokenizer(const Json& pre_tokenizer);
  void load_decoder(const Json& decoder);
  void load_added_tokens(const Json& added_tokens);

  void encode_text(std::string_view text, WordCache& cache, std::vector<int32_t>& out) const;
  void encode_normalizable(std::string_view piece, WordCache& cache, std::vector<int32_t>& out) const;
  void encode_pre_tokenized(std::string_view piece, WordCache& cache, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, WordCache& cache, std::vector<int32_t>& out) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
};

void ByteLevelBpeTokenizer::Impl::load(const Json& root) {
  HGRN_CHECK(root.is_object(), path, ": expected a JSON object at the top level of a tokenizer.json");
  HGRN_CHECK(root.contains("model") && root["model"].is_object(), path,
             ": expected a \"model\" object (a Hugging Face tokenizer.json)");
  load_model(root["model"]);
  load_normalizer(root.value("normalizer", Json()));
  load_pre_tokenizer(root.value("pre_tokenizer", Json()));
  load_decoder(root.value("decoder", Json()));
  // The post-processor only adds special tokens when add_special_tokens=True, which hgrn never asks for.
  load_added_tokens(root.value("added_tokens", Json::array()));

  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  for (const auto& [content, id] : added_ids) max_id = std::max(max_id, id);
  text_of_id.assign(static_cast<size_t>(max_id) + 1, std::string());
  has_id.assign(static_cast<size_t>(max_id) + 1, false);
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  for (const auto& [token, id] : vocab) {
    // The package's ByteLevel decoder passes a token through unchanged if a character is outside the alphabet.
    std::optional<std::string> bytes = alphabet.bytes_of_token(token);
    text_of_id[id] = bytes ? *bytes : token;
    has_id[id] = true;
  }
  // Added tokens decode to their content, so that decode(encode(text)) == text also across them.
  for (const auto& [content, id] : added_ids) {
    text_of_id[id] = content;
    has_id[id] = true;
  }

  if (const auto it = added_ids.find("<|endoftext|>"); it != added_ids.end())
    eos = it->second;
  else if (const auto v = vocab.find("<|endoftext|>"); v != vocab.end())
    eos = v->second;
  HGRN_CHECK(eos >= 0, path, ": expected an end-of-text token \"<|endoftext|>\" among the added tokens or the "
             "vocabulary (hgrn writes it between documents)");
}

void ByteLevelBpeTokenizer::Impl::load_model(const Json& model) {
  if (model.contains("type")) {
    HGRN_CHECK(model["type"] == "BPE", path, ": expected model.type \"BPE\", got ", model["type"].dump(),
               " (hgrn supports byte-level BPE tokenizers only)");
  }
  HGRN_CHECK(model.contains("vocab") && model["vocab"].is_object(), path,
             ": expected model.vocab, an object mapping tokens to ids");
  HGRN_CHECK(model.contains("merges") && model["merges"].is_array(), path,
             ": expected model.merges, a list of \"left right\" strings or [left, right] pairs");
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    HGRN_CHECK(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0, path,
               ": model.dropout must be null or 0 (BPE dropout makes encoding random), got ", model["dropout"].dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null()) {
      HGRN_CHECK(model[key].is_string() && model[key].get<std::string>().empty(), path, ": model.", key,
                 " must be null or empty for a byte-level BPE, got ", model[key].dump());
    }
  }
  ignore_merges = flag(model, "ignore_merges", false, path, "model");

  std::vector<bool> id_taken;
  for (const auto& [token, id_json] : model["vocab"].items()) {
    HGRN_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() < INT32_MAX,
               path, ": model.vocab[\"", token, "\"] must be a non-negative integer id, got ", id_json.dump());
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    if (static_cast<size_t>(id) >= id_taken.size()) id_taken.resize(static_cast<size_t>(id) + 1, false);
    HGRN_CHECK(!id_taken[id], path, ": model.vocab gives id ", id, " to more than one token (\"", token, "\" too)");
    id_taken[id] = true;
    vocab.emplace(token, id);
  }

  // Every byte that can occur in UTF-8 text needs a token. C0, C1 and F5..FF never occur in well-formed UTF-8
  // (encode rejects text that is not), and GPT-NeoX-20B's vocabulary indeed lacks them.
  const ByteLevelAlphabet& alphabet = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) {
    const std::string token = alphabet.token_of_byte(static_cast<uint8_t>(b));
    const auto it = vocab.find(token);
    const bool occurs_in_utf8 = b != 0xC0 && b != 0xC1 && b < 0xF5;
    HGRN_CHECK(it != vocab.end() || !occurs_in_utf8, path, ": model.vocab lacks the byte-level token \"", token,
               "\" for byte ", b, "; a byte-level BPE needs one for every byte that UTF-8 text can contain");
    byte_id[b] = it != vocab.end() ? it->second : -1;
  }
  if (ignore_merges) {
    for (const auto& [token, id] : vocab)
      if (std::optional<std::string> bytes = alphabet.bytes_of_token(token)) word_ids.emplace(std::move(*bytes), id);
  }

  const Json& merge_list = model["merges"];
  merges.reserve(merge_list.size() * 2);
  for (size_t rank = 0; rank < merge_list.size(); ++rank) {
    const Json& merge = merge_list[rank];
    std::string left, right;
    if (merge.is_string()) {  // the older "left right" form
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      HGRN_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos, path,
                 ": model.merges[", rank, "] must be two tokens separated by one space, got \"", text, "\"");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {  // the newer ["left", "right"] form
      HGRN_CHECK(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(), path,
                 ": model.merges[", rank, "] must be \"left right\" or [\"left\", \"right\"], got ", merge.dump());
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    const auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
    HGRN_CHECK(l != vocab.end() && r != vocab.end(), path, ": model.merges[", rank, "] (\"", left, "\", \"", right,
               "\") uses a token that is not in model.vocab");
    HGRN_CHECK(m != vocab.end(), path, ": model.merges[", rank, "] merges to \"", left + right,
               "\", which is not in model.vocab");
    // A repeated pair takes its later rank, as the package's map built from the list does.
    merges.insert_or_assign(pair_key(l->second, r->second), Merge{static_cast<uint32_t>(rank), m->second});
  }
}

void ByteLevelBpeTokenizer::Impl::load_normalizer(const Json& normalizer) {
  if (normalizer.is_null()) return;
  const auto supported = [&](const Json& n) { return n.is_object() && n.value("type", "") == "NFC"; };
  if (supported(normalizer)) {
    nfc = true;
    return;
  }
  // A Sequence of NFC steps is still NFC (NFC is idempotent); anything else would change the ids.
  if (normalizer.is_object() && normalizer.value("type", "") == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array()) {
    for (const Json& step : normalizer["normalizers"])
      HGRN_CHECK(supported(step), path, ": unsupported normalizer step ", describe_type(step),
                 " (hgrn supports no normaliser or NFC)");
    nfc = !normalizer["normalizers"].empty();
    return;
  }
  HGRN_CHECK(false, path, ": unsupported normalizer ", describe_type(normalizer),
             " (hgrn supports null or {\"type\": \"NFC\"})");
}

void ByteLevelBpeTokenizer::Impl::load_pre_tokenizer(const Json& pre_tokenizer) {
  HGRN_CHECK(pre_tokenizer.is_object() && pre_tokenizer.value("type", "") == "ByteLevel", path,
             ": unsupported pre_tokenizer ", describe_type(pre_tokenizer),
             " (hgrn supports the byte-level BPE family: {\"type\": \"ByteLevel\"})");
  add_prefix_space = flag(pre_tokenizer, "add_prefix_space", true, path, "pre_tokenizer");
  use_regex = flag(pre_tokenizer, "use_regex", true, path, "pre_tokenizer");
  if (use_regex) regex = std::make_unique<Gpt2Regex>(path);
}

void ByteLevelBpeTokenizer::Impl::load_decoder(const Json& decoder) {
  HGRN_CHECK(decoder.is_null() || (decoder.is_object() && decoder.value("type", "") == "ByteLevel"), path,
             ": unsupported decoder ", describe_type(decoder),
             " (hgrn decodes byte-level BPE: {\"type\": \"ByteLevel\"})");
}

void ByteLevelBpeTokenizer::Impl::load_added_tokens(const Json& added_tokens) {
  HGRN_CHECK(added_tokens.is_array(), path, ": added_tokens must be a list");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const Json& entry = added_tokens[i];
    HGRN_CHECK(entry.is_object() && entry.contains("id") && entry["id"].is_number_integer() &&
                   entry["id"].get<int64_t>() >= 0 && entry["id"].get<int64_t>() < INT32_MAX &&
                   entry.contains("content") && entry["content"].is_string(),
               path, ": added_tokens[", i, "] must have a non-negative integer \"id\" and a string \"content\", got ",
               entry.dump().substr(0, 200));
    AddedToken token;
    token.content = entry["content"].get<std::string>();
    token.id = static_cast<int32_t>(entry["id"].get<int64_t>());
    HGRN_CHECK(!first_invalid_utf8(token.content), path, ": added_tokens[", i, "].content is not valid UTF-8");
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    token.single_word = flag(entry, "single_word", false, path, where.c_str());
    token.lstrip = flag(entry, "lstrip", false, path, where.c_str());
    token.rstrip = flag(entry, "rstrip", false, path, where.c_str());
    token.normalized = flag(entry, "normalized", true, path, where.c_str());
    flag(entry, "special", false, path, where.c_str());  // validated only; see AddedToken
    added_ids.emplace(token.content, token.id);
    if (token.normalized)
      normalized_added.add(nfc ? hgrn::nfc(token.content) : token.content, token);
    else
      raw_added.add(token.content, token);
  }
  raw_added.finish();
  normalized_added.finish();
}

void ByteLevelBpeTokenizer::Impl::encode_text(std::string_view text, WordCache& cache,
                                              std::vector<int32_t>& out) const {
  raw_added.split(
      text, [&](std::string_view piece) { encode_normalizable(piece, cache, out); },
      [&](int32_t id) { out.push_back(id); });
}

void ByteLevelBpeTokenizer::Impl::encode_normalizable(std::string_view piece, WordCache& cache,
                                                      std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc) piece = nfc_of(piece, normalized);
  normalized_added.split(
      piece, [&](std::string_view rest) { encode_pre_tokenized(rest, cache, out); },
      [&](int32_t id) { out.push_back(id); });
}

void ByteLevelBpeTokenizer::Impl::encode_pre_tokenized(std::string_view piece, WordCache& cache,
                                                       std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  std::string prefixed;
  if (add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  if (!use_regex) {
    encode_word(piece, cache, out);
    return;
  }
  regex->split(piece, [&](std::string_view word) { encode_word(word, cache, out); });
}

void ByteLevelBpeTokenizer::Impl::encode_word(std::string_view word, WordCache& cache,
                                              std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_id[static_cast<uint8_t>(word[0])]);
    return;
  }
  if (const auto hit = cache.words.find(word); hit != cache.words.end()) {
    const int32_t* ids = cache.ids.data() + hit->second.offset;
    out.insert(out.end(), ids, ids + hit->second.count);
    return;
  }
  const size_t first = out.size();
  if (ignore_merges) {
    if (const auto whole = word_ids.find(word); whole != word_ids.end())
      out.push_back(whole->second);
    else
      merge_word(word, out);
  } else {
    merge_word(word, out);
  }
  if (word.size() > WordCache::kMaxWordBytes) return;
  if (cache.words.size() >= WordCache::kMaxWords) {
    cache.words.clear();
    cache.ids.clear();
  }
  const auto count = static_cast<uint32_t>(out.size() - first);
  cache.words.emplace(std::string(word), WordCache::Entry{static_cast<uint32_t>(cache.ids.size()), count});
  cache.ids.insert(cache.ids.end(), out.begin() + static_cast<ptrdiff_t>(first), out.end());
}

// BPE on one word: start from one symbol per byte and repeatedly merge the adjacent pair with the lowest merge rank
// (leftmost first among equal ranks). A min-heap of candidate merges is kept; entries made stale by an earlier
// merge are recognised and skipped when popped, the way the `tokenizers` package does it (a candidate is still
// valid if the pair now at its position merges to the same token).
void ByteLevelBpeTokenizer::Impl::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged_id;
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    symbols[i] = Symbol{byte_id[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, true};

  // std::push_heap builds a max-heap under `comes_later`, so the top is the lowest rank, then the lowest position.
  const auto comes_later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Candidate> heap;
  heap.reserve(static_cast<size_t>(n));
  const auto push_candidate = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (const Merge* m = find_merge(symbols[pos].id, symbols[next].id)) {
      heap.push_back(Candidate{m->rank, pos, m->merged_id});
      std::push_heap(heap.begin(), heap.end(), comes_later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), comes_later);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = find_merge(left.id, right.id);
    if (current == nullptr || current->merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) push_candidate(left.prev);
    if (left.next >= 0) push_candidate(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

// ---------------------------------------------------------------------------------------------------------------

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const std::string& tokenizer_json_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = tokenizer_json_path;
  const Json root = read_json_file(tokenizer_json_path);
  try {
    impl_->load(root);
  } catch (const Json::exception& e) {  // a value of an unexpected JSON type deep inside the file
    HGRN_CHECK(false, tokenizer_json_path, ": malformed tokenizer.json: ", e.what());
  }
}

ByteLevelBpeTokenizer::~ByteLevelBpeTokenizer() = default;

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  if (const std::optional<size_t> bad = first_invalid_utf8(text))
    HGRN_CHECK(false, "tokenizer ", impl_->path, ": expected UTF-8 text, got an ill-formed ",
               describe_invalid_utf8(text, *bad));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + 8);
  impl_->encode_text(text, thread_word_cache(impl_->serial), ids);
  return ids;
}

std::string ByteLevelBpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  text.reserve(ids.size() * 4);
  for (const int32_t id : ids) {
    HGRN_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->has_id.size() && impl_->has_id[id], "tokenizer ",
               impl_->path, ": cannot decode id ", id, ": expected an id of the vocabulary (0..",
               impl_->has_id.size() - 1, ")");
    text += impl_->text_of_id[id];
  }
  return text;
}

int64_t ByteLevelBpeTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->has_id.size()); }

int32_t ByteLevelBpeTokenizer::eos_id() const { return impl_->eos; }

std::string ByteLevelBpeTokenizer::name() const { return impl_->path; }

std::optional<int32_t> ByteLevelBpeTokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

}  // namespace hgrn
