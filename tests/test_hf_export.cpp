// test_hf_export.cpp: the Hugging Face export (names and shapes of hgrn-spec.md section 5.3, every config.json field
// of section 5.1), its import (bit-exact fp32 round trip, bf16 rounding, sharded directories, tied embeddings,
// refusal of missing / extra / misshapen tensors and of configs hgrn cannot run), the atomic output directory, and
// the `hgrn export` command end to end on a checkpoint, including the reference logits.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/export.h"
#include "core/autograd.h"
#include "export_fixtures.h"
#include "io/checkpoint.h"
#include "io/hf_export.h"
#include "models/decoder_lm.h"
#include "models/registry.h"
#include "test_files.h"

namespace hgrn {
namespace {

using namespace export_testing;
using json = nlohmann::json;

using testing::expect_error_containing;

const Tensor* find_tensor(const NamedTensors& tensors, const std::string& name) {
  for (const auto& entry : tensors)
    if (entry.first == name) return &entry.second;
  return nullptr;
}

// The state dict of spec section 5.3 for small_model_config(): D = 16, F = H·K = 16, I = 24, vocabulary 32, L = 2,
// written out by hand so that the test pins the spec rather than model_param_specs.
std::vector<std::pair<std::string, Shape>> spec_state_dict(bool tied) {
  std::vector<std::pair<std::string, Shape>> expected = {{"model.embeddings.weight", {32, 16}},
                                                         {"model.lower_bounds", {2, 16}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    expected.insert(expected.end(), {{p + "attn_norm.weight", {16}},
                                     {p + "attn.q_proj.weight", {16, 16}},
                                     {p + "attn.f_proj.weight", {16, 16}},
                                     {p + "attn.i_proj.weight", {16, 16}},
                                     {p + "attn.g_norm.weight", {16}},
                                     {p + "attn.o_proj.weight", {16, 16}},
                                     {p + "mlp_norm.weight", {16}},
                                     {p + "mlp.gate_proj.weight", {24, 16}},
                                     {p + "mlp.up_proj.weight", {24, 16}},
                                     {p + "mlp.down_proj.weight", {16, 24}}});
  }
  expected.push_back({"model.norm.weight", {16}});
  if (!tied) expected.push_back({"lm_head.weight", {32, 16}});
  return expected;
}

void expect_same_params(const NamedTensors& expected, const NamedTensors& actual) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].first, expected[i].first);
    EXPECT_TRUE(same_bits(actual[i].second, expected[i].second)) << expected[i].first;
  }
}

TEST(HfExport, WritesTheSpecStateDictNamesAndShapes) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  export_hf(config, random_params(config), dir / "out", DType::F32);
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"out"});  // no temporary directory left
  EXPECT_EQ(directory_listing(dir / "out"), (std::vector<std::string>{"config.json", "model.safetensors"}));

  const SafetensorsFile file = read_safetensors_file(dir / "out/model.safetensors");
  EXPECT_EQ(file.metadata, (SafetensorsMetadata{{"format", "pt"}}));  // transformers refuses files without it
  const auto expected = spec_state_dict(false);
  ASSERT_EQ(file.tensors.size(), expected.size());
  for (const auto& [name, shape] : expected) {
    const Tensor* tensor = find_tensor(file.tensors, name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->shape(), shape) << name;
    EXPECT_EQ(tensor->dtype(), DType::F32) << name;
  }
}

