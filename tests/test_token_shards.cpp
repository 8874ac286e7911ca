// test_token_shards.cpp: the Megatron indexed dataset writer and reader: round trips in both dtypes, a hand-built
// .idx with a known byte layout (pins the format), rejection of damaged and mismatched files with their messages,
// and the commit order (a killed or failing writer never leaves a pair that looks complete, never harms a good one).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.h"
#include "scratch_dir.h"
#include "data/token_shards.h"
#include "test_files.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

using testing::ScratchDir;

using testing::read_bytes;
using testing::write_bytes;

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

// The message of the Error that `f` throws (fails the test when it throws nothing).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an hgrn::Error";
  return "";
}

std::vector<std::vector<int32_t>> sample_documents(int32_t max_id) {
  return {{1, 2, 3}, {}, {max_id - 1, 0, max_id / 2, 7}, {5}, {max_id - 1}};
}

void expect_round_trip(int64_t vocab_size, TokenDType expected_dtype) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  const auto documents = sample_documents(static_cast<int32_t>(vocab_size));
  {
    TokenShardWriter writer(prefix, vocab_size);
    EXPECT_EQ(writer.dtype(), expected_dtype);
    for (const auto& document : documents) writer.append_document(document);
    writer.finish();
  }
  const TokenShardReader reader(prefix);
  EXPECT_EQ(reader.dtype(), expected_dtype);
  ASSERT_EQ(reader.num_documents(), static_cast<int64_t>(documents.size()));
  EXPECT_EQ(reader.num_sequences(), static_cast<int64_t>(documents.size()));
  std::vector<int32_t> all;
  for (size_t d = 0; d < documents.size(); ++d) {
    EXPECT_EQ(reader.document(static_cast<int64_t>(d)), documents[d]) << "document " << d;
    EXPECT_EQ(reader.document_offset(static_cast<int64_t>(d)), static_cast<int64_t>(all.size()));
    EXPECT_EQ(reader.document_length(static_cast<int64_t>(d)), static_cast<int64_t>(documents[d].size()));
    all.insert(all.end(), documents[d].begin(), documents[d].end());
  }
  ASSERT_EQ(reader.num_tokens(), static_cast<int64_t>(all.size()));
  EXPECT_EQ(fs::file_size(shard_bin_path(prefix)), all.size() * token_dtype_size(expected_dtype));
  // Reads across document boundaries see the plain concatenation.
  for (int64_t offset = 0; offset < reader.num_tokens(); ++offset)
    for (int64_t count = 0; offset + count <= reader.num_tokens(); ++count) {
      std::vector<int32_t> out(static_cast<size_t>(count), -1);
      reader.read(offset, count, out.data());
      EXPECT_TRUE(std::equal(out.begin(), out.end(), all.begin() + offset)) << offset << "+" << count;
    }
}

TEST(TokenShards, RoundTripUint16) { expect_round_trip(50277, TokenDType::UInt16); }

TEST(TokenShards, RoundTripInt32) { expect_round_trip(100000, TokenDType::Int32); }

TEST(TokenShards, DtypeFollowsVocabularySize) {
  EXPECT_EQ(token_dtype_for_vocab(257), TokenDType::UInt16);
  EXPECT_EQ(token_dtype_for_vocab(65535), TokenDType::UInt16);
  EXPECT_EQ(token_dtype_for_vocab(65536), TokenDType::Int32);
}

TEST(TokenShards, WriterProducesTheMegatronByteLayout) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  {
    TokenShardWriter writer(prefix, 300);
    writer.append_document(std::vector<int32_t>{258, 1});
    writer.append_document(std::vector<int32_t>{3});
    writer.finish();
  }
  std::string expected_idx("MMIDIDX\0\0", 9);
  put<uint64_t>(expected_idx, 1);    // version
  put<uint8_t>(expected_idx, 8);     // uint16
  put<uint64_t>(expected_idx, 2);    // sequences
  put<uint64_t>(expected_idx, 3);    // document indices
  put<int32_t>(expected_idx, 2);     // sizes
  put<int32_t>(expected_idx, 1);
  put<int64_t>(expected_idx, 0);     // byte pointers
  put<int64_t>(expected_idx, 4);
  put<int64_t>(expected_idx, 0);     // document indices
  put<int64_t>(expected_idx, 1);
  put<int64_t>(expected_idx, 2);
  EXPECT_EQ(read_bytes(shard_idx_path(prefix)), expected_idx);
  EXPECT_EQ(read_bytes(shard_bin_path(prefix)), std::string("\x02\x01\x01\x00\x03\x00", 6));
}

