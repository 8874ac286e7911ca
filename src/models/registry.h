// registry.h: the HGRN family's members behind one description each (ModelFamily), and the model factory. A member is
// a folder of its own (models/<type>/) holding its token mixer and its ModelFamily; adding one is those files plus
// one line in registry.cpp (docs/models.md).
#pragma once
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/rng.h"
#include "models/causal_lm.h"
#include "models/params.h"
#include "models/token_mixer.h"

namespace hgrn {

class HfConfigReader;

// What a token mixer costs per layer, beyond its projections' GEMMs (which models/cost.cpp counts from the
// parameter list).
struct MixerCost {
  double flops_per_token = 0;  // the recurrence's own arithmetic (forward)
};

// The path a training step runs, which decides what its forward keeps for the backward: the GPU's kernels (fused
// ops, bf16 or fp32 activations) or the CPU's op-by-op reference.
struct MemoryTarget {
  bool gpu = true;
  int64_t bytes_per_activation = 2;  // 2: bf16, 4: fp32
  bool fp8 = false;                  // training.precision fp8: the layers' matmul weights as FP8 codes (GPU)
};

// What one layer's token mixer holds in a training step, in bytes per sequence of seq_len tokens, under the
// config's model.memory knobs (models/cost.cpp adds the decoder's part and finds the step's peak).
struct MixerMemory {
  double states = 0;       // recurrent states kept for the backward: the final state and any per-chunk states
  double activations = 0;  // other tensors kept from the forward to the backward (the projections' outputs included)
  double replayed = 0;     // model.memory.recompute: what replaying the mixer for its backward holds (its input, the
                           // attn_norm output, and its output are the decoder's)
  double backward = 0;     // the most its backward holds at once beyond those: gradient buffers, scratch and
                           // tensors recomputed for it
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string type() const = 0;             // model.type and fla's model_type, e.g. "hgrn2"
  virtual std::string display_name() const = 0;     // e.g. "HGRN2"
  virtual std::string hf_architecture() const = 0;  // fla's class, e.g. "HGRN2ForCausalLM"
  // model.* keys this member has and not every other does (several may list one): set in a config of a type that
  // does not list it, they are refused.
  virtual std::vector<std::string> own_keys() const = 0;
  // This member's checks of the model section (sizes that must divide, ...), reported through `checker`.
  virtual void validate(const ModelConfig& config, const ConfigChecker& checker) const = 0;
  // fla's hidden_ratio default in this member's config class: model.hidden_ratio where a config leaves it unset.
  virtual int64_t default_hidden_ratio() const { return 4; }
  // The token mixer's shape in a few words for `hgrn info`, e.g. "8 heads (key 128, value 128)".
  virtual std::string mixer_summary(const ModelConfig& config) const = 0;
  // Whether the member's forget gates take HGRN's layer-wise lower bounds (model.use_lower_bound, the
  // model.lower_bounds parameter); GLA and RetNet have none.
  virtual bool has_lower_bounds() const { return true; }
  // The width of the forget gate, and so of each row of model.lower_bounds.
  virtual int64_t gate_width(const ModelConfig& config) const = 0;
  // One layer's token-mixer parameters, named below "model.layers.N.attn.", in registration order.
  virtual std::vector<ParamSpec> mixer_param_specs(const ModelConfig& config) const = 0;
  virtual std::unique_ptr<TokenMixer> make_mixer(const ModelConfig& config) const = 0;
  virtual MixerCost mixer_cost(const ModelConfig& config, int64_t seq_len) const = 0;
  virtual MixerMemory mixer_memory(const ModelConfig& config, int64_t layer, int64_t seq_len,
                                   const MemoryTarget& target) const = 0;
  // What a checkpoint must match to be resumed: the member and its shapes.
  virtual std::string signature(const ModelConfig& config) const = 0;
  // The member's own config.json fields (model_type, architectures and its widths); the shared ones are written and
  // read by io/hf_export.cpp.
  virtual void write_hf_config(const ModelConfig& config, nlohmann::json& out) const = 0;
  virtual void read_hf_config(const HfConfigReader& in, ModelConfig& config) const = 0;
  // Why this model has no Hugging Face form (fla has no class for it), or empty: Hugging Face export refuses it with
  // this reason, while the HDF5 export (which stores the same config fields) takes it.
  virtual std::string hf_export_refusal(const ModelConfig&) const { return {}; }
  // Why this model cannot train on the GPU (empty: it can). training.device: cuda is then refused, and auto picks
  // the CPU.
  virtual std::string cuda_refusal(const ModelConfig&) const { return {}; }
};

// The registered model.type names, in registration order.
std::vector<std::string> model_type_names();
// The member of that model.type; throws hgrn::Error listing the known types.
const ModelFamily& model_family(const std::string& type);
// A model of config's member, every parameter created in `dtype` and initialised as fla does: N(0, range) for
// projections and embeddings (drawn in model_param_specs order from `init_rng`), ones for norms, zeros for lower bounds.
std::unique_ptr<CausalLM> create_model(const ModelConfig& config, Rng& init_rng, DType dtype = DType::F32);
// Whether config's model has lower bounds: model.use_lower_bound on a member that has them.
bool lower_bounded(const ModelConfig& config);
// What a checkpoint must match to be resumed: the member's shapes and the master weights' precision.
std::string model_signature(const ModelConfig& config);

}  // namespace hgrn
