// flops.cpp: the HGRN2 cost model behind `hgrn info`: parameter counts (from hgrn2_param_specs), FLOPs per token
// and memory estimates for training, counted from the model structure of hgrn-spec.md sections 1, 4 and 7.
#include "model/flops.h"

#include <algorithm>

#include "model/hgrn2_params.h"

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
double recurrence_flops_per_token(double H, double K, double V, double C) {
  return 2.0 * H * K * V * 2.0 + 2.0 * C * H * (K + V);
}

ModelCost hgrn2_cost(const ModelConfig& config, int64_t seq_len, int64_t bytes_per_activation) {
  ModelCost cost{};
  const std::vector<ParamSpec> specs = hgrn2_param_specs(config);

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
  const double H = static_cast<double>(config.heads());
  const double K = static_cast<double>(config.key_dim());
  const double V = static_cast<double>(config.value_dim());
  const double F = H * K;  // forget / query width
  const double I = static_cast<double>(config.mlp_size());
  const double vocab = static_cast<double>(config.vocab_size);
  const int64_t chunk = gla_chunk_size(seq_len);
  const double C = static_cast<double>(chunk);
  const double num_chunks = static_cast<double>((seq_len + chunk - 1) / chunk);

  // The recurrence per token and layer in the chunkwise form (spec 7.2, recurrence_flops_per_token). Other
  // element-wise work (norms, SiLU, the loss's softmax) is O(D) per token and left out: small next to the O(D²)
  // projections.
  const double recurrence_flops = recurrence_flops_per_token(H, K, V, C);
  cost.flops_per_token_fwd = 2.0 * static_cast<double>(matmul_params) + L * recurrence_flops;
  // The backward computes two products per forward product (input gradient and weight gradient): 3x in all.
  // The chunk backward also recomputes the states, which this convention leaves out.
  cost.flops_per_token_train = 3.0 * cost.flops_per_token_fwd;

  // Recurrent state per sequence and layer: the fp32 final state H·K·V, plus the state entering every chunk,
  // S^(c) (num_chunks·H·K·V), which the forward stores in the activation dtype for the backward.
  const double b = static_cast<double>(bytes_per_activation);
  cost.state_bytes_per_sequence = L * (H * K * V * 4.0 + num_chunks * H * K * V * b);

  // Activations the backward needs, per token. Per layer, in the activation dtype (b bytes each):
  //   D: the block input h (attn_norm backward)           D: a = attn_norm(h) (input of q/f/i projections)
  //   F: q̂ = a·Wqᵀ (SiLU backward)                        F: q = silu(q̂) (recurrence input)
  //   F: f̂ = a·Wfᵀ (gate and lower-bound backward)         F: k = 1 − exp(g) (recurrence input)
  //   D: i = a·Wiᵀ (recurrence input v)                    D: o, the recurrence output (g_norm backward)
  //   D: g_norm(o) (input of o_proj)                        D: h after the mixer residual (mlp_norm backward)
  //   D: m = mlp_norm(h) (input of gate/up projections)     I: gate pre-activation, I: up, I: silu(gate)·up (down_proj input)
  // and in fp32: F for the log-decay g, H·C for the intra-chunk scores A, and 3 reciprocal RMS values (three norms).
  // After the layers: the final norm's input and output (2·D, b bytes), its reciprocal RMS, and the fp32 logits
  // (vocab) that the cross-entropy backward turns into the gradient. Token ids and targets are left out (8 bytes).
  const double per_layer = b * (7.0 * D + 4.0 * F + 3.0 * I) + 4.0 * (F + H * C + 3.0);
  const double after_layers = b * 2.0 * D + 4.0 + 4.0 * vocab;
  cost.activation_bytes_per_token = L * per_layer + after_layers;
  return cost;
}

}  // namespace hgrn
