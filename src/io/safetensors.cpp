// safetensors.cpp: the safetensors writer and validating reader, single files and sharded model directories
// (format in safetensors.h). A file being read is untrusted: every length, offset and shape is checked before it
// sizes a buffer or a read.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/atomic_write.h"

namespace hgrn {

// The data buffer holds the tensors' bytes exactly as they sit in memory, which is the format's little-endian order
// only on a little-endian host.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The reference implementation refuses larger headers; a length beyond it means a damaged or foreign file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr size_t kHeaderAlignment = 8;
constexpr const char* kMetadataKey = "__metadata__";

// The reference orders tensors by its dtype enum, descending, before names; among hgrn's dtypes that enum order is
// BF16 < I32 < F32 < F64 < I64.
int reference_dtype_rank(DType dtype) {
  switch (dtype) {
    case DType::BF16: return 0;
    case DType::I32: return 1;
    case DType::F32: return 2;
    case DType::F64: return 3;
    case DType::I64: return 4;
  }
  return -1;
}

void check_writable(const NamedTensors& tensors) {
  std::set<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    HGRN_CHECK(!name.empty(), "safetensors: a tensor has an empty name");
    HGRN_CHECK(name != kMetadataKey, "safetensors: a tensor may not be called ", kMetadataKey);
    HGRN_CHECK(names.insert(name).second, "safetensors: tensor ", name, " appears twice");
    HGRN_CHECK(tensor.defined(), "safetensors: tensor ", name, " is undefined");
    HGRN_CHECK(tensor.device() == Device::CPU, "safetensors: tensor ", name, " is on ", device_name(tensor.device()),
               "; copy it to the CPU first");
    HGRN_CHECK(tensor.is_contiguous(), "safetensors: tensor ", name, " is not contiguous");
  }
}

// A JSON string literal; names are arbitrary UTF-8 (invalid UTF-8 is refused by the JSON library).
std::string json_string(const std::string& text, const std::string& what) {
  try {
    return json(text).dump();
  } catch (const json::exception& e) {
    throw Error("safetensors: " + what + " is not valid UTF-8: " + e.what());
  }
}

struct Layout {
  std::string prefix;                          // 8-byte length + padded header
  std::vector<const Tensor*> tensors_in_order;  // data order
  uint64_t data_bytes = 0;
};

Layout plan_layout(const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  check_writable(tensors);
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int rank_a = reference_dtype_rank(tensors[a].second.dtype());
    const int rank_b = reference_dtype_rank(tensors[b].second.dtype());
    if (rank_a != rank_b) return rank_a > rank_b;
    return tensors[a].first < tensors[b].first;
  });

  Layout layout;
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"";
    header += kMetadataKey;
    header += "\":{";
    bool first_entry = true;
    for (const auto& [key, value] : metadata) {
      if (!first_entry) header += ',';
      header += json_string(key, "metadata key " + key);
      header += ':';
      header += json_string(value, "metadata value of " + key);
      first_entry = false;
    }
    header += "}";
    first = false;
  }
  for (size_t index : order) {
    const auto& [name, tensor] = tensors[index];
    if (!first) header += ',';
    header += json_string(name, "tensor name " + name);
    header += ":{\"dtype\":\"";
    header += safetensors_dtype_name(tensor.dtype());
    header += "\",\"shape\":[";
    for (size_t d = 0; d < tensor.shape().size(); ++d) {
      if (d) header += ',';
      header += std::to_string(tensor.shape()[d]);
    }
    const uint64_t begin = layout.data_bytes, end = begin + tensor.nbytes();
    header += "],\"data_offsets\":[";
    header += std::to_string(begin);
    header += ',';
    header += std::to_string(end);
    header += "]}";
    layout.data_bytes = end;
    layout.tensors_in_order.push_back(&tensor);
    first = false;
  }
  header += "}";
  header.append((kHeaderAlignment - header.size() % kHeaderAlignment) % kHeaderAlignment, ' ');

  const uint64_t length = header.size();
  layout.prefix.resize(8);
  for (int i = 0; i < 8; ++i) layout.prefix[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  layout.prefix += header;
  return layout;
}

// ---------------------------------------------------------------------------------------------------------------
// Reading.

