// test_safetensors.cpp: the safetensors writer against byte layouts computed by hand (and produced by the reference
// Python package), round trips of fp32 / bf16 / mixed dtypes / sharded directories including the index file, the
// refusal of damaged or inconsistent files with messages naming the file and the tensor, and, when python3 has the
// safetensors package, a cross-check that the reference reader loads what hgrn writes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "export_fixtures.h"
#include "io/safetensors.h"
#include "test_files.h"

namespace hgrn {
namespace {

using namespace export_testing;
using json = nlohmann::json;

template <typename T>
Tensor tensor_of(const std::vector<T>& values, const Shape& shape) {
  return Tensor::from_vector<T>(values, shape);
}

std::string little_endian_u64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// A file with this exact header text (no padding added) and data buffer.
std::string raw_file(const std::string& header, const std::string& data) {
  return little_endian_u64(header.size()) + header + data;
}

using testing::expect_error_containing;

TEST(Safetensors, SingleTensorByteLayoutMatchesHandComputedBytes) {
  // {"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} is 54 bytes; two spaces pad it to 56 = 7 * 8. The data
  // are 1.0f = 0x3f800000 and 2.0f = 0x40000000, little-endian. (The reference Python package writes these bytes.)
  const std::string bytes = encode_safetensors({{"w", tensor_of<float>({1.0f, 2.0f}, {2})}});
  const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
  ASSERT_EQ(header.size(), 56u);
  EXPECT_EQ(hex(bytes.substr(0, 8)), "3800000000000000");
  EXPECT_EQ(bytes.substr(8, 56), header);
  EXPECT_EQ(hex(bytes.substr(64)), "0000803f00000040");
  EXPECT_EQ(bytes.size(), 72u);
}

TEST(Safetensors, MixedDtypesAreOrderedAsTheReferenceWritesThem) {
  // The reference sorts by dtype (I64 before F32 before I32 ...) and then by name, puts __metadata__ first and
  // writes header keys in data order. Header text: 196 bytes + 4 spaces = 200 = 0xc8.
  const std::string bytes = encode_safetensors({{"b", tensor_of<float>({1.0f, 2.0f}, {2})},
                                                {"a", tensor_of<int64_t>({7}, {1})},
                                                {"c", tensor_of<int32_t>({-1, 3}, {1, 2})}},
                                               {{"format", "pt"}});
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"c\":{\"dtype\":\"I32\",\"shape\":[1,2],\"data_offsets\":[16,24]}}    ";
  ASSERT_EQ(header.size(), 200u);
  EXPECT_EQ(hex(bytes.substr(0, 8)), "c800000000000000");
  EXPECT_EQ(bytes.substr(8, 200), header);
  EXPECT_EQ(hex(bytes.substr(208)), "0700000000000000" "0000803f00000040" "ffffffff03000000");
}

TEST(Safetensors, HeaderLengthIsAlwaysAMultipleOfEight) {
  for (int name_length = 1; name_length <= 9; ++name_length) {
    const std::string bytes = encode_safetensors({{std::string(name_length, 'x'), tensor_of<float>({0.5f}, {1})}});
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(bytes[i]);
    EXPECT_EQ(length % 8, 0u) << name_length;
    EXPECT_EQ(bytes.size(), 8 + length + 4);
  }
}

TEST(Safetensors, Fp32RoundTripIsBitExactAndKeepsMetadata) {
  ScratchDir dir;
  const NamedTensors written = random_params(small_model_config());
  const std::string path = dir / "weights.safetensors";
  write_safetensors_file(path, written, {{"format", "pt"}, {"note", "λ unicode"}});
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"weights.safetensors"});  // no temporary left

  const SafetensorsFile read = read_safetensors_file(path);
  EXPECT_EQ(read.metadata, (SafetensorsMetadata{{"format", "pt"}, {"note", "λ unicode"}}));
  ASSERT_EQ(read.tensors.size(), written.size());
  // Read back in file order, which is sorted by name for one dtype.
  std::vector<std::string> names;
  for (const auto& [name, tensor] : read.tensors) names.push_back(name);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const auto& [name, tensor] : written) {
    auto it = std::find_if(read.tensors.begin(), read.tensors.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, read.tensors.end()) << name;
    EXPECT_TRUE(same_bits(it->second, tensor)) << name;
  }
}