TEST(HfExport, ConfigJsonHasEveryHgrn2ConfigField) {
  ScratchDir dir;
  ModelConfig config = small_model_config();
  config.norm_eps = 1e-5;
  config.use_lower_bound = true;
  config.initializer_range = 0.01;
  export_hf(config, random_params(config), dir / "out", DType::F32);
  const json c = json::parse(read_file(dir / "out/config.json"));

  const std::set<std::string> expected_keys = {
      "model_type", "architectures", "hidden_size", "num_hidden_layers", "expand_ratio", "num_heads", "vocab_size",
      "hidden_ratio", "intermediate_size", "use_lower_bound", "norm_eps", "tie_word_embeddings", "initializer_range",
      "attn_mode", "use_short_conv", "conv_size", "hidden_act", "max_position_embeddings", "elementwise_affine",
      "attn", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "fuse_norm", "fuse_swiglu",
      "fuse_cross_entropy", "fuse_linear_cross_entropy", "use_l2warp", "torch_dtype", "transformers_version",
      "attnres_block_size"};
  std::set<std::string> keys;
  for (const auto& [key, value] : c.items()) keys.insert(key);
  EXPECT_EQ(keys, expected_keys);

  EXPECT_EQ(c["model_type"], "hgrn2");
  EXPECT_EQ(c["architectures"], json::array({"HGRN2ForCausalLM"}));
  EXPECT_EQ(c["hidden_size"], 16);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["expand_ratio"], 4);
  EXPECT_EQ(c["num_heads"], 4);  // hidden_size / expand_ratio
  EXPECT_EQ(c["vocab_size"], 32);
  EXPECT_EQ(c["hidden_ratio"], 4);
  EXPECT_EQ(c["intermediate_size"], 24);
  EXPECT_EQ(c["use_lower_bound"], true);
  EXPECT_EQ(c["norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["initializer_range"].get<double>(), 0.01);
  EXPECT_EQ(c["attn_mode"], "chunk");
  EXPECT_EQ(c["use_short_conv"], false);
  EXPECT_EQ(c["conv_size"], 4);
  EXPECT_EQ(c["hidden_act"], "swish");
  EXPECT_EQ(c["max_position_embeddings"], 2048);
  EXPECT_EQ(c["elementwise_affine"], true);
  EXPECT_TRUE(c["attn"].is_null());
  EXPECT_EQ(c["use_cache"], true);
  EXPECT_TRUE(c["pad_token_id"].is_null());
  // No tokenizer given: the special tokens are not known, so they are null rather than made up.
  EXPECT_TRUE(c["bos_token_id"].is_null());
  EXPECT_TRUE(c["eos_token_id"].is_null());
  EXPECT_EQ(c["fuse_norm"], true);
  EXPECT_EQ(c["fuse_swiglu"], true);
  EXPECT_EQ(c["fuse_cross_entropy"], true);
  EXPECT_EQ(c["fuse_linear_cross_entropy"], false);
  EXPECT_EQ(c["use_l2warp"], false);
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_EQ(c["transformers_version"], kTransformersVersion);
  EXPECT_TRUE(c["attnres_block_size"].is_null());
}

TEST(HfExport, ConfigJsonResolvesNumHeadsAndTheMlpWidth) {
  ModelConfig config = small_model_config();
  config.expand_ratio.reset();
  config.num_heads = 2;
  config.intermediate_size.reset();
  config.attn_mode = "fused_recurrent";
  const json c = json::parse(hf_config_json(config, DType::BF16));
  EXPECT_EQ(c["expand_ratio"], 8);  // 16 / 2 heads
  EXPECT_EQ(c["num_heads"], 2);
  EXPECT_EQ(c["intermediate_size"], 256);  // 256 * ceil(floor(16 * 4 * 2 / 3) / 256)
  EXPECT_EQ(c["attn_mode"], "fused_recurrent");
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_THROW(hf_config_json(config, DType::F64), Error);
}

TEST(HfExport, Fp32RoundTripIsBitExact) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const NamedTensors params = random_params(config, 7);
  export_hf(config, params, dir / "out", DType::F32);

  const ModelConfig read = read_hf_config(dir / "out");
  EXPECT_EQ(read.hidden_size, config.hidden_size);
  EXPECT_EQ(read.num_hidden_layers, config.num_hidden_layers);
  EXPECT_EQ(read.heads(), config.heads());
  EXPECT_EQ(read.key_dim(), config.key_dim());
  EXPECT_EQ(read.value_dim(), config.value_dim());
  EXPECT_EQ(read.mlp_size(), config.mlp_size());
  EXPECT_EQ(read.vocab_size, config.vocab_size);
  EXPECT_EQ(read.hidden_ratio, config.hidden_ratio);
  EXPECT_EQ(read.use_lower_bound, config.use_lower_bound);
  EXPECT_EQ(read.norm_eps, config.norm_eps);
  EXPECT_EQ(read.tie_word_embeddings, config.tie_word_embeddings);
  EXPECT_EQ(read.initializer_range, config.initializer_range);
  EXPECT_EQ(read.attn_mode, config.attn_mode);
  expect_same_params(params, read_hf_weights(dir / "out", read));
}

TEST(HfExport, Bf16ExportRoundsToNearestEvenAndImportsAsFp32) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const NamedTensors params = random_params(config, 8);
  export_hf(config, params, dir / "out", DType::BF16);
  EXPECT_EQ(json::parse(read_file(dir / "out/config.json"))["torch_dtype"], "bfloat16");
  for (const auto& [name, tensor] : read_safetensors_file(dir / "out/model.safetensors").tensors)
    EXPECT_EQ(tensor.dtype(), DType::BF16) << name;

  const NamedTensors imported = read_hf_weights(dir / "out", read_hf_config(dir / "out"));
  ASSERT_EQ(imported.size(), params.size());
  int64_t changed = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(imported[i].second.dtype(), DType::F32);
    const float* original = params[i].second.data<float>();
    const float* back = imported[i].second.data<float>();
    for (int64_t k = 0; k < params[i].second.numel(); ++k) {
      const float rounded = static_cast<float>(bf16(original[k]));
      ASSERT_EQ(back[k], rounded) << params[i].first << "[" << k << "]";
      // bf16 keeps 8 significant bits: relative rounding error at most 2^-9.
      EXPECT_LE(std::fabs(back[k] - original[k]), std::ldexp(std::fabs(original[k]), -8));
      changed += back[k] != original[k];
    }
  }
  EXPECT_GT(changed, 0);  // random fp32 values do not survive bf16 unchanged
}

