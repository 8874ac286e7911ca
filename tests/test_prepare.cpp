// test_prepare.cpp: the corpus -> token shard pipeline on small WikiText and Pile fixtures with the byte tokenizer:
// shards decode back to the documents plus EOS, the train/valid split by document is deterministic and complete,
// the output is byte-identical for 1 and 3 threads, the sidecar counts add up, and a failed run keeps old output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "hgrn_binary.h"
#include "scratch_dir.h"
#include "test_files.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

using testing::ScratchDir;

using testing::read_bytes;
using testing::write_bytes;

// A WikiText-style file: a leading blank line, then `articles` articles of " = Title = " plus paragraphs of
// pseudo-random words (some multi-byte UTF-8), the layout of wiki.train.tokens.
std::string wikitext_fixture(int articles, int paragraphs, uint64_t seed) {
  const char* words[] = {"the", "of", "and", "in", "game", "@-@", "<unk>", "1998", "Valkyria", "série", "戦場", ","};
  Rng rng(seed);
  std::string text = " \n";
  for (int a = 0; a < articles; ++a) {
    text += " = Article number " + std::to_string(a) + " = \n \n";
    for (int p = 0; p < paragraphs; ++p) {
      text += " ";
      const int64_t length = 5 + static_cast<int64_t>(rng.below(60));
      for (int64_t w = 0; w < length; ++w) text += std::string(words[rng.below(12)]) + " ";
      text += ". \n \n";
    }
  }
  return text;
}

std::vector<Document> read_documents(const std::string& kind, const std::vector<std::string>& inputs,
                                     CorpusOptions options = {}) {
  std::unique_ptr<DocumentReader> reader = open_corpus(kind, inputs, options);
  std::vector<Document> documents;
  while (std::optional<Document> document = reader->next()) documents.push_back(std::move(*document));
  return documents;
}

PrepareOptions wikitext_options(const std::string& input, const std::string& prefix, int64_t threads,
                                double valid_fraction = 0.0, uint64_t seed = 1234) {
  PrepareOptions options;
  options.corpus = "wikitext";
  options.inputs = {input};
  options.output_prefix = prefix;
  options.threads = threads;
  options.valid_fraction = valid_fraction;
  options.seed = seed;
  return options;
}

// The documents of a shard, decoded, with the EOS each must end with checked and removed.
std::vector<std::string> decoded_documents(const std::string& prefix) {
  const std::unique_ptr<Tokenizer> tokenizer = make_byte_tokenizer();
  const TokenShardReader reader(prefix);
  std::vector<std::string> texts;
  for (int64_t d = 0; d < reader.num_documents(); ++d) {
    std::vector<int32_t> ids = reader.document(d);
    EXPECT_FALSE(ids.empty());
    if (ids.empty()) continue;
    EXPECT_EQ(ids.back(), tokenizer->eos_id()) << prefix << " document " << d;
    ids.pop_back();
    for (int32_t id : ids) EXPECT_NE(id, tokenizer->eos_id()) << "an EOS inside document " << d;
    texts.push_back(tokenizer->decode(ids));
  }
  return texts;
}

TEST(Prepare, ShardsDecodeBackToTheDocuments) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "wiki.txt", wikitext_fixture(12, 3, 1));
  const std::string input = (dir / "wiki.txt").string();
  const PrepareResult result = prepare_corpus(wikitext_options(input, (dir / "out").string(), 2));
  EXPECT_EQ(result.train_prefix, (dir / "out_train").string());
  EXPECT_FALSE(result.valid.has_value());
  EXPECT_FALSE(fs::exists(dir / "out_valid.idx"));
  std::vector<std::string> expected;
  for (const Document& document : read_documents("wikitext", {input})) expected.push_back(document.text);
  ASSERT_EQ(expected.size(), 12u);
  EXPECT_EQ(decoded_documents(result.train_prefix), expected);
}

