// hf_export.cpp: the Hugging Face (fla *ForCausalLM) directory writer and reader: the config.json fields shared by the
// family (hgrn-spec.md section 5; each member adds its own) and the state-dict names and shapes of model_param_specs.
#include "io/hf_export.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/atomic_write.h"
#include "io/hf_config_reader.h"
#include "models/registry.h"

namespace hgrn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kConfigFile = "config.json";

// fla's config defaults (spec sections 5.1, 5.2) for fields a config.json leaves out, as transformers would fill them.
constexpr int64_t kFlaDefaultHiddenSize = 2048;
constexpr int64_t kFlaDefaultLayers = 24;
constexpr int64_t kFlaDefaultHiddenRatio = 4;
constexpr int64_t kFlaDefaultVocabSize = 32000;
constexpr double kFlaDefaultNormEps = 1e-6;
constexpr double kFlaDefaultInitializerRange = 0.02;

const char* torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    default: break;
  }
  throw Error(std::string("Hugging Face export: dtype ") + dtype_name(dtype) + " is not offered (use fp32 or bf16)");
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HGRN_CHECK(in, "cannot open ", path, ": ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::vector<const Tensor*> match_params_to_specs(const std::vector<ParamSpec>& specs, const NamedTensors& tensors,
                                                 const std::string& what) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, tensor] : tensors)
    HGRN_CHECK(by_name.emplace(name, &tensor).second, what, ": tensor ", name, " appears twice");
  std::vector<std::string> missing, unexpected;
  std::set<std::string> expected;
  for (const ParamSpec& spec : specs) {
    expected.insert(spec.name);
    if (!by_name.count(spec.name)) missing.push_back(spec.name);
  }
  for (const auto& entry : by_name)
    if (!expected.count(entry.first)) unexpected.push_back(entry.first);
  if (!missing.empty() || !unexpected.empty()) {
    std::string message = what + " do not match the parameter list of the config:";
    if (!missing.empty()) message += " missing " + join(missing) + ";";
    if (!unexpected.empty()) message += " unexpected " + join(unexpected) + ";";
    message.pop_back();
    throw Error(message);
  }
  std::vector<const Tensor*> ordered;
  for (const ParamSpec& spec : specs) {
    const Tensor* tensor = by_name.at(spec.name);
    HGRN_CHECK(tensor->defined(), what, ": tensor ", spec.name, " is undefined");
    HGRN_CHECK(tensor->shape() == spec.shape, what, ": tensor ", spec.name, " has shape ", shape_str(tensor->shape()),
               ", expected ", shape_str(spec.shape));
    ordered.push_back(tensor);
  }
  return ordered;
}

std::string hf_config_json(const ModelConfig& config, DType dtype, std::optional<int64_t> eos_token_id) {
  json c = json::object();
  c["hidden_size"] = config.hidden_size;
  c["num_hidden_layers"] = config.num_hidden_layers;
  model_family(config.type).write_hf_config(config, c);
  c["vocab_size"] = config.vocab_size;
  c["hidden_ratio"] = config.hidden_ratio;
  c["intermediate_size"] = config.mlp_size();
  if (model_family(config.type).has_lower_bounds()) c["use_lower_bound"] = config.use_lower_bound;
  c["norm_eps"] = config.norm_eps;
  c["tie_word_embeddings"] = config.tie_word_embeddings;
  c["initializer_range"] = config.initializer_range;
  c["attn_mode"] = config.attn_mode;
  // What hgrn's architecture is, in the fla config's words: no short convolutions, SwiGLU MLP, RMSNorms with weights,
  // no hybrid softmax-attention layers.
  c["use_short_conv"] = false;
  c["conv_size"] = 4;
  c["hidden_act"] = "swish";
  c["max_position_embeddings"] = 2048;
  c["elementwise_affine"] = true;
  c["attn"] = nullptr;
  c["attnres_block_size"] = nullptr;
  c["use_cache"] = true;
  c["pad_token_id"] = nullptr;
  c["bos_token_id"] = eos_token_id ? json(*eos_token_id) : json(nullptr);
  c["eos_token_id"] = eos_token_id ? json(*eos_token_id) : json(nullptr);
  // fla's fused kernels: training-time choices of the loading side, recorded at HGRN2Config's defaults.
  c["fuse_norm"] = true;
  c["fuse_swiglu"] = true;
  c["fuse_cross_entropy"] = true;
  c["fuse_linear_cross_entropy"] = false;
  c["use_l2warp"] = false;
  c["torch_dtype"] = torch_dtype_name(dtype);
  c["transformers_version"] = kTransformersVersion;
  return c.dump(2) + "\n";
}

