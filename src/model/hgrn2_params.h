// hgrn2_params.h: the parameter list of an HGRN2 causal LM (fla names, shapes, group and initialiser), the one
// place that says which tensors the model has. The model, `hgrn info`, the optimiser's groups and export use it.
#pragma once
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"

namespace hgrn {

enum class ParamGroup { Embedding, LowerBound, Norm, Mixer, Mlp, LmHead };
const char* param_group_name(ParamGroup group);

enum class ParamInit { Normal, Ones, Zeros };  // Normal: N(0, initializer_range)

struct ParamSpec {
  std::string name;  // the Hugging Face / fla state-dict key, e.g. model.layers.0.attn.q_proj.weight
  Shape shape;
  ParamGroup group;
  ParamInit init;
  // Allocated right after the previous parameter, in one buffer with it (same trailing shape): the q/f/i
  // projections and the MLP's gate/up, which one GEMM each reads together (ops/linear.h: linear_columns). Checkpoints and exports still see
  // separate tensors.
  bool adjacent_to_previous = false;
};

// In the order the model registers them (which is also the order of the RNG draws at initialisation).
std::vector<ParamSpec> hgrn2_param_specs(const ModelConfig& config);

}  // namespace hgrn