TEST(HfExport, ShardedExportWritesIndexAndRoundTrips) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const NamedTensors params = random_params(config, 9);
  export_hf(config, params, dir / "out", DType::F32, /*shard_bytes=*/4096);
  const std::vector<std::string> files = directory_listing(dir / "out");
  EXPECT_EQ(std::count(files.begin(), files.end(), "model.safetensors"), 0);
  EXPECT_EQ(std::count(files.begin(), files.end(), "model.safetensors.index.json"), 1);
  EXPECT_GE(files.size(), 4u);  // config.json, the index, and at least two shards

  const json index = json::parse(read_file(dir / "out/model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& [name, t] : params) {
    total += t.nbytes();
    EXPECT_TRUE(index["weight_map"].contains(name)) << name;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), params.size());
  expect_same_params(params, read_hf_weights(dir / "out", read_hf_config(dir / "out")));
}

TEST(HfExport, TiedEmbeddingsOmitLmHead) {
  ScratchDir dir;
  const ModelConfig config = small_model_config(/*tied=*/true);
  const NamedTensors params = random_params(config, 10);
  EXPECT_EQ(find_tensor(params, "lm_head.weight"), nullptr);
  export_hf(config, params, dir / "out", DType::F32);
  const SafetensorsFile file = read_safetensors_file(dir / "out/model.safetensors");
  EXPECT_EQ(find_tensor(file.tensors, "lm_head.weight"), nullptr);
  EXPECT_EQ(file.tensors.size(), spec_state_dict(true).size());
  EXPECT_EQ(json::parse(read_file(dir / "out/config.json"))["tie_word_embeddings"], true);
  const ModelConfig read = read_hf_config(dir / "out");
  EXPECT_TRUE(read.tie_word_embeddings);
  expect_same_params(params, read_hf_weights(dir / "out", read));

  // A writer that keeps an exact copy of the tied embeddings is accepted; a different lm_head is a contradiction.
  NamedTensors with_head = file.tensors;
  with_head.emplace_back("lm_head.weight", find_tensor(file.tensors, "model.embeddings.weight")->clone());
  std::filesystem::remove(dir / "out/model.safetensors");
  write_safetensors_file(dir / "out/model.safetensors", with_head);
  expect_same_params(params, read_hf_weights(dir / "out", read));
  with_head.back().second.set_item(0, 123.0);
  std::filesystem::remove(dir / "out/model.safetensors");
  write_safetensors_file(dir / "out/model.safetensors", with_head);
  expect_error_containing([&] { read_hf_weights(dir / "out", read); }, {"lm_head.weight", "tie_word_embeddings"});
}

TEST(HfExport, RefusesToOverwriteUnlessAskedAndThenReplacesWhole) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  const std::string out = dir / "out";
  std::filesystem::create_directories(out);
  export_hf(config, random_params(config, 1), out, DType::F32);  // an empty directory is simply used
  write_file(out + "/notes.txt", "keep me");

  expect_error_containing([&] { export_hf(config, random_params(config, 2), out, DType::F32); },
                          {out, "refusing to overwrite", "not empty"});
  EXPECT_EQ(read_file(out + "/notes.txt"), "keep me");
  expect_same_params(random_params(config, 1), read_hf_weights(out, config));

  export_hf(config, random_params(config, 2), out, DType::F32, kDefaultShardBytes, /*overwrite=*/true);
  EXPECT_EQ(directory_listing(out), (std::vector<std::string>{"config.json", "model.safetensors"}));
  expect_same_params(random_params(config, 2), read_hf_weights(out, config));
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"out"});  // neither temporary nor old copy left
}

TEST(HfExport, TrailingSlashNamesTheSameDirectory) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  export_hf(config, random_params(config, 1), dir / "out/", DType::F32);
  export_hf(config, random_params(config, 2), dir / "out/", DType::F32, kDefaultShardBytes, /*overwrite=*/true);
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"out"});
  expect_same_params(random_params(config, 2), read_hf_weights(dir / "out", config));
}

