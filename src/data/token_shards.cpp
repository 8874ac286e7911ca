// token_shards.cpp: the Megatron-LM indexed dataset writer and memory-mapped reader, and the JSON sidecar (format
// and commit order in token_shards.h). Both files are untrusted input when read: every count is checked against
// the file sizes before it is used to index into a mapping.
#include "data/token_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "core/check.h"
#include "io/atomic_write.h"

namespace hgrn {

// Files are little-endian and are read and written by copying bytes; a big-endian host would need byte swaps.
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

namespace fs = std::filesystem;

namespace {

constexpr unsigned char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kIdxVersion = 1;
constexpr size_t kIdxHeaderBytes = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, sequence count, document count
constexpr size_t kWriteBufferBytes = size_t{1} << 20;

template <typename T>
T load(const unsigned char* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

template <typename T>
void append_bytes(std::vector<unsigned char>& out, T value) {
  const size_t at = out.size();
  out.resize(at + sizeof value);
  std::memcpy(out.data() + at, &value, sizeof value);
}

bool known_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

void write_all(std::FILE* file, const void* data, size_t bytes, const std::string& path) {
  if (bytes == 0) return;
  const int injected = injected_write_failure(WriteStep::kWrite, path);
  if (injected) errno = injected;
  HGRN_CHECK(!injected && std::fwrite(data, 1, bytes, file) == bytes, "token shard ", path, ": write failed: ",
             std::strerror(errno), kWriteAdvice);
}

// Flushes, closes and fsyncs: the bytes are on the disk before the file is renamed to its final name.
void close_synced(std::FILE*& file, const std::string& path) {
  bool ok = std::fflush(file) == 0;
  int error = ok ? 0 : errno;
  if (std::fclose(file) != 0 && ok) {
    ok = false;
    error = errno;
  }
  file = nullptr;
  HGRN_CHECK(ok, "token shard ", path, ": cannot flush to disk: ", std::strerror(error), kWriteAdvice);
  sync_path_to_disk(path, false);
}

std::FILE* create_file(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  HGRN_CHECK(file != nullptr, "token shard ", path, ": cannot create: ", std::strerror(errno), kWriteAdvice);
  return file;
}

void remove_if_present(const std::string& path) {
  std::error_code error;
  fs::remove(path, error);
  HGRN_CHECK(!error, "token shard ", path, ": cannot remove the previous file: ", error.message());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// dtypes and paths

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::UInt8: return "uint8";
    case TokenDType::Int8: return "int8";
    case TokenDType::Int16: return "int16";
    case TokenDType::Int32: return "int32";
    case TokenDType::Int64: return "int64";
    case TokenDType::Float64: return "float64";
    case TokenDType::Float32: return "float32";
    case TokenDType::UInt16: return "uint16";
  }
  throw Error("token shard: unknown dtype code " + std::to_string(static_cast<int>(dtype)));
}

size_t token_dtype_size(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::UInt8:
    case TokenDType::Int8: return 1;
    case TokenDType::Int16:
    case TokenDType::UInt16: return 2;
    case TokenDType::Int32:
    case TokenDType::Float32: return 4;
    case TokenDType::Int64:
    case TokenDType::Float64: return 8;
  }
  throw Error("token shard: unknown dtype code " + std::to_string(static_cast<int>(dtype)));
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65535 ? TokenDType::UInt16 : TokenDType::Int32;
}

std::string shard_bin_path(const std::string& prefix) { return prefix + ".bin"; }
std::string shard_idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string shard_json_path(const std::string& prefix) { return prefix + ".json"; }

// ---------------------------------------------------------------------------------------------------------------
// Sidecar

nlohmann::json shard_metadata_to_json(const ShardMetadata& m) {
  return nlohmann::json{
      {"format", "megatron-mmididx"},
      {"split", m.split},
      {"tokenizer", m.tokenizer},
      {"vocab_size", m.vocab_size},
      {"eos_id", m.eos_id},
      {"dtype", m.dtype},
      {"corpus", m.corpus},
      {"input_files", m.input_files},
      {"documents", m.documents},
      {"tokens", m.tokens},
      {"bytes", m.bytes},
      {"words", m.words},
      {"skipped_malformed", m.skipped_malformed},
      {"skipped_non_utf8", m.skipped_non_utf8},
      {"skipped_empty", m.skipped_empty},
      {"filtered_out", m.filtered_out},
      {"valid_fraction", m.valid_fraction},
      {"split_seed", m.split_seed},
      {"hgrn_version", m.hgrn_version},
  };
}

ShardMetadata read_shard_metadata(const std::string& json_path) {
  std::ifstream in(json_path, std::ios::binary);
  HGRN_CHECK(in.good(), "shard metadata ", json_path, ": cannot open: ", std::strerror(errno));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    throw Error("shard metadata " + json_path + ": not valid JSON: " + error.what());
  }
  HGRN_CHECK(j.is_object(), "shard metadata ", json_path, ": expected a JSON object");
  ShardMetadata m;
  auto field = [&](const char* key, auto& value) {
    HGRN_CHECK(j.contains(key), "shard metadata ", json_path, ": the field \"", key, "\" is missing");
    try {
      j.at(key).get_to(value);
    } catch (const nlohmann::json::exception& error) {
      throw Error("shard metadata " + json_path + ": field \"" + key + "\" has the wrong type: " + error.what());
    }
  };
  field("split", m.split);
  field("tokenizer", m.tokenizer);
  field("vocab_size", m.vocab_size);
  field("eos_id", m.eos_id);
  field("dtype", m.dtype);
  field("corpus", m.corpus);
  field("input_files", m.input_files);
  field("documents", m.documents);
  field("tokens", m.tokens);
  field("bytes", m.bytes);
  field("words", m.words);
  field("skipped_malformed", m.skipped_malformed);
  field("skipped_non_utf8", m.skipped_non_utf8);
  field("skipped_empty", m.skipped_empty);
  field("filtered_out", m.filtered_out);
  field("valid_fraction", m.valid_fraction);
  field("split_seed", m.split_seed);
  field("hgrn_version", m.hgrn_version);
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

void require_shard_replaceable(const std::string& prefix, bool overwrite) {
  const std::string idx = shard_idx_path(prefix);
  const OutputKind kind{"an earlier token shard (" + prefix + ".{bin,idx,json} with a Megatron .idx)",
                        [&idx](const std::string&) {
                          unsigned char magic[sizeof kIdxMagic] = {};
                          std::ifstream in(idx, std::ios::binary);
                          return in.read(reinterpret_cast<char*>(magic), sizeof magic) &&
                                 std::memcmp(magic, kIdxMagic, sizeof magic) == 0;
                        }};
  for (const std::string& path : {shard_bin_path(prefix), idx, shard_json_path(prefix)})
    require_replaceable(path, overwrite, kind);
}

TokenShardWriter::TokenShardWriter(std::string prefix, int64_t vocab_size)
    : prefix_(std::move(prefix)), vocab_size_(vocab_size), dtype_(token_dtype_for_vocab(vocab_size)) {
  HGRN_CHECK(!prefix_.empty(), "token shard: the output prefix is empty");
  HGRN_CHECK(vocab_size_ >= 1 && vocab_size_ <= int64_t{std::numeric_limits<int32_t>::max()} + 1,
             "token shard ", prefix_, ": vocab_size must be in [1, 2^31], got ", vocab_size_);
  const fs::path parent = fs::path(prefix_).parent_path();
  if (!parent.empty()) {
    std::error_code error;
    fs::create_directories(parent, error);
    HGRN_CHECK(!error, "token shard ", prefix_, ": cannot create the directory ", parent.string(), ": ",
               error.message(), kWriteAdvice);
  }
  bin_temp_ = temporary_sibling_path(shard_bin_path(prefix_));
  idx_temp_ = temporary_sibling_path(shard_idx_path(prefix_));
  json_temp_ = temporary_sibling_path(shard_json_path(prefix_));
  bin_file_ = create_file(bin_temp_);
  buffer_.reserve(kWriteBufferBytes + 64);
}

TokenShardWriter::~TokenShardWriter() {
  if (!finished_) remove_temporary_files();
}

void TokenShardWriter::remove_temporary_files() noexcept {
  if (bin_file_ != nullptr) {
    std::fclose(bin_file_);
    bin_file_ = nullptr;
  }
  for (const std::string* path : {&bin_temp_, &idx_temp_, &json_temp_}) {
    std::error_code ignored;  // the error that brought us here is the one worth reporting
    fs::remove(*path, ignored);
  }
}

void TokenShardWriter::flush_buffer() {
  write_all(bin_file_, buffer_.data(), buffer_.size(), bin_temp_);
  buffer_.clear();
}

void TokenShardWriter::append_document(const int32_t* ids, int64_t count) {
  HGRN_CHECK(!finished_ && bin_file_ != nullptr, "token shard ", prefix_, ": append_document after finish");
  HGRN_CHECK(count >= 0 && count <= std::numeric_limits<int32_t>::max(), "token shard ", prefix_,
             ": a document must have between 0 and 2^31 - 1 tokens (Megatron stores sizes as int32), got ", count);
  // Encoded straight into the buffer, which is written out once it passes kWriteBufferBytes.
  const size_t item = token_dtype_size(dtype_);
  const size_t at = buffer_.size();
  buffer_.resize(at + static_cast<size_t>(count) * item);
  unsigned char* out = buffer_.data() + at;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_) {
      buffer_.resize(at);
      throw Error(detail::concat("token shard ", prefix_, ": token id ", id, " of document ", sizes_.size(),
                                 " is outside the vocabulary [0, ", vocab_size_, ")"));
    }
    if (dtype_ == TokenDType::UInt16) {
      const uint16_t narrow = static_cast<uint16_t>(id);
      std::memcpy(out + 2 * i, &narrow, 2);
    } else {
      std::memcpy(out + 4 * i, &id, 4);
    }
  }
  if (buffer_.size() >= kWriteBufferBytes) flush_buffer();
  sizes_.push_back(static_cast<int32_t>(count));
  tokens_ += count;
}