TEST(Prepare, SplitNameChoosesTheOutputForSeparateSplitFiles) {
  // WikiText's valid and test sets are their own files: --split valid writes PREFIX_valid from them.
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "valid.txt", wikitext_fixture(4, 2, 3));
  PrepareOptions options = wikitext_options((dir / "valid.txt").string(), (dir / "wt").string(), 1);
  options.split = "valid";
  const PrepareResult result = prepare_corpus(options);
  EXPECT_EQ(result.train_prefix, (dir / "wt_valid").string());
  EXPECT_EQ(read_shard_metadata((dir / "wt_valid.json").string()).split, "valid");
  EXPECT_FALSE(fs::exists(dir / "wt_train.idx"));
  options.split = "../escape";
  EXPECT_THROW(prepare_corpus(options), Error);
  options.split = "valid";
  options.valid_fraction = 0.5;
  EXPECT_THROW(prepare_corpus(options), Error);
}

TEST(Prepare, ValidSplitByDocumentIsDeterministicAndComplete) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "wiki.txt", wikitext_fixture(60, 2, 2));
  const std::string input = (dir / "wiki.txt").string();
  const std::vector<Document> documents = read_documents("wikitext", {input});
  ASSERT_EQ(documents.size(), 60u);

  const PrepareResult result = prepare_corpus(wikitext_options(input, (dir / "a").string(), 2, 0.3, 77));
  ASSERT_TRUE(result.valid.has_value());
  std::vector<std::string> expected_train, expected_valid;
  for (size_t i = 0; i < documents.size(); ++i)
    (document_goes_to_valid(i, 0.3, 77) ? expected_valid : expected_train).push_back(documents[i].text);
  // A 30% split of 60 documents: both sides hold some (the hash is fixed, so this is not a flaky expectation).
  ASSERT_FALSE(expected_valid.empty());
  ASSERT_FALSE(expected_train.empty());
  // Every document is in exactly one split, in reading order within each.
  EXPECT_EQ(decoded_documents(result.train_prefix), expected_train);
  EXPECT_EQ(decoded_documents(result.valid_prefix), expected_valid);
  EXPECT_EQ(result.train.documents + result.valid->documents, 60);

  // The same options give the same bytes; another seed gives another split.
  const PrepareResult again = prepare_corpus(wikitext_options(input, (dir / "b").string(), 3, 0.3, 77));
  for (const char* ext : {".bin", ".idx"}) {
    EXPECT_EQ(read_bytes(result.train_prefix + ext), read_bytes(again.train_prefix + ext)) << ext;
    EXPECT_EQ(read_bytes(result.valid_prefix + ext), read_bytes(again.valid_prefix + ext)) << ext;
  }
  const PrepareResult other = prepare_corpus(wikitext_options(input, (dir / "c").string(), 1, 0.3, 78));
  EXPECT_NE(decoded_documents(other.valid_prefix), expected_valid);

  // The hash split: fraction 0 sends nothing to valid, and the share is close to the fraction on many indices.
  int64_t in_valid = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    EXPECT_FALSE(document_goes_to_valid(i, 0.0, 5));
    in_valid += document_goes_to_valid(i, 0.05, 5);
  }
  EXPECT_NEAR(static_cast<double>(in_valid) / 100000.0, 0.05, 0.005);
}

TEST(Prepare, ThreadCountDoesNotChangeTheOutput) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  // About 1.3 MB: several 256 KiB batches, so three workers really finish out of order.
  write_bytes(dir / "wiki.txt", wikitext_fixture(400, 12, 3));
  const std::string input = (dir / "wiki.txt").string();
  const PrepareResult one = prepare_corpus(wikitext_options(input, (dir / "one").string(), 1, 0.1));
  const PrepareResult three = prepare_corpus(wikitext_options(input, (dir / "three").string(), 3, 0.1));
  for (const char* ext : {".bin", ".idx", ".json"}) {
    EXPECT_EQ(read_bytes(one.train_prefix + ext), read_bytes(three.train_prefix + ext)) << "train" << ext;
    EXPECT_EQ(read_bytes(one.valid_prefix + ext), read_bytes(three.valid_prefix + ext)) << "valid" << ext;
  }
  EXPECT_GT(fs::file_size(one.train_prefix + ".bin"), size_t{1} << 20);
}