TEST(HfExport, ComplexHgrnIsRefusedPointingAtHdf5) {
  ScratchDir dir;
  ModelConfig config = small_model_config();
  config.type = "hgrn";
  config.expand_ratio = 1;
  config.complex = true;
  expect_error_containing([&] { export_hf(config, random_params(config), dir / "out", DType::F32); },
                          {"model.complex", "no Hugging Face form", "--format hdf5"});
  EXPECT_TRUE(directory_listing(dir.str()).empty());
}

TEST(HfExport, FailedExportLeavesNoDirectory) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  NamedTensors params = random_params(config);
  params.erase(params.begin() + 3);  // model.layers.0.attn.q_proj.weight
  params.emplace_back("model.extra.weight", Tensor::zeros({2}, DType::F32));
  expect_error_containing([&] { export_hf(config, params, dir / "out", DType::F32); },
                          {"missing model.layers.0.attn.q_proj.weight", "unexpected model.extra.weight"});
  EXPECT_TRUE(directory_listing(dir.str()).empty());

  // With --force, a failure leaves the previous export untouched.
  export_hf(config, random_params(config, 3), dir / "out", DType::F32);
  EXPECT_THROW(export_hf(config, params, dir / "out", DType::F32, kDefaultShardBytes, true), Error);
  expect_same_params(random_params(config, 3), read_hf_weights(dir / "out", config));
  EXPECT_EQ(directory_listing(dir.str()), std::vector<std::string>{"out"});
}

// ---------------------------------------------------------------------------------------------------------------
// Import of directories that do not fit.

// Rewrites dir/model.safetensors with `tensors`.
void replace_weights(const std::string& dir, const NamedTensors& tensors) {
  std::filesystem::remove(dir + "/model.safetensors");
  write_safetensors_file(dir + "/model.safetensors", tensors);
}

TEST(HfExportImport, RefusesMissingAndExtraTensorsListingAllOfThem) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  export_hf(config, random_params(config), dir / "out", DType::F32);
  NamedTensors tensors = read_safetensors_file(dir / "out/model.safetensors").tensors;
  std::erase_if(tensors, [](const auto& e) {
    return e.first == "model.layers.1.mlp.up_proj.weight" || e.first == "model.norm.weight";
  });
  tensors.emplace_back("model.layers.0.attn.q_conv1d.weight", Tensor::zeros({16, 1, 4}, DType::F32));
  replace_weights(dir / "out", tensors);
  expect_error_containing([&] { read_hf_weights(dir / "out", config); },
                          {dir / "out", "missing model.layers.1.mlp.up_proj.weight, model.norm.weight",
                           "unexpected model.layers.0.attn.q_conv1d.weight"});
}

TEST(HfExportImport, RefusesAWrongShapeOrDtype) {
  ScratchDir dir;
  const ModelConfig config = small_model_config();
  export_hf(config, random_params(config), dir / "out", DType::F32);
  NamedTensors tensors = read_safetensors_file(dir / "out/model.safetensors").tensors;
  for (auto& [name, t] : tensors)
    if (name == "model.layers.0.mlp.down_proj.weight") t = Tensor::zeros({24, 16}, DType::F32);
  replace_weights(dir / "out", tensors);
  expect_error_containing([&] { read_hf_weights(dir / "out", config); },
                          {"model.layers.0.mlp.down_proj.weight", "[24, 16]", "[16, 24]"});

  for (auto& [name, t] : tensors)
    if (name == "model.layers.0.mlp.down_proj.weight") t = Tensor::zeros({16, 24}, DType::I32);
  replace_weights(dir / "out", tensors);
  expect_error_containing([&] { read_hf_weights(dir / "out", config); },
                          {"model.layers.0.mlp.down_proj.weight", "I32"});
}