void require_hf_form(const ModelConfig& config, const std::string& out_dir) {
  const std::string refusal = model_family(config.type).hf_export_refusal(config);
  HGRN_CHECK(refusal.empty(), "Hugging Face export to ", out_dir, ": ", refusal);
}

void write_hf_files(const ModelConfig& config, const NamedTensors& params, const std::string& dir, DType dtype,
                    int64_t shard_bytes, std::optional<int64_t> eos_token_id) {
  require_hf_form(config, dir);
  torch_dtype_name(dtype);  // refuses dtypes other than F32 and BF16 before anything is written
  const std::vector<ParamSpec> specs = model_param_specs(config);
  const std::vector<const Tensor*> ordered = match_params_to_specs(specs, params, "the parameters to export to " + dir);
  NamedTensors converted;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor& tensor = *ordered[i];
    HGRN_CHECK(dtype_is_float(tensor.dtype()), "Hugging Face export to ", dir, ": parameter ", specs[i].name,
               " must be a floating-point tensor, got ", dtype_name(tensor.dtype()));
    converted.emplace_back(specs[i].name, tensor.dtype() == dtype ? tensor : tensor.to(dtype));
  }
  write_safetensors_model(dir, converted, shard_bytes);
  write_file_atomically((fs::path(dir) / kConfigFile).string(), hf_config_json(config, dtype, eos_token_id));
}

OutputKind hf_export_kind() {
  return {std::string("a Hugging Face export (a directory with ") + kConfigFile + " and " + kSafetensorsSingleFile +
              " or " + kSafetensorsIndexFile + ")",
          [](const std::string& path) {
            const fs::path dir(path);
            std::error_code error;
            return fs::is_directory(dir, error) && fs::is_regular_file(dir / kConfigFile, error) &&
                   (fs::is_regular_file(dir / kSafetensorsSingleFile, error) ||
                    fs::is_regular_file(dir / kSafetensorsIndexFile, error));
          }};
}

void export_hf(const ModelConfig& config, const NamedTensors& params, const std::string& out_dir, DType dtype,
               int64_t shard_bytes, bool overwrite) {
  require_hf_form(config, out_dir);
  publish_atomically(out_dir, /*is_directory=*/true, overwrite, hf_export_kind(), [&](const std::string& temp_dir) {
    write_hf_files(config, params, temp_dir, dtype, shard_bytes);
  });
}

ModelConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfigFile).string();
  HGRN_CHECK(fs::exists(path), "no ", kConfigFile, " in ", dir, ": expected a Hugging Face model directory");
  json root;
  try {
    root = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  }
  HGRN_CHECK(root.is_object(), path, ": expected a JSON object, got a ", root.type_name());
  const HfConfigReader c(root, path);

  const std::string model_type = c.string("model_type", "");
  std::string known;
  for (const std::string& type : model_type_names()) {
    if (type == model_type) break;
    known += (known.empty() ? "\"" : ", \"") + type + "\" (fla's " + model_family(type).hf_architecture() + ")";
    if (type == model_type_names().back())
      c.fail("model_type", "expected one of " + known + ", got \"" + model_type + "\"");
  }
  const ModelFamily& family = model_family(model_type);
  if (c.boolean("use_short_conv", false))
    c.fail("use_short_conv", "hgrn's models have no short convolutions; a model trained with them cannot be imported");
  if (c.has_non_null("attn"))
    c.fail("attn", "hybrid softmax-attention layers are not part of hgrn's models; expected null");
  if (c.has_non_null("attnres_block_size"))
    c.fail("attnres_block_size", "attention residual blocks are not part of hgrn's models; expected null");
  if (!c.boolean("elementwise_affine", true))
    c.fail("elementwise_affine", "hgrn's output norm always has a weight (g_norm.weight); expected true");
  const std::string act = c.string("hidden_act", "swish");
  if (act != "swish" && act != "silu") c.fail("hidden_act", "expected \"swish\" (SwiGLU MLP), got \"" + act + "\"");

  ModelConfig m;
  m.hidden_size = c.integer("hidden_size", kFlaDefaultHiddenSize);
  m.num_hidden_layers = c.integer("num_hidden_layers", kFlaDefaultLayers);
  m.vocab_size = c.integer("vocab_size", kFlaDefaultVocabSize);
  // fla's MLP falls back to 4 when hidden_ratio is null.
  m.hidden_ratio = c.optional_int("hidden_ratio", kFlaDefaultHiddenRatio).value_or(kFlaDefaultHiddenRatio);
  m.intermediate_size = c.optional_int("intermediate_size", std::nullopt);
  m.use_lower_bound = c.boolean("use_lower_bound", true);
  m.norm_eps = c.number("norm_eps", kFlaDefaultNormEps);
  m.tie_word_embeddings = c.boolean("tie_word_embeddings", false);
  m.initializer_range = c.number("initializer_range", kFlaDefaultInitializerRange);
  // HGRNConfig's default is fused_recurrent, HGRN2Config's chunk: the same function either way (config.h).
  m.attn_mode = c.string("attn_mode", "chunk");
  // fused_chunk is another tiling of the same chunkwise recurrence; hgrn's chunk path computes the same function.
  if (m.attn_mode == "fused_chunk") m.attn_mode = "chunk";

  c.require_positive("hidden_size", m.hidden_size);
  c.require_positive("num_hidden_layers", m.num_hidden_layers);
  c.require_positive("vocab_size", m.vocab_size);
  c.require_positive("hidden_ratio", m.hidden_ratio);
  if (m.intermediate_size) c.require_positive("intermediate_size", *m.intermediate_size);
  family.read_hf_config(c, m);
  if (!(m.norm_eps > 0)) c.fail("norm_eps", "expected a positive number, got " + std::to_string(m.norm_eps));
  if (!(m.initializer_range > 0))
    c.fail("initializer_range", "expected a positive number, got " + std::to_string(m.initializer_range));
  if (m.attn_mode != "chunk" && m.attn_mode != "fused_recurrent")
    c.fail("attn_mode", "expected \"chunk\", \"fused_chunk\" or \"fused_recurrent\", got \"" + m.attn_mode + "\"");
  return m;
}

NamedTensors read_hf_weights(const std::string& dir, const ModelConfig& config) {
  NamedTensors loaded = read_safetensors_model(dir);
  const auto find = [&](const std::string& name) -> const Tensor* {
    for (const auto& entry : loaded)
      if (entry.first == name) return &entry.second;
    return nullptr;
  };
  const Tensor* head = find("lm_head.weight");
  const Tensor* embeddings = find("model.embeddings.weight");
  if (config.tie_word_embeddings && head && embeddings) {
    const bool same = head->dtype() == embeddings->dtype() && head->shape() == embeddings->shape() &&
                      std::memcmp(head->raw_data(), embeddings->raw_data(), head->nbytes()) == 0;
    HGRN_CHECK(same, "the weights in ", dir, " hold an lm_head.weight that differs from model.embeddings.weight, ",
               "but config.json says tie_word_embeddings = true (one of the two is wrong)");
    std::erase_if(loaded, [](const auto& entry) { return entry.first == "lm_head.weight"; });
  }

  const std::vector<ParamSpec> specs = model_param_specs(config);
  const std::vector<const Tensor*> ordered = match_params_to_specs(specs, loaded, "the weights in " + dir);
  NamedTensors params;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Tensor& tensor = *ordered[i];
    HGRN_CHECK(dtype_is_float(tensor.dtype()), "the weights in ", dir, ": tensor ", specs[i].name, " has dtype ",
               safetensors_dtype_name(tensor.dtype()), ", expected a floating-point type (F32 or BF16)");
    params.emplace_back(specs[i].name, tensor.dtype() == DType::F32 ? tensor : tensor.to(DType::F32));
  }
  return params;
}

}  // namespace hgrn
