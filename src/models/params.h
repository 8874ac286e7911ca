// params.h: a model's parameter list (fla names, shapes, group and initialiser), the one place that says which
// tensors a model has. The model, `hgrn info`, the optimiser's groups, checkpoints and export use it.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"

namespace hgrn {

// MixerVector: a token mixer's biases and per-channel angles (no weight decay, no GEMM).
enum class ParamGroup { Embedding, LowerBound, Norm, Mixer, MixerVector, Mlp, LmHead };
const char* param_group_name(ParamGroup group);

// Normal: N(0, initializer_range). RotaryAngles (a vector of n): θ_j = 10000^(−2j/n), RoPE-like frequencies.
enum class ParamInit { Normal, Ones, Zeros, RotaryAngles };

struct ParamSpec {
  std::string name;  // the Hugging Face / fla state-dict key, e.g. model.layers.0.attn.q_proj.weight
  Shape shape;
  ParamGroup group;
  ParamInit init;
  // Allocated right after the previous parameter, in one buffer with it (same trailing shape): projections that one
  // GEMM reads together (ops/linear.h: linear_columns). Checkpoints and exports still see separate tensors.
  bool adjacent_to_previous = false;
};

// Every parameter of the model `config` describes, in the order the model registers them (which is also the order of
// the RNG draws at initialisation): the embedding, the lower bounds, per layer attn_norm, the token mixer's own
// (ModelFamily::mixer_param_specs, under "attn."), mlp_norm and the gated MLP, then the final norm and the lm_head.
std::vector<ParamSpec> model_param_specs(const ModelConfig& config);

}  // namespace hgrn
