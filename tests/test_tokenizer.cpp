// test_tokenizer.cpp: the byte tokenizer, and the byte-level BPE tokenizer against ids produced by the Hugging Face
// `tokenizers` package (tests/fixtures/tokenizer_ids.json, written by tools/make_tokenizer_fixtures.py): hand-picked
// strings and whole WikiText-2 / Pile files, plus a small self-contained tokenizer.json for the added-token rules
// and malformed files.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "core/check.h"
#include "data/byte_level_bpe.h"
#include "data/tokenizer.h"

namespace hgrn {
namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------------------------
// Helpers

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}


// The shared data directory (tokenizers and corpora, kept outside the repository), or "" if it is not there.
std::string shared_data_dir() {
  const char* env = std::getenv("HGRN_SHARED_DATA");
  const std::string dir = env != nullptr ? std::string(env) : std::string(HGRN_SOURCE_DIR) + "/../shared/data";
  return std::filesystem::is_directory(dir) ? dir : std::string();
}

#define REQUIRE_SHARED_DATA(dir)                                                                                  \
  const std::string dir = shared_data_dir();                                                                     \
  if (dir.empty())                                                                                                \
  GTEST_SKIP() << "shared data directory not found: set HGRN_SHARED_DATA or provide " HGRN_SOURCE_DIR            \
                  "/../shared/data (with tokenizers/, wikitext-2/, wikitext-2-raw/, pile-sample/)"

const Json& fixture() {
  static const Json parsed =
      Json::parse(read_file(std::string(HGRN_SOURCE_DIR) + "/tests/fixtures/tokenizer_ids.json"));
  return parsed;
}

// Loading a 50k-merge tokenizer.json takes a moment; every test shares one instance per file.
const Tokenizer& shared_tokenizer(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = loaded[path];
  if (!slot) slot = load_hf_tokenizer(path);
  return *slot;
}

std::vector<int32_t> ids_of(const Json& array) { return array.get<std::vector<int32_t>>(); }

// The pieces that tools/make_tokenizer_fixtures.py encodes one by one: WikiText lines with their "\n", or the
// "text" of each Pile record.
std::vector<std::string> pieces_of(const std::string& path, const std::string& how) {
  const std::string data = read_file(path);
  std::vector<std::string> pieces;
  size_t start = 0;
  while (start < data.size()) {
    size_t end = data.find('\n', start);
    end = end == std::string::npos ? data.size() : end + 1;
    std::string line = data.substr(start, end - start);
    start = end;
    if (how == "lines") {
      pieces.push_back(std::move(line));
    } else {
      if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
      pieces.push_back(Json::parse(line).at("text").get<std::string>());
    }
  }
  return pieces;
}

// SHA-256 (FIPS 180-4), to compare a file's ids with the fixture's digest without storing millions of ids.
class Sha256 {
 public:
  void update(const uint8_t* data, size_t size) {
    for (size_t i = 0; i < size; ++i) {
      block_[fill_++] = data[i];
      if (fill_ == 64) {
        compress();
        fill_ = 0;
      }
    }
    length_ += size;
  }

