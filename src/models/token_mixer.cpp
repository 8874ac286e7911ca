// token_mixer.cpp: the memory-policy helpers shared by the decoder and every token mixer, and the refusal of a fused
// decoding step by a mixer that has none.
#include "models/token_mixer.h"

#include "ops/rmsnorm.h"

namespace hgrn {

std::unique_ptr<FusedMixerStep> TokenMixer::make_fused_step(const FusedStepSetup&) const {
  throw Error(fused_step_refusal());
}

bool uses_chunk_form(const ModelConfig& config, int64_t seq_len) {
  return config.attn_mode == "chunk" && seq_len > 64;
}

bool recomputes_gates(const ModelMemoryConfig& memory, int64_t layer, int64_t num_layers) {
  return memory.recompute_elementwise &&
         (memory.recompute_gates || layer >= num_layers - memory.recompute_gates_layers);
}

ModelMemoryConfig layer_memory(const ModelMemoryConfig& memory, int64_t layer) {
  ModelMemoryConfig m = memory;
  m.recompute_elementwise = memory.recompute_elementwise && layer >= memory.keep_elementwise_layers;
  return m;
}

void recompute_in_backward(Tape& tape, const ModelMemoryConfig& memory, const std::vector<Var>& vars,
                           RematerializeFn values) {
  if (memory.recompute_elementwise) rematerialize(tape, vars, std::move(values));
}

// normed = RMSNorm(input) ⊙ weight is not kept for its consumers' backward (under recompute_elementwise). Where only
// linears read it (read_early false), the norm's own backward, which reads input anyway, writes it again and the
// linears' weight gradients run there (release_until_producer_backward): no pass of its own. Where something reads
// it before that backward (a block replayed whole, memory.recompute; the MLP's gate and up recomputed from it,
// memory.recompute_mlp_projections), a forward recomputes it from input (the same bits) before the first consumer's
// backward.
void free_norm_output(Tape& tape, const ModelMemoryConfig& memory, const Var& normed, const Var& input,
                      const Var& weight, double eps, bool read_early) {
  if (!memory.recompute_elementwise) return;
  if (!read_early) {
    release_until_producer_backward(tape, normed);
    return;
  }
  recompute_in_backward(tape, memory, {normed}, [input, weight, eps](Tape& untaped) {
    return std::vector<Tensor>{rmsnorm(untaped, input, weight, eps)->value};
  });
}

}  // namespace hgrn
