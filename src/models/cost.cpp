// cost.cpp: the cost model behind `hgrn info`: parameter counts (from model_param_specs), FLOPs per token and memory
// estimates for training, counted from the decoder's structure (hgrn-spec.md section 4) and the member's token mixer
// (ModelFamily::mixer_cost).
#include "models/cost.h"

#include <algorithm>

#include "models/params.h"
#include "models/registry.h"

namespace hgrn {

int64_t gla_chunk_size(int64_t seq_len) {
  int64_t pow2 = 1;
  while (pow2 < seq_len) pow2 *= 2;
  return std::min<int64_t>(64, std::max<int64_t>(16, pow2));
}

// Counting multiply-adds as 2 FLOPs:
//   state terms  2·H·K·V·2: the chunk's contribution Σ_t k̃_tᵀ v_t to the next state (2·K·V per token and head)
//                and the inter-chunk output (q_t ⊙ e^{G_t}) S (another 2·K·V);
//   intra-chunk  2·C·H·(K+V): the scores A = Q̃ K̃ᵀ (2·C·K per token and head) and A·V (2·C·V); counted over the
//                whole C×C block, an upper bound, because the kernels skip only the sub-blocks above the diagonal.
// Element-wise work (gates, exponentials, the decay of S) is O(H·K) per token and left out.
double gla_recurrence_flops_per_token(double H, double K, double V, double C) {
  return 2.0 * H * K * V * 2.0 + 2.0 * C * H * (K + V);
}

ModelCost model_cost(const ModelConfig& config, int64_t seq_len, int64_t bytes_per_activation) {
  ModelCost cost{};
  const std::vector<ParamSpec> specs = model_param_specs(config);

  // Parameters, and the ones that are the weight of a matmul: every projection and the lm_head. The embedding is a
  // row lookup (no FLOPs), the norms and lower bounds are element-wise. A tied lm_head still multiplies by the
  // embedding matrix, so then the embedding's count stands in for it.
  int64_t matmul_params = 0;
  int64_t embedding_params = 0;
  bool has_lm_head = false;
  for (const ParamSpec& spec : specs) {
    const int64_t count = shape_numel(spec.shape);
    cost.params_total += count;
    const std::string group = param_group_name(spec.group);
    auto it = std::find_if(cost.params_by_group.begin(), cost.params_by_group.end(),
                           [&](const auto& entry) { return entry.first == group; });
    if (it == cost.params_by_group.end())
      cost.params_by_group.emplace_back(group, count);
    else
      it->second += count;
    if (spec.group == ParamGroup::Mixer || spec.group == ParamGroup::Mlp || spec.group == ParamGroup::LmHead)
      matmul_params += count;
    if (spec.group == ParamGroup::LmHead) has_lm_head = true;
    if (spec.group == ParamGroup::Embedding) embedding_params += count;
  }
  if (!has_lm_head) matmul_params += embedding_params;

  const double L = static_cast<double>(config.num_hidden_layers);
  const double D = static_cast<double>(config.hidden_size);
  const double I = static_cast<double>(config.mlp_size());
  const double vocab = static_cast<double>(config.vocab_size);
  const MixerCost mixer = model_family(config.type).mixer_cost(config, seq_len, bytes_per_activation);

  // The token mixers' own arithmetic (the recurrence) per token and layer. Other element-wise work (norms, SiLU,
  // the loss's softmax) is O(D) per token and left out: small next to the O(D²) projections.
  cost.flops_per_token_fwd = 2.0 * static_cast<double>(matmul_params) + L * mixer.flops_per_token;
  // The backward computes two products per forward product (input gradient and weight gradient): 3x in all.
  // A chunk backward also recomputes the states, which this convention leaves out.
  cost.flops_per_token_train = 3.0 * cost.flops_per_token_fwd;
  cost.state_bytes_per_sequence = L * mixer.state_bytes_per_sequence;

  // Activations the backward needs, per token. Per layer, besides the mixer's own, in the activation dtype (b bytes
  // each): the block input h (attn_norm backward), a = attn_norm(h) (the mixer's input), h after the mixer residual
  // (mlp_norm backward), m = mlp_norm(h) (input of gate/up), and I each for the gate pre-activation, up and
  // silu(gate)·up (down_proj input); in fp32 3 reciprocal RMS values (three norms). After the layers: the final
  // norm's input and output (2·D, b bytes), its reciprocal RMS, and the fp32 logits (vocab) that the cross-entropy
  // backward turns into the gradient. Token ids and targets are left out (8 bytes).
  const double b = static_cast<double>(bytes_per_activation);
  const double per_layer = b * (4.0 * D + 3.0 * I) + 4.0 * 3.0 + mixer.activation_bytes_per_token;
  const double after_layers = b * 2.0 * D + 4.0 + 4.0 * vocab;
  cost.activation_bytes_per_token = L * per_layer + after_layers;
  return cost;
}

}  // namespace hgrn