  std::string hex_digest() {
    const uint64_t bit_length = length_ * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    for (int i = 7; i >= 0; --i) {
      const auto byte = static_cast<uint8_t>(bit_length >> (8 * i));
      update(&byte, 1);
    }
    static const char* const kHex = "0123456789abcdef";
    std::string hex;
    for (const uint32_t word : state_)
      for (int shift = 28; shift >= 0; shift -= 4) hex += kHex[(word >> shift) & 15];
    return hex;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void compress() {
    static constexpr std::array<uint32_t, 64> k = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::array<uint32_t, 64> w{};
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t(block_[4 * i]) << 24) | (uint32_t(block_[4 * i + 1]) << 16) |
             (uint32_t(block_[4 * i + 2]) << 8) | uint32_t(block_[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a, state_[1] += b, state_[2] += c, state_[3] += d;
    state_[4] += e, state_[5] += f, state_[6] += g, state_[7] += h;
  }

  std::array<uint32_t, 8> state_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> block_{};
  size_t fill_ = 0;
  uint64_t length_ = 0;
};

std::string sha256_of_ids(const std::vector<int32_t>& ids) {
  Sha256 hash;
  for (const int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    const uint8_t little_endian[4] = {uint8_t(u), uint8_t(u >> 8), uint8_t(u >> 16), uint8_t(u >> 24)};
    hash.update(little_endian, 4);
  }
  return hash.hex_digest();
}

// Asserts that `statement` throws an hgrn::Error whose message contains every one of `needles`.
template <typename F>
void expect_error_mentioning(F&& statement, const std::vector<std::string>& needles) {
  try {
    statement();
    ADD_FAILURE() << "expected an hgrn::Error mentioning " << needles.front();
  } catch (const Error& e) {
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "\n  lacks: " << needle;
  }
}

// A tiny byte-level tokenizer.json: all 256 byte tokens, a few merges and added tokens with each flag, so the
// merge order and the added-token rules are checked without the shared data. Its expected ids below were
// produced by the `tokenizers` package (0.23.3) from the same JSON.
Json tiny_tokenizer_json() {
  // GPT-2's byte-to-unicode table, spelled out independently of the implementation.
  std::vector<std::string> byte_tokens;
  int shifted = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : shifted++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 += static_cast<char>(cp);
    } else {
      utf8 += static_cast<char>(0xC0 | (cp >> 6));
      utf8 += static_cast<char>(0x80 | (cp & 0x3F));
    }
    byte_tokens.push_back(utf8);
  }
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_tokens[b]] = b;
  // "Ġ" is the space byte. The merges are listed (and so ranked) in this order.
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"}, {"h", "e"}, {"he", "ll"}, {"Ġ", "h"}, {"Ġh", "e"}, {"hell", "o"}, {"a", "a"}, {"aa", "a"}};
  int next_id = 256;
  for (const auto& [left, right] : merges)
    if (!vocab.contains(left + right)) vocab[left + right] = next_id++;
  vocab["<|endoftext|>"] = next_id++;
  Json merge_list = Json::array();
  for (const auto& [left, right] : merges) merge_list.push_back(left + " " + right);
  const auto added = [](const std::string& content, int id, bool single_word, bool lstrip, bool rstrip) {
    return Json{{"id", id},         {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
                {"rstrip", rstrip}, {"normalized", false}, {"special", true}};
  };
  const Json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                           {"use_regex", true}};
  return Json{{"version", "1.0"},
              {"added_tokens", Json::array({added("<|endoftext|>", next_id - 1, false, false, false),
                                            added("<L>", next_id, false, true, false),
                                            added("<R>", next_id + 1, false, false, true),
                                            added("<W>", next_id + 2, true, false, false)})},
              {"normalizer", nullptr},
              {"pre_tokenizer", byte_level},
              {"post_processor", nullptr},
              {"decoder", byte_level},
              {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab},
                         {"merges", merge_list}}}};
}

// A file in the test temp directory, removed when the test ends. The process id in its name keeps concurrent runs
// of the suite (several build directories, ctest -j) from sharing files.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_(::testing::TempDir() + "hgrn_test_tokenizer_" + std::to_string(::getpid()) + "_" + name) {}
  TempFile(const std::string& name, const std::string& contents) : TempFile(name) {
    std::ofstream(path_, std::ios::binary) << contents;
  }
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------------------------
// The byte tokenizer

TEST(TokenizerByte, IdsAreTheUtf8BytesAndDecodeInvertsThem) {
  const auto tokenizer = make_tokenizer("byte");
  EXPECT_EQ(tokenizer->name(), "byte");
  EXPECT_EQ(tokenizer->vocab_size(), 257);
  EXPECT_EQ(tokenizer->eos_id(), 256);
  const std::string text = std::string("h\xC3\xA9!\n", 5) + std::string(1, '\0') + "\xFF";
  const std::vector<int32_t> ids = tokenizer->encode(text);
  EXPECT_EQ(ids, (std::vector<int32_t>{'h', 0xC3, 0xA9, '!', '\n', 0, 0xFF}));
  EXPECT_EQ(tokenizer->decode(ids), text);
  EXPECT_TRUE(tokenizer->encode("").empty());
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{'a', 256, 'b'}), "a<|endoftext|>b");
}

TEST(TokenizerByte, RejectsIdsOutsideTheVocabulary) {
  const auto tokenizer = make_byte_tokenizer();
  EXPECT_THROW(tokenizer->decode(std::vector<int32_t>{257}), Error);
  EXPECT_THROW(tokenizer->decode(std::vector<int32_t>{-1}), Error);
}

TEST(TokenizerFactory, RejectsAnEmptySpec) { EXPECT_THROW(make_tokenizer(""), Error); }

// ---------------------------------------------------------------------------------------------------------------
// A tiny self-contained tokenizer.json

