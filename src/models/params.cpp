// params.cpp: the fla *ForCausalLM state-dict layout shared by the HGRN family (hgrn-spec.md sections 4 and 5.3);
// each member adds its token mixer's tensors.
#include "models/params.h"

#include "models/registry.h"

namespace hgrn {

const char* param_group_name(ParamGroup group) {
  switch (group) {
    case ParamGroup::Embedding: return "embedding";
    case ParamGroup::LowerBound: return "lower_bounds";
    case ParamGroup::Norm: return "norm";
    case ParamGroup::Mixer: return "token_mixer";
    case ParamGroup::MixerVector: return "token_mixer_vectors";
    case ParamGroup::Mlp: return "mlp";
    case ParamGroup::LmHead: return "lm_head";
  }
  return "?";
}

std::vector<ParamSpec> model_param_specs(const ModelConfig& c) {
  const ModelFamily& family = model_family(c.type);
  const int64_t D = c.hidden_size, I = c.mlp_size();
  const std::vector<ParamSpec> mixer = family.mixer_param_specs(c);
  std::vector<ParamSpec> specs;
  specs.push_back({"model.embeddings.weight", {c.vocab_size, D}, ParamGroup::Embedding, ParamInit::Normal});
  // Zeros, as fla: softmax over layers is shift-invariant, so this gives gamma_l = l / L at initialisation.
  if (lower_bounded(c))
    specs.push_back({"model.lower_bounds", {c.num_hidden_layers, family.gate_width(c)}, ParamGroup::LowerBound,
                     ParamInit::Zeros});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", {D}, ParamGroup::Norm, ParamInit::Ones});
    for (ParamSpec spec : mixer) {
      spec.name = p + "attn." + spec.name;
      specs.push_back(std::move(spec));
    }
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