// A shard laid out by hand the way Megatron's MMapIndexedDatasetBuilder writes one with sentence splitting: two
// documents, the first made of two sequences, int32 ids.
struct HandBuiltShard {
  std::string idx, bin;
};

HandBuiltShard hand_built_shard() {
  HandBuiltShard shard;
  shard.idx.assign("MMIDIDX\0\0", 9);
  put<uint64_t>(shard.idx, 1);
  put<uint8_t>(shard.idx, 4);  // int32
  put<uint64_t>(shard.idx, 3);
  put<uint64_t>(shard.idx, 3);
  for (int32_t size : {2, 3, 1}) put<int32_t>(shard.idx, size);
  for (int64_t pointer : {0, 8, 20}) put<int64_t>(shard.idx, pointer);
  for (int64_t index : {0, 2, 3}) put<int64_t>(shard.idx, index);
  for (int32_t id : {10, 11, 12, 13, 14, 70000}) put<int32_t>(shard.bin, id);
  return shard;
}

void write_shard(const std::string& prefix, const HandBuiltShard& shard) {
  write_bytes(shard_idx_path(prefix), shard.idx);
  write_bytes(shard_bin_path(prefix), shard.bin);
}

TEST(TokenShards, ReadsAHandBuiltMegatronIndex) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  write_shard(prefix, hand_built_shard());
  const TokenShardReader reader(prefix);
  EXPECT_EQ(reader.dtype(), TokenDType::Int32);
  EXPECT_EQ(reader.num_sequences(), 3);
  ASSERT_EQ(reader.num_documents(), 2);
  EXPECT_EQ(reader.num_tokens(), 6);
  EXPECT_EQ(reader.document(0), (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(reader.document(1), (std::vector<int32_t>{70000}));
  std::vector<int32_t> out(3);
  reader.read(3, 3, out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{13, 14, 70000}));
}

TEST(TokenShards, ReadsOtherIntegerDtypesAndMultimodalModes) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, 1);  // uint8
  put<uint64_t>(idx, 2);
  put<uint64_t>(idx, 3);
  put<int32_t>(idx, 1);
  put<int32_t>(idx, 2);
  put<int64_t>(idx, 0);
  put<int64_t>(idx, 1);
  for (int64_t index : {0, 1, 2}) put<int64_t>(idx, index);
  idx += std::string("\x00\x01", 2);  // Megatron's multimodal sequence modes
  write_bytes(shard_idx_path(prefix), idx);
  write_bytes(shard_bin_path(prefix), "\xff\x07\x08");
  const TokenShardReader reader(prefix);
  EXPECT_EQ(reader.document(0), (std::vector<int32_t>{255}));
  EXPECT_EQ(reader.document(1), (std::vector<int32_t>{7, 8}));
}

TEST(TokenShards, EmptyShardRoundTrips) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  TokenShardWriter(prefix, 257).finish();
  const TokenShardReader reader(prefix);
  EXPECT_EQ(reader.num_documents(), 0);
  EXPECT_EQ(reader.num_tokens(), 0);
}

TEST(TokenShards, RejectsGarbageIndex) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  write_bytes(shard_idx_path(prefix), "this is not an index at all, just some text of some length");
  write_bytes(shard_bin_path(prefix), "");
  const std::string message = error_of([&] { TokenShardReader reader(prefix); });
  EXPECT_NE(message.find("not a Megatron .idx"), std::string::npos) << message;
  EXPECT_NE(message.find(shard_idx_path(prefix)), std::string::npos) << message;
}

TEST(TokenShards, RejectsTruncatedIndexAtEveryLength) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  const HandBuiltShard shard = hand_built_shard();
  write_bytes(shard_bin_path(prefix), shard.bin);
  for (size_t length = 0; length < shard.idx.size(); ++length) {
    write_bytes(shard_idx_path(prefix), shard.idx.substr(0, length));
    const std::string message = error_of([&] { TokenShardReader reader(prefix); });
    EXPECT_NE(message.find(shard_idx_path(prefix)), std::string::npos) << length << ": " << message;
    // An empty file and a cut-off header or table are all reported as truncated.
    EXPECT_NE(message.find("truncated"), std::string::npos) << length << ": " << message;
  }
}

