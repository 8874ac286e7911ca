// safetensors.h: writing and reading the safetensors format (Hugging Face's tensor file), single files and the
// sharded directory layout transformers uses (model-0000i-of-0000N.safetensors + model.safetensors.index.json).
//
// File layout, all integers little-endian:
//   8 bytes             N, the header length (uint64)
//   N bytes             a UTF-8 JSON object: "__metadata__": {string: string} (optional) and, for each tensor,
//                       name: {"dtype": "F32"|"BF16"|"F64"|"I32"|"I64", "shape": [...], "data_offsets": [begin, end]}
//                       padded with spaces so that N is a multiple of 8 (which keeps every tensor aligned)
//   the rest            the data buffer: each tensor's raw little-endian elements at [begin, end) of the buffer,
//                       packed back to back without gaps or overlaps
// The writer reproduces the byte layout of the reference implementation (the Rust crate behind the Python
// package): tensors ordered by dtype (I64, F64, F32, I32, BF16: its dtype order, descending) and then by name, header
// keys in data order with __metadata__ first, compact JSON. Files are written atomically: to a temporary file in the
// same directory, fsync'ed, then renamed.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace hgrn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

// transformers' default max_shard_size ("5GB", decimal).
constexpr int64_t kDefaultShardBytes = 5'000'000'000;
// The file names transformers looks for in a model directory.
inline constexpr const char* kSafetensorsSingleFile = "model.safetensors";
inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

// The safetensors dtype string ("F32", "BF16", ...) of a dtype, and back (throws hgrn::Error for any other string,
// naming `context`, e.g. the file and tensor).
const char* safetensors_dtype_name(DType dtype);
DType dtype_from_safetensors_name(const std::string& name, const std::string& context);

// The complete file contents (length prefix, padded header, data) for these tensors. Tensors must be defined,
// contiguous and on the CPU, with distinct non-empty names. Exposed so tests can pin the exact bytes.
std::string encode_safetensors(const NamedTensors& tensors, const SafetensorsMetadata& metadata = {});

// Writes encode_safetensors(...) to `path` atomically (temporary file, fsync, rename, fsync of the directory).
// The directory must exist. Throws hgrn::Error naming the file.
void write_safetensors_file(const std::string& path, const NamedTensors& tensors,
                            const SafetensorsMetadata& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in file (data) order; bf16 data comes back as BF16 tensors
  SafetensorsMetadata metadata;
};

// Reads and validates a safetensors file: the header length fits the file, the header is a JSON object of the
// layout above, every dtype is one hgrn holds, every tensor's byte size equals its dtype size times its element
// count, and the tensors tile the data buffer exactly (no overlap, no gap, nothing past the end). Throws
// hgrn::Error naming the file and, where one is at fault, the tensor.
SafetensorsFile read_safetensors_file(const std::string& path);

// Writes the model weights into the existing directory `dir` as transformers' save_pretrained does: one
// model.safetensors when the tensors' total byte size is at most shard_bytes, otherwise shards
// model-00001-of-0000N.safetensors ... (filled greedily in the given order; a tensor larger than shard_bytes gets
// a shard of its own) plus model.safetensors.index.json = {"metadata": {"total_size": bytes},
// "weight_map": {name: file}}. Every file carries `metadata` (transformers expects {"format": "pt"}). Returns the
// names of the files written, in order.
std::vector<std::string> write_safetensors_model(const std::string& dir, const NamedTensors& tensors,
                                                 int64_t shard_bytes,
                                                 const SafetensorsMetadata& metadata = {{"format", "pt"}});

// Reads the weights of a model directory: model.safetensors if present (transformers prefers it), else every shard
// that model.safetensors.index.json names, checking that each tensor sits in the file the index says and that the
// index names no tensor the shards lack. Throws hgrn::Error naming the directory or file when neither exists, a
// tensor appears twice, or the index and the shards disagree.
NamedTensors read_safetensors_model(const std::string& dir);

}  // namespace hgrn