class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    HGRN_CHECK(fd_ >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
    struct stat info {};
    HGRN_CHECK(::fstat(fd_, &info) == 0, "cannot stat safetensors file ", path, ": ", std::strerror(errno));
    HGRN_CHECK(S_ISREG(info.st_mode), "safetensors file ", path, " is not a regular file");
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~InputFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }

  void read_exactly(uint64_t offset, void* out, uint64_t bytes, const std::string& what) const {
    char* p = static_cast<char*>(out);
    while (bytes > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, uint64_t{1} << 30));
      const ssize_t got = ::pread(fd_, p, chunk, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      HGRN_CHECK(got > 0, "cannot read ", what, " from safetensors file ", path_, ": ",
                 got < 0 ? std::strerror(errno) : "unexpected end of file (truncated?)");
      p += got;
      offset += static_cast<uint64_t>(got);
      bytes -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

uint64_t json_unsigned(const json& value, const std::string& what, const std::string& path) {
  HGRN_CHECK(value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
             "safetensors file ", path, ": ", what, " must be a non-negative integer, got ", value.dump());
  return value.get<uint64_t>();
}

// Parses the header text, refusing duplicate top-level keys (a JSON object parser would silently keep one of them,
// and two descriptions of one tensor cannot both be right).
json parse_header(const std::string& text, const std::string& path) {
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json header;
  try {
    header = json::parse(text, callback);
  } catch (const json::exception& e) {
    throw Error("safetensors file " + path + ": the header is not valid JSON (" + e.what() + ")");
  }
  HGRN_CHECK(duplicate.empty(), "safetensors file ", path, ": the header names ", duplicate, " twice");
  HGRN_CHECK(header.is_object(), "safetensors file ", path, ": the header must be a JSON object, got a ",
             header.type_name());
  return header;
}

HeaderEntry parse_entry(const std::string& name, const json& value, const std::string& path) {
  const std::string where = "tensor " + name;
  HGRN_CHECK(value.is_object(), "safetensors file ", path, ": ", where, ": expected an object with dtype, shape and ",
             "data_offsets, got ", value.dump());
  for (const auto& [key, field] : value.items())
    HGRN_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", "safetensors file ", path, ": ", where,
               ": unknown field ", key, " (expected dtype, shape and data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    HGRN_CHECK(value.contains(key), "safetensors file ", path, ": ", where, ": missing field ", key);

  HeaderEntry entry;
  entry.name = name;
  HGRN_CHECK(value["dtype"].is_string(), "safetensors file ", path, ": ", where, ": dtype must be a string, got ",
             value["dtype"].dump());
  entry.dtype =
      dtype_from_safetensors_name(value["dtype"].get<std::string>(), "safetensors file " + path + ": " + where);

  const json& shape = value["shape"];
  HGRN_CHECK(shape.is_array(), "safetensors file ", path, ": ", where, ": shape must be an array, got ", shape.dump());
  // The element count is bounded by the file size below; the bound here only keeps the product from overflowing.
  uint64_t numel = 1;
  for (const json& dim : shape) {
    const uint64_t size = json_unsigned(dim, where + ": shape entry", path);
    HGRN_CHECK(size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "safetensors file ", path, ": ",
               where, ": shape entry ", size, " is too large");
    entry.shape.push_back(static_cast<int64_t>(size));
    if (numel != 0 && size != 0)
      HGRN_CHECK(numel <= std::numeric_limits<uint64_t>::max() / 16 / size, "safetensors file ", path, ": ", where,
                 ": shape ", shape.dump(), " has too many elements");
    numel *= size;
  }

  const json& offsets = value["data_offsets"];
  HGRN_CHECK(offsets.is_array() && offsets.size() == 2, "safetensors file ", path, ": ", where,
             ": data_offsets must be [begin, end], got ", offsets.dump());
  entry.begin = json_unsigned(offsets[0], where + ": data_offsets begin", path);
  entry.end = json_unsigned(offsets[1], where + ": data_offsets end", path);
  HGRN_CHECK(entry.begin <= entry.end, "safetensors file ", path, ": ", where, ": data_offsets [", entry.begin, ", ",
             entry.end, "] end before they begin");
  const uint64_t expected_bytes = numel * dtype_size(entry.dtype);
  HGRN_CHECK(entry.end - entry.begin == expected_bytes, "safetensors file ", path, ": ", where, ": data_offsets [",
             entry.begin, ", ", entry.end, "] span ", entry.end - entry.begin, " bytes, but dtype ",
             safetensors_dtype_name(entry.dtype), " with shape ", shape.dump(), " needs ", expected_bytes);
  return entry;
}

// The index file of a sharded directory: the file of each tensor, and the shard files in their first-use order.
struct ShardIndex {
  std::map<std::string, std::string> file_of_tensor;
  std::vector<std::string> files;
};

ShardIndex read_index(const std::string& index_path) {
  std::ifstream in(index_path, std::ios::binary);
  HGRN_CHECK(in, "cannot open ", index_path, ": ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  json index;
  try {
    index = json::parse(text.str());
  } catch (const json::exception& e) {
    throw Error(index_path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  HGRN_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path,
             ": expected a JSON object with a \"weight_map\" object of tensor name -> shard file");
  ShardIndex result;
  std::set<std::string> seen_files;
  for (const auto& [name, file] : index["weight_map"].items()) {
    HGRN_CHECK(file.is_string(), index_path, ": weight_map entry ", name, " must be a file name, got ", file.dump());
    const std::string file_name = file.get<std::string>();
    // Shards live next to the index; a path would let an index point anywhere on the machine.
    HGRN_CHECK(!file_name.empty() && file_name.find('/') == std::string::npos && file_name != "." &&
                   file_name != "..",
               index_path, ": weight_map entry ", name, " names ", file.dump(),
               ", expected a file name in the same directory");
    result.file_of_tensor[name] = file_name;
    if (seen_files.insert(file_name).second) result.files.push_back(file_name);
  }
  std::sort(result.files.begin(), result.files.end());
  return result;
}

std::string shard_file_name(size_t index, size_t count) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buffer;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  throw Error("safetensors: unknown dtype code " + std::to_string(static_cast<int>(dtype)));
}

DType dtype_from_safetensors_name(const std::string& name, const std::string& context) {
  for (DType d : {DType::F32, DType::BF16, DType::F64, DType::I32, DType::I64})
    if (name == safetensors_dtype_name(d)) return d;
  throw Error(context + ": dtype " + name + " is not supported (hgrn reads F32, BF16, F64, I32 and I64)");
}

std::string encode_safetensors(const NamedTensors& tensors, const SafetensorsMetadata& metadata) {
  const Layout layout = plan_layout(tensors, metadata);
  std::string bytes = layout.prefix;
  bytes.reserve(layout.prefix.size() + layout.data_bytes);
  for (const Tensor* tensor : layout.tensors_in_order)
    bytes.append(static_cast<const char*>(tensor->raw_data()), tensor->nbytes());
  return bytes;
}

void write_safetensors_file(const std::string& path, const NamedTensors& tensors,
                            const SafetensorsMetadata& metadata) {
  const Layout layout = plan_layout(tensors, metadata);
  AtomicFileWriter writer(path);
  writer.write_all(layout.prefix);
  // Tensor by tensor: a multi-GB model is never copied into one buffer.
  for (const Tensor* tensor : layout.tensors_in_order) writer.write_all(tensor->raw_data(), tensor->nbytes());
  writer.commit();
}

SafetensorsFile read_safetensors_file(const std::string& path) {
  InputFile file(path);
  HGRN_CHECK(file.size() >= 8, "safetensors file ", path, " has ", file.size(),
             " bytes, fewer than the 8-byte header length (truncated or not a safetensors file)");
  unsigned char length_bytes[8];
  file.read_exactly(0, length_bytes, 8, "the header length");
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | length_bytes[i];
  HGRN_CHECK(header_length <= kMaxHeaderBytes, "safetensors file ", path, ": header length ", header_length,
             " is larger than the format allows (", kMaxHeaderBytes, " bytes); not a safetensors file?");
  HGRN_CHECK(header_length <= file.size() - 8, "safetensors file ", path, ": header length ", header_length,
             " runs past the end of the file (", file.size(), " bytes; truncated or not a safetensors file?)");

  std::string header_text(header_length, '\0');
  file.read_exactly(8, header_text.data(), header_length, "the header");
  const json header = parse_header(header_text, path);

  SafetensorsFile result;
  std::vector<HeaderEntry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      HGRN_CHECK(value.is_object(), "safetensors file ", path, ": ", kMetadataKey,
                 " must be an object of strings, got ", value.dump());
      for (const auto& [meta_key, meta_value] : value.items()) {
        HGRN_CHECK(meta_value.is_string(), "safetensors file ", path, ": ", kMetadataKey, " entry ", meta_key,
                   " must be a string, got ", meta_value.dump());
        result.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(key, value, path));
  }

  // The tensors must tile the data buffer exactly, as the reference checks: no byte of two tensors, none of no one.
  const uint64_t data_start = 8 + header_length;
  const uint64_t data_bytes = file.size() - data_start;
  for (const HeaderEntry& entry : entries)
    HGRN_CHECK(entry.end <= data_bytes, "safetensors file ", path, ": tensor ", entry.name, ": data_offsets [",
               entry.begin, ", ", entry.end, "] run past the end of the data buffer (", data_bytes,
               " bytes; truncated?)");
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& entry = entries[i];
    HGRN_CHECK(entry.begin >= covered, "safetensors file ", path, ": tensor ", entry.name, " (data_offsets [",
               entry.begin, ", ", entry.end, "]) overlaps tensor ", entries[i - 1].name, " (ending at ", covered, ")");
    HGRN_CHECK(entry.begin == covered, "safetensors file ", path, ": tensor ", entry.name, " starts at ",
               entry.begin, ", leaving bytes [", covered, ", ", entry.begin, ") of the data buffer unused");
    covered = entry.end;
  }
  HGRN_CHECK(covered == data_bytes, "safetensors file ", path, ": the tensors cover ", covered,
             " bytes of the data buffer, but it holds ", data_bytes, " (trailing bytes after the last tensor)");

  for (const HeaderEntry& entry : entries) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
    file.read_exactly(data_start + entry.begin, tensor.raw_data(), entry.end - entry.begin, "tensor " + entry.name);
    result.tensors.emplace_back(entry.name, std::move(tensor));
  }
  return result;
}