TEST(Prepare, MetadataCountsAddUp) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "wiki.txt", wikitext_fixture(30, 2, 4));
  const std::string input = (dir / "wiki.txt").string();
  const PrepareResult result = prepare_corpus(wikitext_options(input, (dir / "out").string(), 2, 0.2, 9));
  std::unique_ptr<DocumentReader> reader = open_corpus("wikitext", {input}, {});
  while (reader->next()) {
  }
  const CorpusStats& stats = reader->stats();
  ASSERT_TRUE(result.valid.has_value());
  for (const auto& [prefix, from_result] :
       {std::pair{result.train_prefix, result.train}, std::pair{result.valid_prefix, *result.valid}}) {
    const ShardMetadata m = read_shard_metadata(shard_json_path(prefix));
    const TokenShardReader shard(prefix);
    EXPECT_EQ(m.documents, shard.num_documents());
    EXPECT_EQ(m.tokens, shard.num_tokens());
    EXPECT_EQ(m.tokens, m.bytes + m.documents);  // byte tokenizer: one token per byte, plus each EOS
    EXPECT_EQ(m.documents, from_result.documents);
    EXPECT_EQ(m.tokenizer, "byte");
    EXPECT_EQ(m.vocab_size, 257);
    EXPECT_EQ(m.eos_id, 256);
    EXPECT_EQ(m.dtype, "uint16");
    EXPECT_EQ(m.corpus, "wikitext");
    EXPECT_EQ(m.input_files, std::vector<std::string>{input});
    EXPECT_EQ(m.valid_fraction, 0.2);
    EXPECT_EQ(m.split_seed, 9u);
    EXPECT_EQ(m.skipped_empty, stats.skipped_empty);
    EXPECT_FALSE(m.hgrn_version.empty());
  }
  const ShardMetadata train = read_shard_metadata(shard_json_path(result.train_prefix));
  const ShardMetadata valid = read_shard_metadata(shard_json_path(result.valid_prefix));
  EXPECT_EQ(train.split, "train");
  EXPECT_EQ(valid.split, "valid");
  EXPECT_EQ(train.documents + valid.documents, stats.documents);
  EXPECT_EQ(train.bytes + valid.bytes, stats.bytes);
  EXPECT_EQ(train.words + valid.words, stats.words);
  EXPECT_GT(valid.words, 0);
}

TEST(Prepare, PileSkipsAndFiltersAreCounted) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  std::string lines;
  lines += R"j({"text": "First document.\nSecond line.", "meta": {"pile_set_name": "Pile-CC"}})j" "\n";
  lines += R"j({"text": "   ", "meta": {"pile_set_name": "Pile-CC"}})j" "\n";
  lines += R"j({"text": "not closed", )j" "\n";
  lines += R"j({"text": "Code here", "meta": {"pile_set_name": "Github"}})j" "\n";
  lines += R"j({"text": "Wiki text", "meta": {"pile_set_name": "Wikipedia (en)"}})j" "\n";
  write_bytes(dir / "part.jsonl", lines);
  PrepareOptions options;
  options.corpus = "pile";
  options.inputs = {(dir / "part.jsonl").string()};
  options.output_prefix = (dir / "pile").string();
  options.skip_bad = true;
  options.pile_subsets = {"Pile-CC", "Wikipedia (en)"};
  options.threads = 2;
  const PrepareResult result = prepare_corpus(options);
  EXPECT_EQ(decoded_documents(result.train_prefix),
            (std::vector<std::string>{"First document.\nSecond line.", "Wiki text"}));
  const ShardMetadata m = read_shard_metadata(shard_json_path(result.train_prefix));
  EXPECT_EQ(m.corpus, "pile");
  EXPECT_EQ(m.documents, 2);
  EXPECT_EQ(m.skipped_malformed, 1);
  EXPECT_EQ(m.skipped_empty, 1);
  EXPECT_EQ(m.filtered_out, 1);
  EXPECT_EQ(m.skipped_non_utf8, 0);
}

