// hf_export.h: a model's weights to and from a Hugging Face model directory in fla's *ForCausalLM layout
// (hgrn-spec.md section 5): config.json (HGRN2Config, model_type "hgrn2") plus model.safetensors, or shards and
// model.safetensors.index.json for large models. Such a directory loads with
//   import fla; transformers.AutoModelForCausalLM.from_pretrained(dir)
// and hgrn reads one back (from fla or from hgrn) with read_hf_config + read_hf_weights.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"
#include "io/atomic_write.h"
#include "io/safetensors.h"
#include "models/params.h"

namespace hgrn {

// The transformers release whose config.json layout this exporter follows (loaders only record the field).
inline constexpr const char* kTransformersVersion = "4.48.0";

// Matches named tensors to the spec list (model_param_specs): the same names, each once (missing and unexpected ones
// are listed in full, so one message says everything that is wrong), and the same shapes. Returns the tensors in
// spec order. Throws hgrn::Error that starts with `what` (the source, e.g. "the weights in DIR").
std::vector<const Tensor*> match_params_to_specs(const std::vector<ParamSpec>& specs, const NamedTensors& tensors,
                                                 const std::string& what);

// config.json for this model: every HGRN2Config field of spec section 5.1, at hgrn's resolved values (num_heads,
// expand_ratio and intermediate_size resolved as fla does), torch_dtype naming `dtype` (F32 or BF16). Pretty-printed
// with a trailing newline. bos_token_id and eos_token_id are `eos_token_id`, the end-of-document token of the
// tokenizer the model was trained with (training_eos_id: documents follow it, so it also starts one), or null where
// there is none (MQAR) or it is not known.
std::string hf_config_json(const ModelConfig& config, DType dtype, std::optional<int64_t> eos_token_id = std::nullopt);

// Throws hgrn::Error naming out_dir when the model has no Hugging Face form (ModelFamily::hf_export_refusal): called
// before anything is written by export_hf and the CLI, and again by write_hf_files.
void require_hf_form(const ModelConfig& config, const std::string& out_dir);

// Writes config.json and the weights (cast from fp32 to `dtype`, F32 or BF16) into the existing, empty directory
// `dir`, sharded when they exceed shard_bytes. `params` are hgrn's parameters by fla name (fp32); they must match
// model_param_specs(config) exactly in names and shapes (a tied model has no lm_head.weight). Not atomic by itself:
// export_hf wraps it; the CLI also uses it to add files to the same directory before it is published.
void write_hf_files(const ModelConfig& config, const NamedTensors& params, const std::string& dir, DType dtype,
                    int64_t shard_bytes, std::optional<int64_t> eos_token_id = std::nullopt);

// An earlier Hugging Face export, the only thing `export --force` replaces: a directory holding config.json and
// model.safetensors or model.safetensors.index.json.
OutputKind hf_export_kind();

// write_hf_files into out_dir, atomically: everything goes to out_dir.tmp-<pid>, which is renamed to out_dir only
// once complete. An existing non-empty out_dir is refused unless `overwrite`, and then replaced only after the new
// directory is complete. Throws hgrn::Error naming out_dir and what failed.
void export_hf(const ModelConfig& config, const NamedTensors& params, const std::string& out_dir, DType dtype,
               int64_t shard_bytes = kDefaultShardBytes, bool overwrite = false);

// Reads dir/config.json of an fla HGRN2 model into hgrn's ModelConfig (absent fields take HGRN2Config's defaults).
// Refuses what hgrn cannot run: model_type other than "hgrn2", use_short_conv, hybrid attention layers (attn),
// attnres_block_size, elementwise_affine false, an activation other than swish. Throws hgrn::Error naming the file
// and field.
ModelConfig read_hf_config(const std::string& dir);

// Reads the weights of dir (single file or sharded; fp32 or bf16, converted to fp32) and checks them against
// model_param_specs(config): the result is in spec order. Missing or extra tensors throw hgrn::Error listing all of
// them; a wrong shape names the tensor and both shapes. A tied model's lm_head.weight is accepted only as an exact
// copy of the embeddings (some writers keep it) and then dropped.
NamedTensors read_hf_weights(const std::string& dir, const ModelConfig& config);

}  // namespace hgrn