TEST(TokenShards, RejectsTruncatedBin) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  HandBuiltShard shard = hand_built_shard();
  shard.bin.resize(shard.bin.size() - 2);
  write_shard(prefix, shard);
  const std::string message = error_of([&] { TokenShardReader reader(prefix); });
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_NE(message.find(shard_bin_path(prefix)), std::string::npos) << message;
}

TEST(TokenShards, RejectsInconsistentPointers) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  HandBuiltShard shard = hand_built_shard();
  const int64_t wrong = 12;  // sequence 1 really starts at byte 8
  std::memcpy(shard.idx.data() + 34 + 3 * 4 + 8, &wrong, 8);
  write_shard(prefix, shard);
  const std::string message = error_of([&] { TokenShardReader reader(prefix); });
  EXPECT_NE(message.find("pointers inconsistent"), std::string::npos) << message;
}

TEST(TokenShards, RejectsMismatchedBin) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  HandBuiltShard shard = hand_built_shard();
  shard.bin += std::string(8, '\0');  // a .bin with more tokens than the index describes
  write_shard(prefix, shard);
  const std::string message = error_of([&] { TokenShardReader reader(prefix); });
  EXPECT_NE(message.find("do not belong together"), std::string::npos) << message;
}

TEST(TokenShards, RejectsBadVersionDtypeAndDocumentIndices) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  struct Case {
    size_t offset;
    std::string bytes;
    const char* expected;
  };
  const int64_t bad_last_index = 2;
  const std::vector<Case> cases = {
      {9, std::string("\x02", 1), "unsupported version 2"},
      {17, std::string("\x09", 1), "unknown dtype code 9"},
      {17, std::string("\x07", 1), "float32"},
      {34 + 3 * 4 + 3 * 8 + 2 * 8, std::string(reinterpret_cast<const char*>(&bad_last_index), 8),
       "document indices inconsistent"},
  };
  for (const Case& c : cases) {
    HandBuiltShard shard = hand_built_shard();
    shard.idx.replace(c.offset, c.bytes.size(), c.bytes);
    write_shard(prefix, shard);
    const std::string message = error_of([&] { TokenShardReader reader(prefix); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

TEST(TokenShards, RejectsMissingFiles) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  const std::string message = error_of([&] { TokenShardReader reader(prefix); });
  EXPECT_NE(message.find(shard_idx_path(prefix)), std::string::npos) << message;
  write_bytes(shard_idx_path(prefix), hand_built_shard().idx);
  const std::string bin_message = error_of([&] { TokenShardReader reader(prefix); });
  EXPECT_NE(bin_message.find(shard_bin_path(prefix)), std::string::npos) << bin_message;
}

TEST(TokenShards, WriterRejectsIdsOutsideTheVocabulary) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  TokenShardWriter writer(prefix, 10);
  EXPECT_NE(error_of([&] { writer.append_document(std::vector<int32_t>{1, 10}); }).find("outside the vocabulary"),
            std::string::npos);
  EXPECT_THROW(writer.append_document(std::vector<int32_t>{-1}), Error);
}

TEST(TokenShards, ReadOutOfRangeIsAnError) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  write_shard(prefix, hand_built_shard());
  const TokenShardReader reader(prefix);
  std::vector<int32_t> out(8);
  EXPECT_THROW(reader.read(4, 3, out.data()), Error);
  EXPECT_THROW(reader.read(-1, 1, out.data()), Error);
  EXPECT_THROW(reader.document(2), Error);
}

// A writer killed before finish() leaves only temporary files: no .idx, so nothing that reads as a shard.
TEST(TokenShards, KilledWriterLeavesNothingThatLooksComplete) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TokenShardWriter writer(prefix, 1000);
    std::vector<int32_t> document(5000, 7);
    for (int i = 0; i < 100; ++i) writer.append_document(document);
    ::_exit(0);  // dies without finish() and without running destructors, as a SIGKILL would
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_FALSE(fs::exists(shard_idx_path(prefix)));
  EXPECT_FALSE(fs::exists(shard_bin_path(prefix)));
  bool temporary_left = false;
  for (const auto& entry : fs::directory_iterator(fs::path(prefix).parent_path()))
    temporary_left |= entry.path().filename().string().find(".tmp-") != std::string::npos;
  EXPECT_TRUE(temporary_left);
  EXPECT_THROW(TokenShardReader reader(prefix), Error);
}