void TokenShardWriter::finish(const std::optional<ShardMetadata>& metadata) {
  HGRN_CHECK(!finished_ && bin_file_ != nullptr, "token shard ", prefix_, ": finish called twice");
  flush_buffer();
  close_synced(bin_file_, bin_temp_);

  // The index, streamed so that only sizes_ is held in memory.
  std::FILE* idx = create_file(idx_temp_);
  try {
    std::vector<unsigned char> bytes(kIdxMagic, kIdxMagic + sizeof kIdxMagic);
    append_bytes(bytes, kIdxVersion);
    append_bytes(bytes, static_cast<uint8_t>(dtype_));
    const uint64_t sequences = sizes_.size();
    append_bytes(bytes, sequences);
    append_bytes(bytes, sequences + 1);  // one document per sequence, plus the leading 0
    write_all(idx, bytes.data(), bytes.size(), idx_temp_);
    write_all(idx, sizes_.data(), sizes_.size() * sizeof(int32_t), idx_temp_);

    const int64_t item = static_cast<int64_t>(token_dtype_size(dtype_));
    std::vector<int64_t> chunk;
    chunk.reserve(1 << 16);
    auto write_chunk = [&] {
      write_all(idx, chunk.data(), chunk.size() * sizeof(int64_t), idx_temp_);
      chunk.clear();
    };
    int64_t pointer = 0;
    for (int32_t size : sizes_) {
      chunk.push_back(pointer);
      pointer += static_cast<int64_t>(size) * item;
      if (chunk.size() == chunk.capacity()) write_chunk();
    }
    write_chunk();
    for (uint64_t d = 0; d <= sequences; ++d) {
      chunk.push_back(static_cast<int64_t>(d));
      if (chunk.size() == chunk.capacity()) write_chunk();
    }
    write_chunk();
    close_synced(idx, idx_temp_);
  } catch (...) {
    if (idx != nullptr) std::fclose(idx);
    throw;
  }

  if (metadata) {
    ShardMetadata filled = *metadata;
    filled.documents = documents();
    filled.tokens = tokens_;
    filled.dtype = token_dtype_name(dtype_);
    const std::string text = shard_metadata_to_json(filled).dump(2) + "\n";
    std::FILE* json = create_file(json_temp_);
    try {
      write_all(json, text.data(), text.size(), json_temp_);
      close_synced(json, json_temp_);
    } catch (...) {
      if (json != nullptr) std::fclose(json);
      throw;
    }
  }

  // The commit. Removing the old .idx first means that between here and the last rename no complete-looking pair
  // exists: an old .idx next to a new .bin could otherwise pass for a shard.
  remove_if_present(shard_idx_path(prefix_));
  remove_if_present(shard_json_path(prefix_));
  rename_path(bin_temp_, shard_bin_path(prefix_));
  if (metadata) rename_path(json_temp_, shard_json_path(prefix_));
  rename_path(idx_temp_, shard_idx_path(prefix_));
  finished_ = true;
  // Makes the renames durable.
  const fs::path parent = fs::path(prefix_).parent_path();
  sync_path_to_disk(parent.empty() ? "." : parent.string(), true);
}

