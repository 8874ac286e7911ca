// cost.h: what a model costs: parameters by group, FLOPs per token (forward and training step), and an estimate of
// the peak memory of a training step. Used by `hgrn info`, `hgrn bench` and the trainer's log.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "models/registry.h"

namespace hgrn {

struct ModelCost {
  int64_t params_total;
  std::vector<std::pair<std::string, int64_t>> params_by_group;  // param_group_name order of first appearance
  double flops_per_token_fwd;
  double flops_per_token_train;        // forward + backward = 3 x forward
};

// The chunk size fla's chunk_gla uses for a sequence of seq_len tokens: min(64, max(16, next_pow2(seq_len))).
int64_t gla_chunk_size(int64_t seq_len);

// FLOPs of the GLA recurrence per token and layer in the chunkwise form (cost.cpp explains the count), for H heads
// of key width K and value width V in chunks of C steps; the backward is counted as 2x this.
double gla_recurrence_flops_per_token(double H, double K, double V, double C);

ModelCost model_cost(const ModelConfig& config, int64_t seq_len);

// What a token mixer on the chunkwise GLA recurrence (HGRN2, GLA, RetNet) keeps around it that differs by member.
struct GlaMixerTensors {
  int64_t heads = 0, key_dim = 0, value_dim = 0;  // H, K and V per head
  double projection_width = 0;     // elements per token kept from the input projections (outputs and copies)
  bool own_query_key = true;       // q and k are tensors of their own, not columns of the projections' output
  bool key_wide_gate = false;      // a gate per key channel (fp32 on the GPU), kept or recomputed as q and k are
  double gate_backward_bytes = 0;  // bytes per key channel and token that the backward adds for the gate
  int64_t normed_outputs = 1;      // value-wide tensors made from o, kept only without recompute_elementwise
};
// ModelFamily::mixer_memory of such a mixer (cost.cpp lists what it counts).
MixerMemory gla_mixer_memory(const ModelConfig& config, const GlaMixerTensors& tensors, int64_t layer,
                             int64_t seq_len, const MemoryTarget& target);

// The peak memory of one training step (forward, backward, update) of a micro-batch, in bytes, on the path the step
// runs (models/registry.h: MemoryTarget), under the config's model.memory knobs: what is persistent, plus what the
// forward keeps for the backward, plus the largest transient around the start of the backward, where the peak lies.
// On the GPU it estimates the allocator's "peak in use" (`hgrn bench`); on the CPU the tensors' share of the process.
struct TrainingMemory {
  double states = 0;             // recurrent states kept for the backward: final states and per-chunk states
  double activations = 0;        // other tensors kept from the forward to the backward
  double weights_and_optimizer = 0;  // fp32 weights and AdamW moments, and the gradients that exist at the peak
  double weight_copies = 0;      // GPU bf16: the matmul weights' bf16 copies (fp8: the head's, and the layers' FP8
                                 // codes kept through a step)
  double working_set = 0;        // the largest transient at the peak: the loss's chunked logits and fp32 gradient
                                 // sums, or the last layer's backward buffers
  std::string peak_at;           // where the peak lies: "the loss", "the last MLP's backward", ...
  double total() const { return states + activations + weights_and_optimizer + weight_copies + working_set; }
};
TrainingMemory training_memory(const ModelConfig& config, int64_t micro_batch, int64_t seq_len,
                               const MemoryTarget& target);
// The path the training config's device and precision select: the GPU for cuda, and for auto when the model has a
// GPU path (the estimate assumes the device the config asks for, not the machine it is printed on).
MemoryTarget memory_target(const Config& config);

}  // namespace hgrn