TEST(HfExportImport, RefusesConfigsHgrnCannotRun) {
  ScratchDir dir;
  const std::string config_path = dir / "config.json";
  const json base = json::parse(hf_config_json(small_model_config(), DType::F32));
  auto expect_refused = [&](const std::function<void(json&)>& edit, const std::vector<std::string>& parts) {
    json c = base;
    edit(c);
    write_file(config_path, c.dump());
    std::vector<std::string> all = parts;
    all.insert(all.begin(), config_path);
    expect_error_containing([&] { read_hf_config(dir.str()); }, all);
  };
  expect_refused([](json& c) { c["model_type"] = "rwkv6"; }, {"model_type", "\"hgrn2\"", "got \"rwkv6\""});
  expect_refused([](json& c) { c.erase("model_type"); }, {"model_type"});
  expect_refused([](json& c) { c["use_short_conv"] = true; }, {"use_short_conv"});
  expect_refused([](json& c) { c["attn"] = json{{"layers", {1}}, {"num_heads", 2}}; }, {"attn", "expected null"});
  expect_refused([](json& c) { c["attnres_block_size"] = 4; }, {"attnres_block_size"});
  expect_refused([](json& c) { c["elementwise_affine"] = false; }, {"elementwise_affine"});
  expect_refused([](json& c) { c["hidden_act"] = "gelu"; }, {"hidden_act"});
  expect_refused([](json& c) { c["hidden_size"] = "16"; }, {"hidden_size", "expected an integer"});
  expect_refused([](json& c) { c["expand_ratio"] = 5; }, {"expand_ratio", "divisor of hidden_size = 16"});
  expect_refused([](json& c) { c["expand_ratio"] = nullptr, c["num_heads"] = nullptr; }, {"expand_ratio"});
  expect_refused([](json& c) { c["attn_mode"] = "parallel"; }, {"attn_mode"});
  write_file(config_path, "{ not json");
  expect_error_containing([&] { read_hf_config(dir.str()); }, {config_path, "not valid JSON"});
  std::filesystem::remove(config_path);
  expect_error_containing([&] { read_hf_config(dir.str()); }, {"no config.json", dir.str()});
}

TEST(HfExportImport, AbsentFieldsTakeHgrn2ConfigDefaults) {
  ScratchDir dir;
  write_file(dir / "config.json",
             R"({"model_type": "hgrn2", "hidden_size": 256, "num_hidden_layers": 1, "vocab_size": 10,
                 "attn_mode": "fused_chunk", "hidden_ratio": null})");
  const ModelConfig m = read_hf_config(dir.str());
  EXPECT_EQ(m.key_dim(), 128);  // expand_ratio defaults to 128 in HGRN2Config
  EXPECT_EQ(m.heads(), 2);
  EXPECT_EQ(m.hidden_ratio, 4);
  EXPECT_EQ(m.mlp_size(), 768);  // 256 * ceil(floor(256 * 4 * 2 / 3) / 256)
  EXPECT_TRUE(m.use_lower_bound);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.norm_eps, 1e-6);
  EXPECT_EQ(m.initializer_range, 0.02);
  EXPECT_EQ(m.attn_mode, "chunk");

  // Only num_heads given, expand_ratio explicitly null: expand_ratio = hidden_size / num_heads.
  write_file(dir / "config.json",
             R"({"model_type": "hgrn2", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 10,
                 "expand_ratio": null, "num_heads": 4})");
  const ModelConfig n = read_hf_config(dir.str());
  EXPECT_EQ(n.heads(), 4);
  EXPECT_EQ(n.key_dim(), 16);
}

// ---------------------------------------------------------------------------------------------------------------
// `hgrn export` end to end.

class ExportCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(hgrn_binary())) << "hgrn binary not found at " << hgrn_binary();
    Config config;
    config.model = small_model_config();
    config_ = config;
    Rng rng(42);
    DecoderLM model(config.model, rng);
    TrainingState state;
    state.step = 17;
    for (const auto& [spec, var] : model.parameters()) {
      Tensor value = var->value.clone();
      // Non-zero lower bounds, so the exported forward exercises the cumax path.
      if (spec.name == "model.lower_bounds")
        for (int64_t i = 0; i < value.numel(); ++i) value.set_item(i, rng.normal());
      state.params.emplace_back(spec.name, value);
      state.adam_m.push_back(Tensor::zeros(spec.shape, DType::F32));
      state.adam_v.push_back(Tensor::zeros(spec.shape, DType::F32));
    }
    state.config_yaml = config_to_yaml(config);
    state.model_signature = "export test";
    state.hgrn_version = HGRN_VERSION;
    state.git_commit = HGRN_GIT_COMMIT;
    params_ = state.params;
    checkpoint_ = save_checkpoint(dir_ / "checkpoints", state);
  }

  ScratchDir dir_;
  Config config_;
  NamedTensors params_;
  std::string checkpoint_;
};

