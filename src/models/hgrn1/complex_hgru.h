// complex_hgru.h: the HGRN1 paper's complex-valued HGRU (Qin et al., NeurIPS 2023, section 3), selected by
// model.complex: true for model.type hgrn. fla has no such model, so it has no fla names: its own state-dict layout
// is below, and it exports to HDF5 only.
#pragma once
#include <memory>
#include <vector>

#include "config/config.h"
#include "models/params.h"
#include "models/registry.h"
#include "models/token_mixer.h"

namespace hgrn {

// One layer's parameters (below model.layers.N.attn.), d = hidden_size · expand_ratio:
// cr_proj, ci_proj, f_proj [d, D] and g_proj [2d, D] weights (one GEMM: adjacent), their biases, theta [d],
// out_norm.{weight,bias} [2d], o_proj.weight [D, 2d] and o_proj.bias [D].
std::vector<ParamSpec> complex_hgru_param_specs(const ModelConfig& config);
std::unique_ptr<TokenMixer> make_complex_hgru_mixer(const ModelConfig& config);
MixerCost complex_hgru_cost(const ModelConfig& config);
MixerMemory complex_hgru_memory(const ModelConfig& config, int64_t seq_len, const MemoryTarget& target);

}  // namespace hgrn