std::vector<std::string> write_safetensors_model(const std::string& dir, const NamedTensors& tensors,
                                                 int64_t shard_bytes, const SafetensorsMetadata& metadata) {
  HGRN_CHECK(shard_bytes > 0, "safetensors: the shard size must be positive, got ", shard_bytes);
  HGRN_CHECK(fs::is_directory(dir), "safetensors: output directory ", dir, " does not exist");
  // A reader picks model.safetensors over an index, so leftovers of another layout would be read instead.
  for (const char* name : {kSafetensorsSingleFile, kSafetensorsIndexFile})
    HGRN_CHECK(!fs::exists(fs::path(dir) / name), "safetensors: ", (fs::path(dir) / name).string(),
               " already exists; write the model into an empty directory");
  check_writable(tensors);

  uint64_t total_bytes = 0;
  for (const auto& entry : tensors) total_bytes += entry.second.nbytes();
  if (total_bytes <= static_cast<uint64_t>(shard_bytes)) {
    write_safetensors_file((fs::path(dir) / kSafetensorsSingleFile).string(), tensors, metadata);
    return {kSafetensorsSingleFile};
  }

  // Greedy in model order, as transformers does: a tensor that does not fit the open shard starts a new one.
  std::vector<NamedTensors> shards(1);
  uint64_t open_shard_bytes = 0;
  for (const auto& entry : tensors) {
    const uint64_t bytes = entry.second.nbytes();
    if (!shards.back().empty() && open_shard_bytes + bytes > static_cast<uint64_t>(shard_bytes)) {
      shards.emplace_back();
      open_shard_bytes = 0;
    }
    shards.back().push_back(entry);
    open_shard_bytes += bytes;
  }

  std::vector<std::string> files;
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    files.push_back(shard_file_name(i, shards.size()));
    write_safetensors_file((fs::path(dir) / files.back()).string(), shards[i], metadata);
    for (const auto& entry : shards[i]) weight_map[entry.first] = files.back();
  }
  // transformers writes the index with sorted keys and two-space indentation; nlohmann's object is sorted too.
  const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  write_file_atomically((fs::path(dir) / kSafetensorsIndexFile).string(), index.dump(2) + "\n");
  files.push_back(kSafetensorsIndexFile);
  return files;
}