TEST_F(ExportCli, HfExportWithReferenceLogitsMatchesTheImportedModel) {
  const std::string out = dir_ / "export";
  const CommandResult r =
      run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hf", "--out", out, "--reference-logits", "3"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step 17"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tools/verify_hf_export.py"), std::string::npos) << r.out;
  EXPECT_EQ(directory_listing(out),
            (std::vector<std::string>{"config.json", "hgrn_reference.safetensors", "model.safetensors"}));

  const ModelConfig imported_config = read_hf_config(out);
  const NamedTensors imported = read_hf_weights(out, imported_config);
  expect_same_params(params_, imported);

  const SafetensorsFile reference = read_safetensors_file(out + "/hgrn_reference.safetensors");
  const Tensor* ids = find_tensor(reference.tensors, "input_ids");
  const Tensor* logits = find_tensor(reference.tensors, "logits");
  ASSERT_NE(ids, nullptr);
  ASSERT_NE(logits, nullptr);
  ASSERT_EQ(ids->dtype(), DType::I64);
  ASSERT_EQ(ids->shape(), (Shape{3, cli::kReferenceSequenceLength}));
  ASSERT_EQ(logits->dtype(), DType::F32);
  ASSERT_EQ(logits->shape(), (Shape{3, cli::kReferenceSequenceLength, 32}));  // vocab 32
  std::set<int64_t> distinct;
  for (int64_t i = 0; i < ids->numel(); ++i) {
    const int64_t id = ids->data<int64_t>()[i];
    ASSERT_GE(id, 0);
    ASSERT_LT(id, 32);
    distinct.insert(id);
  }
  EXPECT_GT(distinct.size(), 10u);

  // The model rebuilt from the exported directory gives the logits the reference file holds.
  Rng rng(0);
  DecoderLM model(imported_config, rng);
  for (const auto& [name, value] : imported) model.parameter(name)->value.copy_from(value);
  Tape tape;
  tape.set_enabled(false);
  const Tensor expected = model.forward(tape, *ids)->value;
  ASSERT_EQ(expected.shape(), logits->shape());
  double max_error = 0, max_value = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    max_error = std::max(max_error, std::fabs(expected.item(i) - logits->item(i)));
    max_value = std::max(max_value, std::fabs(expected.item(i)));
  }
  EXPECT_GT(max_value, 0.0);
  EXPECT_LE(max_error, 1e-5 * max_value);
}

TEST_F(ExportCli, RefusesToOverwriteWithoutForce) {
  const std::string out = dir_ / "export";
  ASSERT_EQ(run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hf", "--out", out}).status, 0);
  CommandResult r =
      run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hf", "--out", out, "--dtype", "bf16"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("refusing to overwrite " + out), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
  EXPECT_EQ(json::parse(read_file(out + "/config.json"))["torch_dtype"], "float32");

  r = run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hf", "--out", out, "--dtype", "bf16", "--force",
                "--shard-size", "4096"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(json::parse(read_file(out + "/config.json"))["torch_dtype"], "bfloat16");
  EXPECT_TRUE(std::filesystem::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors"));
  EXPECT_EQ(read_hf_weights(out, read_hf_config(out)).size(), params_.size());
}

TEST_F(ExportCli, Hdf5FormatWritesOneFile) {
  const std::string out = dir_ / "weights.h5";
  CommandResult r = run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hdf5", "--out", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::filesystem::is_regular_file(out));
  r = run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hdf5", "--out", out});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("refusing to overwrite"), std::string::npos) << r.err;
  EXPECT_EQ(run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hdf5", "--out", out, "--force"}).status, 0);
}

TEST_F(ExportCli, BadArgumentsAndMissingCheckpoint) {
  CommandResult r = run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hdf5", "--out", dir_ / "w.h5",
                              "--reference-logits", "2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--reference-logits"), std::string::npos) << r.err;
  r = run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "onnx", "--out", dir_ / "x"});
  EXPECT_EQ(r.status, 2);
  r = run_hgrn({"export", "--checkpoint", checkpoint_, "--format", "hf", "--out", dir_ / "x", "--dtype", "fp16"});
  EXPECT_EQ(r.status, 2);
  r = run_hgrn({"export", "--checkpoint", dir_ / "nope.h5", "--format", "hf", "--out", dir_ / "x"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find(dir_ / "nope.h5"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x"));
  r = run_hgrn({"export", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* text : {"--checkpoint", "--format", "--out", "--dtype", "--shard-size", "--force",
                           "--reference-logits", "Examples:"})
    EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing in\n" << r.out;
}

TEST(ExportReference, SameSeedSameSequences) {
  const ModelConfig config = small_model_config();
  const NamedTensors params = random_params(config, 5);
  const NamedTensors a = cli::reference_logits(config, params, 2);
  const NamedTensors b = cli::reference_logits(config, params, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].first, "input_ids");
  EXPECT_EQ(a[1].first, "logits");
  EXPECT_TRUE(same_bits(a[0].second, b[0].second));
  EXPECT_TRUE(same_bits(a[1].second, b[1].second));
  EXPECT_THROW(cli::reference_logits(config, params, 0), Error);
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

// HGRN1 (fla's HGRNForCausalLM): D = 16 with a recurrence twice as wide, so that the mixer's widths and D differ.
ModelConfig small_hgrn1_config() {
  ModelConfig m = small_model_config();
  m.type = "hgrn";
  m.expand_ratio = 2;
  return m;
}

TEST(HfExport, Hgrn1WritesHgrnConfigAndRoundTripsBitExact) {
  const ModelConfig config = small_hgrn1_config();
  const NamedTensors params = random_params(config);
  ScratchDir dir;
  const std::string out = dir / "hgrn1";
  export_hf(config, params, out, DType::F32);
  const nlohmann::json c = nlohmann::json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(c["model_type"], "hgrn");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"HGRNForCausalLM"}));
  EXPECT_EQ(c["expand_ratio"], 2);
  EXPECT_FALSE(c.contains("num_heads"));  // HGRNConfig has none
  const ModelConfig imported = read_hf_config(out);
  EXPECT_EQ(imported.type, "hgrn");
  EXPECT_EQ(imported.expand_ratio, std::optional<int64_t>(2));
  EXPECT_EQ(imported.hidden_size, 16);
  const NamedTensors back = read_hf_weights(out, imported);
  ASSERT_EQ(back.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(back[i].first, params[i].first);
    EXPECT_TRUE(same_bits(back[i].second, params[i].second)) << params[i].first;
  }
  // The weights name fla's HGRN layer: i/f/g projections D·expand_ratio wide.
  bool found = false;
  for (const auto& [name, tensor] : back)
    if (name == "model.layers.1.attn.g_proj.weight") {
      found = true;
      EXPECT_EQ(tensor.shape(), (Shape{32, 16}));
    }
  EXPECT_TRUE(found);
}

