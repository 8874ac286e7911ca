// linear_attention.h: what GLA and RetNet (models/gla/, models/retnet/) share: fla's head layout (num_heads heads,
// keys hidden_size · expand_k and values hidden_size · expand_v wide in all) with its checks, config keys, config.json
// fields and signature, the layer's parameters around the member's own, and the mixer's output,
// o_proj(RMSNorm_per_head(o) ⊙ silu(g)) (fla's FusedRMSNormGated, then o_proj).
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/autograd.h"
#include "models/params.h"

namespace hgrn {

class HfConfigReader;

// A member's fla defaults for the layout keys a config leaves null.
struct HeadDefaults {
  int64_t num_heads;
  double expand_k, expand_v;
};

struct HeadLayout {
  int64_t heads = 0, key_dim = 0, value_dim = 0;  // H, and K and V per head
  int64_t keys() const { return heads * key_dim; }
  int64_t values() const { return heads * value_dim; }
  // The GLA recurrence's FLOPs per token at this sequence length (gla_recurrence_flops_per_token, its chunk size).
  double recurrence_flops_per_token(int64_t seq_len) const;
  double query_scale() const;  // K^-1/2, as fla's chunk_gla and chunk_retention scale q
};

// The layout of a config that validate_head_layout accepted.
HeadLayout head_layout(const ModelConfig& config, const HeadDefaults& defaults);
// model.num_heads positive; hidden_size · expand_k and · expand_v positive integers (as fla asserts) that num_heads
// divides; rotary_keys: the key width per head even and at most 256 (fla's rotary embedding rotates pairs and takes
// heads up to 256 wide).
void validate_head_layout(const ModelConfig& config, const HeadDefaults& defaults, bool rotary_keys,
                          const ConfigChecker& checker);
// ModelFamily::own_keys of these members: the layout's keys and keep_recurrence_states.
std::vector<std::string> linear_attention_keys();
// ModelFamily::signature: the member's type and shapes.
std::string linear_attention_signature(const std::string& type, const ModelConfig& config,
                                       const HeadDefaults& defaults);
// ModelFamily::mixer_param_specs: q_proj, k_proj, v_proj and g_proj (adjacent: one GEMM), then the member's own
// `gate` parameters, o_proj and g_norm_swish_gate.
std::vector<ParamSpec> linear_attention_param_specs(const ModelConfig& config, const HeadDefaults& defaults,
                                                    const std::vector<ParamSpec>& gate);
// config.json: num_heads, expand_k, expand_v (resolved) and num_kv_heads (null: no grouped keys), as fla's configs.
void write_head_layout(const ModelConfig& config, const HeadDefaults& defaults, nlohmann::json& out);
// Reads them back, refusing what hgrn's mixers do not have (grouped keys, a feature map, no output gate), layouts
// validate_head_layout would refuse, and the settings under which fla names the output norm otherwise.
void read_head_layout(const HfConfigReader& in, const HeadDefaults& defaults, bool rotary_keys, ModelConfig& config);

// residual + o_proj(RMSNorm(o) ⊙ silu(g)), the RMSNorm over each head's value_dim features with the shared weight
// norm_weight [value_dim] and `eps`: swiglu_linear with o normalised per head (UpNorm: the norm, the gate, the
// product and o_proj in one op; the norm's output is never stored). o: [B, T, H·V] contiguous; g: [B, T, H·V] (a
// column block of the fused projection). `memory` decides whether the backward recomputes the gated product (under
// recompute_elementwise).
Var gated_head_norm_output(Tape& tape, const Var& o, const Var& g, const Var& norm_weight, const Var& o_proj,
                           int64_t value_dim, double eps, const ModelMemoryConfig& memory, const Var& residual);

}  // namespace hgrn
