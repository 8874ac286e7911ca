// hgrn2_params.cpp: the HGRN2ForCausalLM state-dict layout of hgrn-spec.md section 5.3 (use_short_conv = False).
#include "model/hgrn2_params.h"

namespace hgrn {

const char* param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::Embedding: return "embedding";
    case ParamGroup::LowerBound: return "lower_bounds";
    case ParamGroup::Norm: return "norm";
    case ParamGroup::Mixer: return "token_mixer";
    case ParamGroup::Mlp: return "mlp";
    case ParamGroup::LmHead: return "lm_head";
  }
  return "?";
}

std::vector<ParamSpec> hgrn2_param_specs(const ModelConfig& c) {
  const int64_t D = c.hidden_size, F = c.heads() * c.key_dim(), I = c.mlp_size();
  std::vector<ParamSpec> specs;
  specs.push_back({"model.embeddings.weight", {c.vocab_size, D}, ParamGroup::Embedding, ParamInit::Normal});
  // Zeros, as fla: softmax over layers is shift-invariant, so this gives gamma_l = l / L at initialisation.
  if (c.use_lower_bound)
    specs.push_back({"model.lower_bounds", {c.num_hidden_layers, D}, ParamGroup::LowerBound, ParamInit::Zeros});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", {D}, ParamGroup::Norm, ParamInit::Ones});
    specs.push_back({p + "attn.q_proj.weight", {F, D}, ParamGroup::Mixer, ParamInit::Normal});
    specs.push_back({p + "attn.f_proj.weight", {F, D}, ParamGroup::Mixer, ParamInit::Normal, true});
    specs.push_back({p + "attn.i_proj.weight", {D, D}, ParamGroup::Mixer, ParamInit::Normal, true});
    specs.push_back({p + "attn.g_norm.weight", {D}, ParamGroup::Norm, ParamInit::Ones});
    specs.push_back({p + "attn.o_proj.weight", {D, D}, ParamGroup::Mixer, ParamInit::Normal});
    specs.push_back({p + "mlp_norm.weight", {D}, ParamGroup::Norm, ParamInit::Ones});
    specs.push_back({p + "mlp.gate_proj.weight", {I, D}, ParamGroup::Mlp, ParamInit::Normal});
    specs.push_back({p + "mlp.up_proj.weight", {I, D}, ParamGroup::Mlp, ParamInit::Normal, true});
    specs.push_back({p + "mlp.down_proj.weight", {D, I}, ParamGroup::Mlp, ParamInit::Normal});
  }
  specs.push_back({"model.norm.weight", {D}, ParamGroup::Norm, ParamInit::Ones});
  if (!c.tie_word_embeddings)
    specs.push_back({"lm_head.weight", {c.vocab_size, D}, ParamGroup::LmHead, ParamInit::Normal});
  return specs;
}

}  // namespace hgrn
