// token_shards.h: tokenised corpora on disk in Megatron-LM's indexed dataset format (MMapIndexedDataset), so that
// shards hgrn writes load in Megatron-LM / GPT-NeoX and existing pre-tokenised data (e.g. Pythia's Pile) loads here
// as is. A streaming writer that commits its files atomically, a memory-mapped reader that checks every count
// against the file sizes before using it, and the JSON sidecar of metadata that `hgrn prepare` writes next to them.
//
// A shard is two files sharing a PREFIX:
//   PREFIX.bin  the token ids of every sequence, concatenated, little-endian, no header or padding
//   PREFIX.idx  all little-endian:
//                 offset 0   9 bytes   magic "MMIDIDX\0\0"
//                 offset 9   uint64    version, 1
//                 offset 17  uint8     dtype code of .bin (Megatron's: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//                                      6 float64, 7 float32, 8 uint16)
//                 offset 18  uint64    S, the number of sequences
//                 offset 26  uint64    D + 1, the number of document indices
//                 offset 34  int32     sizes[S]            tokens of each sequence
//                            int64     pointers[S]         byte offset of each sequence in .bin
//                            int64     document_indices[D + 1]   document d is sequences [di[d], di[d + 1]);
//                                                              di[0] = 0, di[D] = S
//               (Megatron's multimodal variant appends int8 modes[S]; they are accepted and ignored.)
// hgrn writes one sequence per document (Megatron without sentence splitting), uint16 ids when the vocabulary has at
// most 65535 ids and int32 otherwise (the two dtypes Megatron's preprocessing writes for token ids).
//   PREFIX.json the sidecar (hgrn's own, optional for reading): tokenizer, vocabulary, EOS id, corpus, inputs and
//               counts; see ShardMetadata.
//
// Commit order: everything is written under temporary names (PREFIX.bin.tmp-PID, ...), flushed and fsync'ed; then
// any existing PREFIX.idx is removed, and .bin, .json and finally .idx are renamed into place. The .idx is what
// makes a pair complete, so a run killed at any point leaves either the previous complete pair, no .idx at all, or
// the new complete pair; a run that fails before the commit leaves the previous output untouched.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hgrn {

// Megatron-LM's dtype codes (megatron/core/datasets/indexed_dataset.py, DType).
enum class TokenDType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

const char* token_dtype_name(TokenDType dtype);
size_t token_dtype_size(TokenDType dtype);
// The dtype hgrn writes for a vocabulary of vocab_size ids: uint16 up to 65535 ids, int32 beyond.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

// PREFIX.bin / PREFIX.idx / PREFIX.json.
std::string shard_bin_path(const std::string& prefix);
std::string shard_idx_path(const std::string& prefix);
std::string shard_json_path(const std::string& prefix);

// The sidecar PREFIX.json. Counts are of what the shard holds, except the skipped_* and filtered_out counts, which
// are of the whole input (before any train/valid split) and are repeated in every split's sidecar.
struct ShardMetadata {
  std::string split;                     // "train", "valid" or empty
  std::string tokenizer;                 // "byte" or the tokenizer.json path
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
  std::string dtype;                     // of .bin, as token_dtype_name gives it (the writer fills it in)
  std::string corpus;                    // "wikitext", "pile" or empty
  std::vector<std::string> input_files;
  int64_t documents = 0;                 // the writer fills documents and tokens in
  int64_t tokens = 0;                    // EOS tokens included
  int64_t bytes = 0;                     // UTF-8 bytes of the documents' text
  int64_t words = 0;                     // CorpusStats.words of the documents (word-level perplexity)
  int64_t skipped_malformed = 0;
  int64_t skipped_non_utf8 = 0;
  int64_t skipped_empty = 0;
  int64_t filtered_out = 0;
  double valid_fraction = 0.0;
  uint64_t split_seed = 0;
  std::string hgrn_version;              // "0.1.0 (git abc123)"
};

nlohmann::json shard_metadata_to_json(const ShardMetadata& metadata);
// Throws hgrn::Error naming the file when it is missing, not JSON or lacks a field.
ShardMetadata read_shard_metadata(const std::string& json_path);