// A run that fails (here: a bad id) after a good shard exists leaves the good shard and no temporary files.
TEST(TokenShards, FailingWriteKeepsThePreviousGoodOutput) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  {
    TokenShardWriter writer(prefix, 100);
    writer.append_document(std::vector<int32_t>{1, 2, 3});
    ShardMetadata metadata;
    metadata.split = "train";
    writer.finish(metadata);
  }
  const std::string good_idx = read_bytes(shard_idx_path(prefix));
  const std::string good_bin = read_bytes(shard_bin_path(prefix));
  const std::string good_json = read_bytes(shard_json_path(prefix));
  try {
    TokenShardWriter writer(prefix, 100);
    writer.append_document(std::vector<int32_t>(100000, 4));
    writer.append_document(std::vector<int32_t>{1000});
    FAIL() << "the bad id was accepted";
  } catch (const Error&) {
  }
  EXPECT_EQ(read_bytes(shard_idx_path(prefix)), good_idx);
  EXPECT_EQ(read_bytes(shard_bin_path(prefix)), good_bin);
  EXPECT_EQ(read_bytes(shard_json_path(prefix)), good_json);
  for (const auto& entry : fs::directory_iterator(fs::path(prefix).parent_path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
  EXPECT_EQ(TokenShardReader(prefix).document(0), (std::vector<int32_t>{1, 2, 3}));
}

TEST(TokenShards, SuccessfulRewriteReplacesTheShard) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  for (int32_t value : {1, 2}) {
    TokenShardWriter writer(prefix, 10);
    writer.append_document(std::vector<int32_t>(static_cast<size_t>(value), value));
    writer.finish();
  }
  EXPECT_EQ(TokenShardReader(prefix).document(0), (std::vector<int32_t>{2, 2}));
}

TEST(TokenShards, MetadataSidecarRoundTrips) {
  ScratchDir scratch;
  const std::string prefix = (scratch / "shard");
  ShardMetadata metadata;
  metadata.split = "valid";
  metadata.tokenizer = "byte";
  metadata.vocab_size = 257;
  metadata.eos_id = 256;
  metadata.corpus = "wikitext";
  metadata.input_files = {"a.txt", "b.txt"};
  metadata.documents = 99;  // the writer overwrites documents, tokens and dtype with what it wrote
  metadata.bytes = 12;
  metadata.words = 4;
  metadata.skipped_empty = 3;
  metadata.skipped_malformed = 1;
  metadata.skipped_non_utf8 = 2;
  metadata.filtered_out = 5;
  metadata.valid_fraction = 0.25;
  metadata.split_seed = 77;
  metadata.hgrn_version = "0.1.0 (git test)";
  TokenShardWriter writer(prefix, 257);
  writer.append_document(std::vector<int32_t>{104, 105, 256});
  writer.finish(metadata);
  const ShardMetadata read = read_shard_metadata(shard_json_path(prefix));
  EXPECT_EQ(read.documents, 1);
  EXPECT_EQ(read.tokens, 3);
  EXPECT_EQ(read.dtype, "uint16");
  EXPECT_EQ(read.split, "valid");
  EXPECT_EQ(read.input_files, metadata.input_files);
  EXPECT_EQ(read.bytes, 12);
  EXPECT_EQ(read.words, 4);
  EXPECT_EQ(read.skipped_empty, 3);
  EXPECT_EQ(read.skipped_malformed, 1);
  EXPECT_EQ(read.skipped_non_utf8, 2);
  EXPECT_EQ(read.filtered_out, 5);
  EXPECT_EQ(read.valid_fraction, 0.25);
  EXPECT_EQ(read.split_seed, 77u);
  EXPECT_EQ(read.eos_id, 256);
  EXPECT_EQ(read.hgrn_version, "0.1.0 (git test)");

  write_bytes(shard_json_path(prefix), "{\"split\": \"train\"}");
  const std::string message = error_of([&] { read_shard_metadata(shard_json_path(prefix)); });
  EXPECT_NE(message.find("\"tokenizer\" is missing"), std::string::npos) << message;
}

}  // namespace
}  // namespace hgrn