TEST(Prepare, FailedRunKeepsThePreviousOutput) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "good.jsonl", R"j({"text": "good", "meta": {"pile_set_name": "Pile-CC"}})j" "\n");
  // Enough good records before the bad one that the writer has started writing when the error arrives.
  std::string bad;
  for (int i = 0; i < 3000; ++i)
    bad += R"j({"text": "a record of some length to fill a few batches )j" + std::string(200, 'x') +
           R"j(", "meta": {"pile_set_name": "Pile-CC"}})j" "\n";
  bad += "{broken\n";
  write_bytes(dir / "bad.jsonl", bad);
  PrepareOptions options;
  options.corpus = "pile";
  options.inputs = {(dir / "good.jsonl").string()};
  options.output_prefix = (dir / "out").string();
  options.threads = 3;
  const PrepareResult good = prepare_corpus(options);
  const std::string good_bin = read_bytes(good.train_prefix + ".bin");
  const std::string good_idx = read_bytes(good.train_prefix + ".idx");
  const std::string good_json = read_bytes(good.train_prefix + ".json");

  options.inputs = {(dir / "bad.jsonl").string()};
  options.force = true;  // replacing the earlier shard is allowed; the failure must still keep it
  try {
    prepare_corpus(options);
    FAIL() << "the malformed record was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad.jsonl:3001"), std::string::npos) << error.what();
  }
  EXPECT_EQ(read_bytes(good.train_prefix + ".bin"), good_bin);
  EXPECT_EQ(read_bytes(good.train_prefix + ".idx"), good_idx);
  EXPECT_EQ(read_bytes(good.train_prefix + ".json"), good_json);
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

TEST(Prepare, RejectsBadOptions) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "wiki.txt", wikitext_fixture(3, 1, 5));
  const std::string input = (dir / "wiki.txt").string();
  EXPECT_THROW(prepare_corpus(wikitext_options(input, (dir / "o").string(), 1, 1.0)), Error);
  EXPECT_THROW(prepare_corpus(wikitext_options(input, (dir / "o").string(), 1, -0.1)), Error);
  EXPECT_THROW(prepare_corpus(wikitext_options(input, "", 1)), Error);
  EXPECT_THROW(prepare_corpus(wikitext_options((dir / "missing.txt").string(), (dir / "o").string(), 1)), Error);
  write_bytes(dir / "blank.txt", " \n \n");
  EXPECT_THROW(prepare_corpus(wikitext_options((dir / "blank.txt").string(), (dir / "o").string(), 1)), Error);
  EXPECT_FALSE(fs::exists(dir / "o_train.idx"));
}

TEST(Prepare, CommandLineWritesShardsAndRejectsBadArguments) {
  ScratchDir scratch;
  const fs::path& dir = scratch.path();
  write_bytes(dir / "wiki.txt", wikitext_fixture(5, 2, 6));
  const std::vector<std::string> base = {"prepare", "--corpus", "wikitext", "--input", (dir / "wiki.txt").string(),
                                         "--output", (dir / "cli").string()};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return extra;
  };
  const testing::CommandResult good = testing::run_hgrn(with({"--threads", "2", "--valid-fraction", "0.4"}));
  EXPECT_EQ(good.status, 0) << good.err;
  EXPECT_EQ(TokenShardReader((dir / "cli_train").string()).num_documents() +
                TokenShardReader((dir / "cli_valid").string()).num_documents(),
            5);
  EXPECT_NE(good.err.find("prepare: done"), std::string::npos);
  const testing::CommandResult bad_fraction = testing::run_hgrn(with({"--valid-fraction", "1.5"}));
  EXPECT_EQ(bad_fraction.status, 2) << bad_fraction.err;
  const testing::CommandResult bad_corpus = testing::run_hgrn(with({"--corpus", "books"}));
  EXPECT_EQ(bad_corpus.status, 2) << bad_corpus.err;
}

}  // namespace
}  // namespace hgrn