TEST(Safetensors, Bf16AndIntegerTensorsRoundTrip) {
  ScratchDir dir;
  Tensor bf = tensor_of<float>({1.0f, -2.0f, 3.140625f, 1e-3f, 65504.0f, -0.0f}, {2, 3}).to(DType::BF16);
  Tensor ids = tensor_of<int64_t>({0, 1, -5, int64_t{1} << 40}, {2, 2});
  Tensor small = tensor_of<int32_t>({42}, {1});
  Tensor wide = tensor_of<double>({1.0 / 3.0}, {1, 1, 1});
  Tensor empty = Tensor::empty({0, 4}, DType::F32);
  const NamedTensors written = {{"bf", bf}, {"ids", ids}, {"small", small}, {"wide", wide}, {"empty", empty}};
  const std::string path = dir / "mixed.safetensors";
  write_safetensors_file(path, written);
  const SafetensorsFile read = read_safetensors_file(path);
  EXPECT_TRUE(read.metadata.empty());
  ASSERT_EQ(read.tensors.size(), written.size());
  for (const auto& [name, tensor] : written) {
    auto it = std::find_if(read.tensors.begin(), read.tensors.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, read.tensors.end()) << name;
    EXPECT_EQ(it->second.dtype(), tensor.dtype()) << name;
    EXPECT_TRUE(same_bits(it->second, tensor)) << name;
  }
  // bf16 is stored as its 16-bit patterns: 1.0 = 0x3f80, -2.0 = 0xc000.
  const std::string bytes = read_file(path);
  EXPECT_NE(bytes.find("\"bf\":{\"dtype\":\"BF16\",\"shape\":[2,3]"), std::string::npos);
  EXPECT_EQ(hex(bytes.substr(bytes.size() - 12, 4)), "803f00c0");
}

TEST(Safetensors, SmallModelIsOneFileWithoutIndex) {
  ScratchDir dir;
  const NamedTensors tensors = random_params(small_model_config());
  const std::vector<std::string> files = write_safetensors_model(dir.str(), tensors, kDefaultShardBytes);
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(read_safetensors_file(dir / "model.safetensors").metadata, (SafetensorsMetadata{{"format", "pt"}}));
  const NamedTensors read = read_safetensors_model(dir.str());
  EXPECT_EQ(read.size(), tensors.size());
}

TEST(Safetensors, ShardedModelWritesIndexAndRoundTrips) {
  ScratchDir dir;
  const NamedTensors tensors = random_params(small_model_config());
  uint64_t total = 0, largest = 0;
  for (const auto& [name, t] : tensors) {
    total += t.nbytes();
    largest = std::max<uint64_t>(largest, t.nbytes());
  }
  const int64_t shard_bytes = 3000;  // the 32x16 fp32 embeddings (2048 bytes) fit; the whole model (~22 KB) does not
  ASSERT_LT(largest, static_cast<uint64_t>(shard_bytes));
  const std::vector<std::string> files = write_safetensors_model(dir.str(), tensors, shard_bytes);
  ASSERT_GE(files.size(), 3u);
  const size_t shard_count = files.size() - 1;
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  char expected_name[64];
  for (size_t i = 0; i < shard_count; ++i) {
    std::snprintf(expected_name, sizeof expected_name, "model-%05zu-of-%05zu.safetensors", i + 1, shard_count);
    EXPECT_EQ(files[i], expected_name);
    EXPECT_LE(read_safetensors_file(dir / files[i]).tensors.size(), tensors.size());
  }

  const json index = json::parse(read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  ASSERT_EQ(index["weight_map"].size(), tensors.size());
  // Shards are filled greedily in model order: each shard's byte total stays within the limit, and the tensors of
  // shard i all come before those of shard i + 1.
  std::map<std::string, uint64_t> shard_bytes_used;
  std::string previous_file;
  for (const auto& [name, t] : tensors) {
    const std::string file = index["weight_map"][name].get<std::string>();
    EXPECT_GE(file, previous_file) << name;
    previous_file = file;
    shard_bytes_used[file] += t.nbytes();
    const SafetensorsFile shard = read_safetensors_file(dir / file);
    auto it = std::find_if(shard.tensors.begin(), shard.tensors.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, shard.tensors.end()) << name << " not in " << file;
    EXPECT_TRUE(same_bits(it->second, t)) << name;
  }
  for (const auto& [file, bytes] : shard_bytes_used) EXPECT_LE(bytes, static_cast<uint64_t>(shard_bytes)) << file;
  EXPECT_EQ(shard_bytes_used.size(), shard_count);

  const NamedTensors read = read_safetensors_model(dir.str());
  ASSERT_EQ(read.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    auto it = std::find_if(read.begin(), read.end(), [&](const auto& e) { return e.first == name; });
    ASSERT_NE(it, read.end()) << name;
    EXPECT_TRUE(same_bits(it->second, t)) << name;
  }
}

TEST(Safetensors, TensorLargerThanTheShardSizeGetsAShardOfItsOwn) {
  ScratchDir dir;
  const NamedTensors tensors = {{"a", Tensor::zeros({4}, DType::F32)},
                                {"big", Tensor::zeros({100}, DType::F32)},
                                {"c", Tensor::zeros({4}, DType::F32)}};
  const std::vector<std::string> files = write_safetensors_model(dir.str(), tensors, 40);
  ASSERT_EQ(files.size(), 4u);
  const json index = json::parse(read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], 432);
}