TEST(TokenizerTinyBpe, MergesApplyByRankAndAddedTokenFlagsAreHonoured) {
  const TempFile file("tiny.json", tiny_tokenizer_json().dump());
  const std::string& path = file.path();
  const auto tokenizer = make_tokenizer(path);
  EXPECT_EQ(tokenizer->name(), path);
  EXPECT_EQ(tokenizer->vocab_size(), 268);
  EXPECT_EQ(tokenizer->eos_id(), 264);
  // Expected ids from tokenizers 0.23.3 (Tokenizer.from_file(...).encode(text, add_special_tokens=False).ids).
  // Ids: bytes 0..255 (space = 32), "ll" 256, "he" 257, "hell" 258, "Ġh" 259, "Ġhe" 260, "hello" 261, "aa" 262,
  // "aaa" 263, <|endoftext|> 264, <L> (lstrip) 265, <R> (rstrip) 266, <W> (single_word) 267.
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"hello hello", {261, 32, 261}},  // " hello": "ll" and "he" go first, so "Ġh" never forms
      {"aaaaa", {262, 263}},            // leftmost "aa" first, then "aa"+"a"
      {"<|endoftext|>hello<|endoftext|>", {264, 261, 264}},
      {"x <L> y", {120, 265, 32, 121}},
      {"x\u00a0 <L>", {120, 265}},  // lstrip eats Unicode white space too
      {" <L><L>  <R><R>  q", {265, 265, 32, 32, 266, 266, 113}},
      {"x <R>  y", {120, 32, 266, 121}},
      {"<R>\u3000\u2028 z", {266, 122}},
      {"a<W>b <W> c", {97, 60, 87, 62, 98, 32, 267, 32, 99}},
      {"-<W>-", {45, 267, 45}},
      {"<W><W>", {267, 267}},
      {"1<W>", {49, 60, 87, 62}},
      {"_<W>", {95, 60, 87, 62}},
      {"\u00e9<W>", {195, 169, 60, 87, 62}},
      {"<W>\u0301", {60, 87, 62, 204, 129}},          // a combining mark is part of a word
      {"\u2160<W>", {226, 133, 160, 60, 87, 62}},      // so is a letter number
      {"\u00b2<W>", {194, 178, 267}},                  // but not a superscript digit
      {"\u20ac<W>\u200b", {226, 130, 172, 267, 226, 128, 139}},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_EQ(tokenizer->encode(text), expected) << "text: \"" << text << "\"";
  }
  EXPECT_EQ(tokenizer->decode(tokenizer->encode("hello<|endoftext|> aaaa")), "hello<|endoftext|> aaaa");
}

TEST(TokenizerTinyBpe, MergesGivenAsPairsEqualMergesGivenAsStrings) {
  Json json = tiny_tokenizer_json();
  Json pairs = Json::array();
  for (const Json& merge : json["model"]["merges"]) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    pairs.push_back(Json::array({text.substr(0, space), text.substr(space + 1)}));
  }
  json["model"]["merges"] = pairs;
  const TempFile file("tiny_pairs.json", json.dump());
  EXPECT_EQ(make_tokenizer(file.path())->encode("hello hello aaaaa"),
            (std::vector<int32_t>{261, 32, 261, 32, 262, 263}));
}