NamedTensors read_safetensors_model(const std::string& dir) {
  const fs::path single = fs::path(dir) / kSafetensorsSingleFile;
  if (fs::exists(single)) return read_safetensors_file(single.string()).tensors;
  const fs::path index_path = fs::path(dir) / kSafetensorsIndexFile;
  HGRN_CHECK(fs::exists(index_path), "no model weights in ", dir, ": expected ", kSafetensorsSingleFile, " or ",
             kSafetensorsIndexFile);

  const ShardIndex index = read_index(index_path.string());
  NamedTensors tensors;
  std::set<std::string> found;
  for (const std::string& file_name : index.files)
    HGRN_CHECK(fs::exists(fs::path(dir) / file_name), index_path.string(), " names shard ", file_name,
               ", which does not exist");
  for (const std::string& file_name : index.files) {
    const std::string shard_path = (fs::path(dir) / file_name).string();
    for (auto& [name, tensor] : read_safetensors_file(shard_path).tensors) {
      const auto listed = index.file_of_tensor.find(name);
      HGRN_CHECK(listed != index.file_of_tensor.end(), "shard ", shard_path, " holds tensor ", name, ", which ",
                 index_path.string(), " does not list");
      HGRN_CHECK(listed->second == file_name, "tensor ", name, " is in shard ", shard_path, ", but ",
                 index_path.string(), " places it in ", listed->second);
      HGRN_CHECK(found.insert(name).second, "tensor ", name, " appears twice in ", dir);
      tensors.emplace_back(name, std::move(tensor));
    }
  }
  std::vector<std::string> missing;
  for (const auto& [name, file] : index.file_of_tensor)
    if (!found.count(name)) missing.push_back(name + " (in " + file + ")");
  if (!missing.empty()) {
    std::string list;
    for (const std::string& m : missing) list += (list.empty() ? "" : ", ") + m;
    throw Error(index_path.string() + " lists tensors that its shards do not hold: " + list);
  }
  return tensors;
}

}  // namespace hgrn