TEST(Safetensors, WriterRefusesBadInputAndLeavesNothing) {
  ScratchDir dir;
  const Tensor t = Tensor::zeros({2}, DType::F32);
  EXPECT_THROW(encode_safetensors({{"x", t}, {"x", t}}), Error);
  EXPECT_THROW(encode_safetensors({{"", t}}), Error);
  EXPECT_THROW(encode_safetensors({{"__metadata__", t}}), Error);
  EXPECT_THROW(encode_safetensors({{"x", Tensor()}}), Error);
  EXPECT_THROW(write_safetensors_file(dir / "missing_dir/x.safetensors", {{"x", t}}), Error);
  EXPECT_THROW(write_safetensors_model(dir.str(), {{"x", t}}, 0), Error);
  EXPECT_TRUE(directory_listing(dir.str()).empty());
  // An older export in the directory would be read instead of the new one.
  write_safetensors_model(dir.str(), {{"x", t}}, 100);
  expect_error_containing([&] { write_safetensors_model(dir.str(), {{"x", t}}, 100); },
                          {"model.safetensors", "already exists"});
}

// ---------------------------------------------------------------------------------------------------------------
// Damaged and inconsistent files.

class SafetensorsCorrupt : public ::testing::Test {
 protected:
  std::string write(const std::string& bytes) {
    const std::string path = dir_ / "bad.safetensors";
    write_file(path, bytes);
    return path;
  }
  void expect_rejected(const std::string& bytes, const std::vector<std::string>& parts) {
    const std::string path = write(bytes);
    std::vector<std::string> all = parts;
    all.insert(all.begin(), path);  // every message names the file
    expect_error_containing([&] { read_safetensors_file(path); }, all);
  }
  ScratchDir dir_;
};

const std::string kEightBytes(8, '\0');

TEST_F(SafetensorsCorrupt, ValidHandWrittenFileIsAccepted) {
  const std::string header = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const SafetensorsFile file = read_safetensors_file(write(raw_file(header, kEightBytes)));
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].second.shape(), (Shape{2}));
}

TEST_F(SafetensorsCorrupt, ShortFileAndHeaderLengthPastTheEnd) {
  expect_rejected("abc", {"fewer than the 8-byte header length"});
  expect_rejected(little_endian_u64(1000) + "{}", {"header length 1000 runs past the end of the file"});
  expect_rejected(little_endian_u64(uint64_t{1} << 62) + "{}", {"larger than the format allows"});
}

TEST_F(SafetensorsCorrupt, BadJsonAndWrongHeaderShapes) {
  expect_rejected(raw_file("{\"a\": {", ""), {"not valid JSON"});
  expect_rejected(raw_file("[1, 2]", ""), {"must be a JSON object"});
  expect_rejected(raw_file("{\"a\": 3}", ""), {"tensor a", "expected an object"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", kEightBytes), {"tensor a", "data_offsets"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", kEightBytes),
                  {"tensor a", "non-negative integer"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", kEightBytes),
                  {"tensor a", "dtype F16 is not supported"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", kEightBytes),
                  {"tensor a", "unknown field x"});
  expect_rejected(raw_file("{\"__metadata__\":{\"k\":1}}", ""), {"__metadata__", "must be a string"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                           kEightBytes),
                  {"names a twice"});
}

TEST_F(SafetensorsCorrupt, SizeMismatchBetweenShapeAndOffsets) {
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", kEightBytes),
                  {"tensor a", "span 8 bytes", "needs 12"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,4]}}", kEightBytes),
                  {"tensor a", "needs 8"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", kEightBytes),
                  {"tensor a", "end before they begin"});
}

