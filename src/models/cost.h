// cost.h: what a model costs: parameters by group, FLOPs per token (forward and training step), and
// estimates of the recurrent-state and activation memory of training. Used by `hgrn info` and the trainer's log.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace hgrn {

struct ModelCost {
  int64_t params_total;
  std::vector<std::pair<std::string, int64_t>> params_by_group;  // param_group_name order of first appearance
  double flops_per_token_fwd;
  double flops_per_token_train;        // forward + backward = 3 x forward
  double state_bytes_per_sequence;     // all layers: fp32 final state + the per-chunk states the chunk form keeps
  double activation_bytes_per_token;   // all layers: the tensors the backward needs, plus the loss's logits
};

// The chunk size fla's chunk_gla uses for a sequence of seq_len tokens: min(64, max(16, next_pow2(seq_len))).
int64_t gla_chunk_size(int64_t seq_len);

// FLOPs of the GLA recurrence per token and layer in the chunkwise form (cost.cpp explains the count), for H heads
// of key width K and value width V in chunks of C steps; the backward is counted as 2x this.
double gla_recurrence_flops_per_token(double H, double K, double V, double C);

// bytes_per_activation: 4 for fp32 training, 2 for bf16 (the fp32 tensors of the list in flops.cpp stay 4).
ModelCost model_cost(const ModelConfig& config, int64_t seq_len, int64_t bytes_per_activation);

}  // namespace hgrn