TEST(HfExportImport, Hgrn1AbsentFieldsTakeHgrnConfigDefaultsAndAnUnknownTypeIsRefused) {
  ScratchDir dir;
  write_file(dir / "config.json",
             R"({"model_type": "hgrn", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 10})");
  const ModelConfig m = read_hf_config(dir.str());
  EXPECT_EQ(m.type, "hgrn");
  EXPECT_EQ(m.expand_ratio, std::optional<int64_t>(1));
  write_file(dir / "config.json", R"({"model_type": "mamba", "hidden_size": 64})");
  try {
    read_hf_config(dir.str());
    ADD_FAILURE() << "model_type mamba was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model_type: expected one of \"hgrn2\" (fla's HGRN2ForCausalLM), \"hgrn\" "
                                         "(fla's HGRNForCausalLM), \"gla\" (fla's GLAForCausalLM), \"retnet\" (fla's "
                                         "RetNetForCausalLM), got \"mamba\""),
              std::string::npos)
        << e.what();
  }
}

// GLA (fla's GLAForCausalLM): D = 16, 2 heads, keys 8 (4 a head) and values 16 (8 a head) wide.
ModelConfig small_gla_config() {
  ModelConfig m = small_model_config();
  m.type = "gla";
  m.expand_ratio.reset();
  m.num_heads = 2;
  return m;
}