// Checks that a shard may be written at PREFIX, by the rule of io/atomic_write.h's require_replaceable: none of
// PREFIX.bin/.idx/.json exists, or, with `overwrite`, PREFIX holds an earlier shard (PREFIX.idx starts with
// Megatron's magic). Throws hgrn::Error naming the file otherwise; deletes nothing.
void require_shard_replaceable(const std::string& prefix, bool overwrite);

// Streams documents into PREFIX.bin.tmp-PID, keeping only their lengths in memory (4 bytes per document), and
// commits the shard in finish() (see the commit order above). Destroying a writer that was not finished removes its
// temporary files, so a failed run leaves nothing but what was there before.
class TokenShardWriter {
 public:
  // Ids must lie in [0, vocab_size); the dtype follows token_dtype_for_vocab. Creates PREFIX's directory if needed.
  TokenShardWriter(std::string prefix, int64_t vocab_size);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // Appends one document (one Megatron sequence). Throws on an id outside [0, vocab_size) or a write failure.
  void append_document(const int32_t* ids, int64_t count);
  void append_document(const std::vector<int32_t>& ids) {
    append_document(ids.data(), static_cast<int64_t>(ids.size()));
  }

  // Writes .idx (and, when given, the sidecar with documents, tokens and dtype filled in) and commits all files.
  void finish(const std::optional<ShardMetadata>& metadata = std::nullopt);

  int64_t documents() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t tokens() const { return tokens_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }

 private:
  void flush_buffer();
  void remove_temporary_files() noexcept;

  std::string prefix_;
  int64_t vocab_size_;
  TokenDType dtype_;
  std::string bin_temp_, idx_temp_, json_temp_;
  std::FILE* bin_file_ = nullptr;
  std::vector<unsigned char> buffer_;  // encoded ids waiting to be written
  std::vector<int32_t> sizes_;
  int64_t tokens_ = 0;
  bool finished_ = false;
};

// A read-only memory map of one file (nothing mapped for an empty file).
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// Opens PREFIX.idx and PREFIX.bin, validates the header, version and dtype, that the counts fit the .idx size, that
// the sequences tile .bin exactly (pointers[0] = 0, each sequence starts where the previous one ends, the last ends
// at the end of .bin) and that the document indices are non-decreasing from 0 to S. Every failure is an hgrn::Error
// naming the file: "not a Megatron .idx", "truncated", "pointers inconsistent", ...
// Because the sequences tile .bin, token t of the concatenation of all documents is simply element t of .bin.
// Thread-safe for concurrent reads.
class TokenShardReader {
 public:
  explicit TokenShardReader(std::string prefix);

  int64_t num_documents() const { return num_documents_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_tokens() const { return num_tokens_; }
  TokenDType dtype() const { return dtype_; }
  const std::string& prefix() const { return prefix_; }

  // Where document i starts in the concatenation, and its length in tokens.
  int64_t document_offset(int64_t index) const;
  int64_t document_length(int64_t index) const;
  // The ids of document i (all its sequences), converted to int32.
  std::vector<int32_t> document(int64_t index) const;
  // Tokens [offset, offset + count) of the concatenation of all documents, converted to int32, into out.
  // Throws when the range is outside [0, num_tokens) or an int64 id does not fit in int32.
  void read(int64_t offset, int64_t count, int32_t* out) const;

 private:
  int64_t sequence_start(int64_t sequence) const;  // in tokens; num_tokens_ for sequence == S

  std::string prefix_;
  MappedFile idx_, bin_;
  TokenDType dtype_ = TokenDType::UInt16;
  size_t item_size_ = 2;
  int64_t num_sequences_ = 0, num_documents_ = 0, num_tokens_ = 0;
  const unsigned char* pointers_ = nullptr;          // int64 little-endian [S], inside idx_
  const unsigned char* document_indices_ = nullptr;  // int64 little-endian [D + 1], inside idx_
};

}  // namespace hgrn