// ---------------------------------------------------------------------------------------------------------------
// Memory map

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HGRN_CHECK(fd >= 0, "token shard ", path, ": cannot open: ", std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    throw Error("token shard " + path + ": cannot stat: " + std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw Error("token shard " + path + ": not a regular file");
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ > 0) {
    void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int error = errno;
    if (mapping == MAP_FAILED) {
      ::close(fd);
      throw Error("token shard " + path + ": cannot memory-map " + std::to_string(size_) + " bytes: " +
                  std::strerror(error));
    }
    data_ = static_cast<const unsigned char*>(mapping);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---------------------------------------------------------------------------------------------------------------
// Reader

TokenShardReader::TokenShardReader(std::string prefix) : prefix_(std::move(prefix)) {
  const std::string idx_path = shard_idx_path(prefix_);
  const std::string bin_path = shard_bin_path(prefix_);
  idx_ = MappedFile(idx_path);
  const unsigned char* idx = idx_.data();
  const size_t idx_size = idx_.size();
  const std::string where = "token shard " + idx_path + ": ";

  // Header. A short file whose bytes so far match the magic is a cut-off .idx; anything else is not one at all.
  const size_t magic_bytes = std::min(idx_size, sizeof kIdxMagic);
  HGRN_CHECK(magic_bytes == 0 || std::memcmp(idx, kIdxMagic, magic_bytes) == 0, where,
             "not a Megatron .idx (it does not start with the magic bytes \"MMIDIDX\\0\\0\")");
  HGRN_CHECK(idx_size >= kIdxHeaderBytes, where, "truncated: ", idx_size, " bytes, shorter than the ",
             kIdxHeaderBytes, "-byte header");
  const uint64_t version = load<uint64_t>(idx + 9);
  HGRN_CHECK(version == kIdxVersion, where, "unsupported version ", version, " (expected 1)");
  const uint8_t code = idx[17];
  HGRN_CHECK(known_dtype_code(code), where, "unknown dtype code ", static_cast<int>(code),
             " (Megatron's codes are 1..8)");
  dtype_ = static_cast<TokenDType>(code);
  HGRN_CHECK(dtype_ != TokenDType::Float32 && dtype_ != TokenDType::Float64, where, "holds ",
             token_dtype_name(dtype_), " values, not integer token ids");
  item_size_ = token_dtype_size(dtype_);
  const uint64_t sequences = load<uint64_t>(idx + 18);
  const uint64_t document_index_count = load<uint64_t>(idx + 26);
  HGRN_CHECK(document_index_count >= 1, where, "document count is 0 (expected at least 1: the leading 0)");

  // Both counts are bounded by the file size before they are multiplied, so the sums below cannot overflow.
  HGRN_CHECK(sequences <= idx_size && document_index_count <= idx_size, where, "truncated: the header announces ",
             sequences, " sequences and ", document_index_count, " document indices, more than a ", idx_size,
             "-byte file can hold");
  const uint64_t expected = kIdxHeaderBytes + sequences * (4 + 8) + document_index_count * 8;
  HGRN_CHECK(idx_size >= expected, where, "truncated: ", idx_size, " bytes, but ", sequences, " sequences and ",
             document_index_count, " document indices need ", expected);
  // Megatron's multimodal variant appends one int8 mode per sequence.
  HGRN_CHECK(idx_size == expected || idx_size == expected + sequences, where, idx_size - expected,
             " unexpected bytes after the document indices (expected ", expected, " bytes in all)");
  HGRN_CHECK(sequences <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), where, "sequence count ",
             sequences, " is too large");
  num_sequences_ = static_cast<int64_t>(sequences);
  num_documents_ = static_cast<int64_t>(document_index_count - 1);
  const unsigned char* sizes = idx + kIdxHeaderBytes;
  pointers_ = sizes + 4 * sequences;
  document_indices_ = pointers_ + 8 * sequences;

  bin_ = MappedFile(bin_path);
  const uint64_t bin_size = bin_.size();

  // The sequences must tile .bin: this is what makes token t of the concatenation element t of .bin.
  uint64_t expected_pointer = 0;
  for (uint64_t s = 0; s < sequences; ++s) {
    const int32_t size = load<int32_t>(sizes + 4 * s);
    HGRN_CHECK(size >= 0, where, "sequence ", s, " has a negative size ", size);
    const int64_t pointer = load<int64_t>(pointers_ + 8 * s);
    HGRN_CHECK(pointer >= 0 && static_cast<uint64_t>(pointer) == expected_pointer, where,
               "pointers inconsistent: sequence ", s, " starts at byte ", pointer, " of ", bin_path,
               ", but the sequences before it end at byte ", expected_pointer);
    expected_pointer += static_cast<uint64_t>(size) * item_size_;
    if (expected_pointer > bin_size) break;  // reported below, with the sizes
  }
  HGRN_CHECK(expected_pointer <= bin_size, "token shard ", bin_path, ": truncated: ", bin_size,
             " bytes, but the index ", idx_path, " describes at least ", expected_pointer);
  HGRN_CHECK(expected_pointer == bin_size, "token shard ", bin_path, ": ", bin_size, " bytes, but the index ",
             idx_path, " describes ", expected_pointer, " (the .bin and .idx do not belong together)");
  num_tokens_ = static_cast<int64_t>(bin_size / item_size_);

  int64_t previous = 0;
  for (uint64_t d = 0; d < document_index_count; ++d) {
    const int64_t index = load<int64_t>(document_indices_ + 8 * d);
    HGRN_CHECK(d > 0 || index == 0, where, "document indices inconsistent: the first is ", index,
               " (expected 0)");
    HGRN_CHECK(index >= previous && index <= num_sequences_, where, "document indices inconsistent: index ", d,
               " is ", index, " after ", previous, " (expected non-decreasing sequence numbers up to ",
               num_sequences_, ")");
    previous = index;
  }
  HGRN_CHECK(previous == num_sequences_, where, "document indices inconsistent: the last is ", previous,
             " but there are ", num_sequences_, " sequences");
}

int64_t TokenShardReader::sequence_start(int64_t sequence) const {
  if (sequence == num_sequences_) return num_tokens_;
  return load<int64_t>(pointers_ + 8 * sequence) / static_cast<int64_t>(item_size_);
}

int64_t TokenShardReader::document_offset(int64_t index) const {
  HGRN_CHECK(index >= 0 && index < num_documents_, "token shard ", prefix_, ": document ", index,
             " is out of range [0, ", num_documents_, ")");
  return sequence_start(load<int64_t>(document_indices_ + 8 * index));
}

int64_t TokenShardReader::document_length(int64_t index) const {
  const int64_t start = document_offset(index);
  return sequence_start(load<int64_t>(document_indices_ + 8 * (index + 1))) - start;
}

std::vector<int32_t> TokenShardReader::document(int64_t index) const {
  std::vector<int32_t> ids(static_cast<size_t>(document_length(index)));
  read(document_offset(index), static_cast<int64_t>(ids.size()), ids.data());
  return ids;
}

namespace {

template <typename Stored>
void convert(const unsigned char* bytes, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(load<Stored>(bytes + i * sizeof(Stored)));
}

}  // namespace

void TokenShardReader::read(int64_t offset, int64_t count, int32_t* out) const {
  HGRN_CHECK(offset >= 0 && count >= 0 && offset <= num_tokens_ && count <= num_tokens_ - offset, "token shard ",
             prefix_, ": cannot read tokens [", offset, ", ", offset + count, "): the shard has ", num_tokens_);
  if (count == 0) return;
  const unsigned char* bytes = bin_.data() + static_cast<size_t>(offset) * item_size_;
  switch (dtype_) {
    case TokenDType::UInt16: convert<uint16_t>(bytes, count, out); return;
    case TokenDType::Int32: std::memcpy(out, bytes, static_cast<size_t>(count) * sizeof(int32_t)); return;
    case TokenDType::UInt8: convert<uint8_t>(bytes, count, out); return;
    case TokenDType::Int8: convert<int8_t>(bytes, count, out); return;
    case TokenDType::Int16: convert<int16_t>(bytes, count, out); return;
    case TokenDType::Int64:
      for (int64_t i = 0; i < count; ++i) {
        const int64_t id = load<int64_t>(bytes + 8 * i);
        HGRN_CHECK(id >= std::numeric_limits<int32_t>::min() && id <= std::numeric_limits<int32_t>::max(),
                   "token shard ", prefix_, ": token ", offset + i, " is ", id, ", which does not fit in int32");
        out[i] = static_cast<int32_t>(id);
      }
      return;
    case TokenDType::Float32:
    case TokenDType::Float64: break;
  }
  throw Error("token shard " + prefix_ + ": cannot read " + token_dtype_name(dtype_) + " as token ids");
}

}  // namespace hgrn