TEST(HfExport, GlaWritesGlaConfigFieldsAndRoundTripsBitExact) {
  const ModelConfig config = small_gla_config();
  const NamedTensors params = random_params(config);
  ScratchDir dir;
  const std::string out = dir / "gla";
  export_hf(config, params, out, DType::F32);
  const json c = json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(c["model_type"], "gla");
  EXPECT_EQ(c["architectures"], json::array({"GLAForCausalLM"}));
  EXPECT_EQ(c["num_heads"], 2);
  EXPECT_EQ(c["expand_k"].get<double>(), 0.5);  // GLAConfig's defaults, written resolved
  EXPECT_EQ(c["expand_v"].get<double>(), 1.0);
  for (const char* null_field : {"num_kv_heads", "feature_map", "clamp_min"}) EXPECT_TRUE(c[null_field].is_null());
  EXPECT_EQ(c["use_output_gate"], true);
  EXPECT_EQ(c["fuse_norm"], true);
  // HGRN's fields are not GLA's.
  for (const char* hgrn_field : {"expand_ratio", "use_lower_bound"}) EXPECT_FALSE(c.contains(hgrn_field));
  const ModelConfig imported = read_hf_config(out);
  EXPECT_EQ(imported.type, "gla");
  EXPECT_EQ(model_signature(imported), model_signature(config));
  const NamedTensors back = read_hf_weights(out, imported);
  expect_same_params(params, back);
  const Tensor* gate = find_tensor(back, "model.layers.1.attn.gk_proj.1.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape(), (Shape{8, 16}));
}

TEST(HfExportImport, GlaAbsentFieldsTakeGlaConfigDefaultsAndUnsupportedOnesAreRefused) {
  ScratchDir dir;
  write_file(dir / "config.json",
             R"({"model_type": "gla", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 10})");
  const ModelConfig m = read_hf_config(dir.str());
  EXPECT_EQ(m.type, "gla");
  EXPECT_EQ(m.num_heads, std::optional<int64_t>(4));
  EXPECT_EQ(m.expand_k, std::optional<double>(0.5));
  EXPECT_EQ(m.expand_v, std::optional<double>(1.0));
  EXPECT_EQ(m.mlp_size(), 256 * ((64 * 4 * 2 / 3 + 255) / 256));  // hidden_ratio 4
  const auto expect_refused = [&](const std::string& fields, const std::string& expected) {
    write_file(dir / "config.json", R"({"model_type": "gla", "hidden_size": 64, )" + fields + "}");
    expect_error_containing([&] { read_hf_config(dir.str()); }, {expected});
  };
  expect_refused(R"("clamp_min": -8)", "clamp_min: a lower clamp of the forget gate is not part");
  expect_refused(R"("num_heads": 4, "num_kv_heads": 2)", "num_kv_heads: grouped keys and values are not part");
  expect_refused(R"("feature_map": "relu")", "feature_map: a feature map on queries and keys is not part");
  expect_refused(R"("use_output_gate": false)", "use_output_gate:");
  expect_refused(R"("fuse_norm": false)", "fuse_norm: expected true");
  expect_refused(R"("hidden_act": "silu")", "hidden_act: expected \"swish\"");
  expect_refused(R"("num_heads": 3)", "expand_k: hidden_size x expand_k = 32 must be divisible by num_heads = 3");
  expect_refused(R"("expand_v": 0.3)", "expand_v: expected a positive number that makes hidden_size x expand_v");
}

// RetNet (fla's RetNetForCausalLM): D = 16, 2 heads, keys 16 (8 a head) and values 32 (16 a head) wide.
TEST(HfExport, RetNetWritesRetNetConfigFieldsAndRoundTripsBitExact) {
  ModelConfig config = small_gla_config();
  config.type = "retnet";
  const NamedTensors params = random_params(config, 2);
  ScratchDir dir;
  const std::string out = dir / "retnet";
  export_hf(config, params, out, DType::F32);
  const json c = json::parse(read_file(out + "/config.json"));
  EXPECT_EQ(c["model_type"], "retnet");
  EXPECT_EQ(c["architectures"], json::array({"RetNetForCausalLM"}));
  EXPECT_EQ(c["num_heads"], 2);
  EXPECT_EQ(c["expand_k"].get<double>(), 1.0);  // RetNetConfig's defaults, written resolved
  EXPECT_EQ(c["expand_v"].get<double>(), 2.0);
  EXPECT_EQ(c["intermediate_size"], 24);
  for (const char* hgrn_field : {"expand_ratio", "use_lower_bound", "clamp_min"}) EXPECT_FALSE(c.contains(hgrn_field));
  const ModelConfig imported = read_hf_config(out);
  EXPECT_EQ(imported.type, "retnet");
  EXPECT_EQ(model_signature(imported), model_signature(config));
  expect_same_params(params, read_hf_weights(out, imported));
}

TEST(HfExportImport, RetNetAbsentFieldsTakeRetNetConfigDefaults) {
  ScratchDir dir;
  write_file(dir / "config.json",
             R"({"model_type": "retnet", "hidden_size": 64, "num_hidden_layers": 1, "vocab_size": 10})");
  const ModelConfig m = read_hf_config(dir.str());
  EXPECT_EQ(m.num_heads, std::optional<int64_t>(8));
  EXPECT_EQ(m.expand_k, std::optional<double>(1.0));
  EXPECT_EQ(m.expand_v, std::optional<double>(2.0));
  EXPECT_EQ(m.hidden_ratio, 2);  // RetNetConfig's, not HGRN's 4
  write_file(dir / "config.json", R"({"model_type": "retnet", "hidden_size": 64, "hidden_ratio": null})");
  EXPECT_EQ(read_hf_config(dir.str()).hidden_ratio, 4);  // fla's MLP takes null as 4
  write_file(dir / "config.json", R"({"model_type": "retnet", "hidden_size": 64, "attn_mode": "parallel"})");
  EXPECT_EQ(read_hf_config(dir.str()).attn_mode, "chunk");  // the same function
  // Keys the rotary embedding cannot take: an odd width per head, or one past fla's 256.
  write_file(dir / "config.json", R"({"model_type": "retnet", "hidden_size": 64, "num_heads": 64})");
  expect_error_containing([&] { read_hf_config(dir.str()); },
                          {"expand_k: the key width per head, hidden_size x expand_k / num_heads = 1, must be even"});
  write_file(dir / "config.json", R"({"model_type": "retnet", "hidden_size": 64, "num_heads": 1, "expand_k": 8})");
  expect_error_containing([&] { read_hf_config(dir.str()); }, {"= 512, must be even and at most 256"});
}

}  // namespace
}  // namespace hgrn