TEST_F(SafetensorsCorrupt, OffsetsPastTheEndOverlapsGapsAndTrailingBytes) {
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", kEightBytes),
                  {"tensor a", "past the end of the data buffer (8 bytes"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                           std::string(12, '\0')),
                  {"tensor b", "overlaps tensor a"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", kEightBytes),
                  {"tensor a", "starts at 4", "unused"});
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", kEightBytes),
                  {"cover 4 bytes", "holds 8"});
}

TEST_F(SafetensorsCorrupt, TruncatedWrittenFileIsRejected) {
  const std::string bytes = encode_safetensors(random_params(small_model_config()));
  expect_rejected(bytes.substr(0, bytes.size() - 3), {"past the end of the data buffer", "truncated"});
}

TEST(SafetensorsModel, IndexAndShardsMustAgree) {
  ScratchDir dir;
  expect_error_containing([&] { read_safetensors_model(dir.str()); },
                          {dir.str(), "model.safetensors", "model.safetensors.index.json"});
  const Tensor t = Tensor::zeros({2}, DType::F32);
  write_safetensors_file(dir / "s1.safetensors", {{"a", t}, {"b", t}});
  const std::string index_path = dir / "model.safetensors.index.json";

  write_file(index_path, R"({"metadata": {"total_size": 16}, "weight_map": {"a": "s1.safetensors"}})");
  expect_error_containing([&] { read_safetensors_model(dir.str()); }, {"tensor b", "does not list"});

  write_file(index_path,
             R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s1.safetensors"}})");
  expect_error_containing([&] { read_safetensors_model(dir.str()); }, {"do not hold", "c (in s1.safetensors)"});

  write_file(index_path, R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error_containing([&] { read_safetensors_model(dir.str()); }, {"s2.safetensors", "does not exist"});

  write_safetensors_file(dir / "s2.safetensors", {{"b", t}});
  write_file(index_path, R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})");
  EXPECT_EQ(read_safetensors_model(dir.str()).size(), 2u);

  write_file(index_path, R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  expect_error_containing([&] { read_safetensors_model(dir.str()); }, {"tensor b", "places it in s2.safetensors"});

  write_file(index_path, R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error_containing([&] { read_safetensors_model(dir.str()); }, {"same directory"});

  write_file(index_path, R"({"weight_map": [1, 2]})");
  expect_error_containing([&] { read_safetensors_model(dir.str()); }, {index_path, "weight_map"});
}

// ---------------------------------------------------------------------------------------------------------------
// The reference implementation reads what hgrn writes (skipped where python3 lacks safetensors and numpy).

TEST(SafetensorsPython, ReferencePackageReadsHgrnFiles) {
  if (run_command("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1").status != 0)
    GTEST_SKIP() << "python3 with the safetensors and numpy packages is not available";
  ScratchDir dir;
  const std::string path = dir / "check.safetensors";
  Tensor weights = tensor_of<float>({1.5f, -2.25f, 3.0f, 0.125f, 8.0f, -0.5f}, {2, 3});
  Tensor ids = tensor_of<int64_t>({3, 1, 4}, {3});
  Tensor counts = tensor_of<int32_t>({-7}, {1});
  write_safetensors_file(path, {{"weights", weights}, {"ids", ids}, {"counts", counts}}, {{"format", "pt"}});
  const std::string script =
      "import sys, numpy as np\n"
      "from safetensors import safe_open\n"
      "from safetensors.numpy import load_file, save_file\n"
      "t = load_file(sys.argv[1])\n"
      "assert t['weights'].dtype == np.float32 and t['weights'].shape == (2, 3), t['weights']\n"
      "assert t['weights'].tolist() == [[1.5, -2.25, 3.0], [0.125, 8.0, -0.5]]\n"
      "assert t['ids'].dtype == np.int64 and t['ids'].tolist() == [3, 1, 4]\n"
      "assert t['counts'].dtype == np.int32 and t['counts'].tolist() == [-7]\n"
      "with safe_open(sys.argv[1], framework='numpy') as f: assert f.metadata() == {'format': 'pt'}\n"
      // The reference writer produces the very same bytes from the same tensors.
      "save_file(t, sys.argv[1] + '.ref', metadata={'format': 'pt'})\n"
      "assert open(sys.argv[1], 'rb').read() == open(sys.argv[1] + '.ref', 'rb').read(), 'bytes differ'\n"
      "print('ok')\n";
  const std::string script_path = dir / "check.py";
  write_file(script_path, script);
  const CommandResult r = run_command("python3 " + shell_quote(script_path) + " " + shell_quote(path));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "ok\n") << r.err;
}

}  // namespace
}  // namespace hgrn