TEST(TokenizerTinyBpe, RejectsMalformedFilesNamingThePath) {
  const TempFile missing_file("does_not_exist.json");
  const std::string& missing = missing_file.path();
  expect_error_mentioning([&] { make_tokenizer(missing); }, {missing, "tokenizer.json"});

  const TempFile not_json_file("not_json.json", "{\"model\": [1, 2");
  const std::string& not_json = not_json_file.path();
  expect_error_mentioning([&] { make_tokenizer(not_json); }, {not_json, "not valid JSON"});

  struct Variant {
    std::string name;
    std::function<void(Json&)> edit;
    std::vector<std::string> message_parts;  // besides the path
  };
  const std::vector<Variant> variants = {
      {"wordpiece.json", [](Json& j) { j["model"]["type"] = "WordPiece"; }, {"model.type \"BPE\"", "WordPiece"}},
      {"no_merges.json", [](Json& j) { j["model"].erase("merges"); }, {"model.merges"}},
      {"bad_merge.json", [](Json& j) { j["model"]["merges"].push_back("zz qq"); },
       {"model.merges[8]", "not in model.vocab"}},
      {"no_eos.json",
       [](Json& j) {
         j["model"]["vocab"].erase("<|endoftext|>");
         j["added_tokens"].erase(0);
       },
       {"<|endoftext|>"}},
      {"metaspace.json", [](Json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; },
       {"pre_tokenizer", "Metaspace"}},
      {"nfkc.json", [](Json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer", "NFKC"}},
  };
  for (const Variant& variant : variants) {
    Json json = tiny_tokenizer_json();
    variant.edit(json);
    const TempFile file(variant.name, json.dump());
    std::vector<std::string> needles = variant.message_parts;
    needles.push_back(file.path());
    expect_error_mentioning([&] { make_tokenizer(file.path()); }, needles);
  }
}

TEST(TokenizerTinyBpe, RejectsInvalidUtf8AndUnknownIds) {
  const TempFile file("tiny_errors.json", tiny_tokenizer_json().dump());
  const std::string& path = file.path();
  const auto tokenizer = make_tokenizer(path);
  expect_error_mentioning([&] { tokenizer->encode("ab\xC3(cd"); }, {path, "UTF-8", "0xC3"});
  expect_error_mentioning([&] { tokenizer->decode(std::vector<int32_t>{1, 268}); }, {path, "268"});
  expect_error_mentioning([&] { tokenizer->decode(std::vector<int32_t>{-5}); }, {path, "-5"});
}

// ---------------------------------------------------------------------------------------------------------------
// GPT-2 and GPT-NeoX-20B against the `tokenizers` package

TEST(TokenizerHf, HandPickedStringsMatchTheReferenceIdsAndDecodeBack) {
  REQUIRE_SHARED_DATA(data);
  int checked = 0;
  for (const Json& entry : fixture()["strings"]) {
    const Tokenizer& tokenizer = shared_tokenizer(data + "/" + entry["tokenizer"].get<std::string>());
    const std::string text = entry["text"].get<std::string>();
    const std::vector<int32_t> expected = ids_of(entry["ids"]);
    const std::vector<int32_t> ids = tokenizer.encode(text);
    EXPECT_EQ(ids, expected) << entry["tokenizer"] << " text " << Json(text).dump();
    EXPECT_EQ(tokenizer.decode(ids), entry["decoded"].get<std::string>()) << entry["tokenizer"] << " text "
                                                                           << Json(text).dump();
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST(TokenizerHf, EosAndVocabularySizeMatchTheFiles) {
  REQUIRE_SHARED_DATA(data);
  const Tokenizer& gpt2 = shared_tokenizer(data + "/tokenizers/gpt2/tokenizer.json");
  EXPECT_EQ(gpt2.eos_id(), 50256);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  const Tokenizer& neox = shared_tokenizer(data + "/tokenizers/gpt-neox-20b/20B_tokenizer.json");
  EXPECT_EQ(neox.eos_id(), 0);
  EXPECT_EQ(neox.vocab_size(), 50277);
  const auto& bpe = dynamic_cast<const ByteLevelBpeTokenizer&>(neox);
  EXPECT_EQ(bpe.token_to_id("<|padding|>"), 1);
  EXPECT_EQ(bpe.token_to_id("\xC4\xA0the"), 253);  // "Ġthe"
  EXPECT_EQ(bpe.token_to_id("no such token"), std::nullopt);
}

TEST(TokenizerHf, WholeCorpusFilesMatchTheReferenceIds) {
  REQUIRE_SHARED_DATA(data);
  int checked = 0;
  for (const Json& entry : fixture()["files"]) {
    const std::string tokenizer_file = entry["tokenizer"].get<std::string>();
    const std::string text_file = entry["text"].get<std::string>();
    SCOPED_TRACE(tokenizer_file + " on " + text_file);
    const Tokenizer& tokenizer = shared_tokenizer(data + "/" + tokenizer_file);
    std::vector<int32_t> ids;
    for (const std::string& piece : pieces_of(data + "/" + text_file, entry["split"].get<std::string>())) {
      const std::vector<int32_t> piece_ids = tokenizer.encode(piece);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
    const std::vector<int32_t> expected_head = ids_of(entry["first_ids"]);
    const size_t head_size = std::min(ids.size(), expected_head.size());
    const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(head_size));
    EXPECT_EQ(head, expected_head);
    EXPECT_EQ(static_cast<int64_t>(ids.size()), entry["num_ids"].get<int64_t>());
    EXPECT_EQ(sha256_of_ids(ids), entry["sha256"].get<std::string>());
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

TEST(TokenizerHf, ConcurrentEncodingGivesTheSameIds) {
  REQUIRE_SHARED_DATA(data);
  const Tokenizer& tokenizer = shared_tokenizer(data + "/tokenizers/gpt-neox-20b/20B_tokenizer.json");
  const std::vector<std::string> lines = pieces_of(data + "/wikitext-2/valid.txt", "lines");
  std::vector<std::vector<int32_t>> serial;
  for (const std::string& line : lines) serial.push_back(tokenizer.encode(line));
  constexpr int kThreads = 4;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread starts at a different line so the threads' caches fill in different orders.
      for (size_t k = 0; k < lines.size(); ++k) {
        const size_t i = (k + t * lines.size() / kThreads) % lines.size();
        if (tokenizer.encode(lines[i]) != serial[i]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(TokenizerHf, LongRunsOfOneCharacterClassEncodeAndRoundTrip) {
  REQUIRE_SHARED_DATA(data);
  const Tokenizer& tokenizer = shared_tokenizer(data + "/tokenizers/gpt2/tokenizer.json");
  // Far beyond the word cache's size limit and the regex's backtracking in \s+(?!\S).
  for (const std::string& text : {std::string(200000, ' ') + "x", std::string(100000, 'a'),
                                  std::string(50000, '\n') + " end", std::string(30000, '!')}) {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tokenizer.decode(ids), text);
  }
}

}  // namespace
}  // namespace hgrn
