// retnet.cpp: RetNet (fla's RetNetForCausalLM; Sun et al., "Retentive Network: A Successor to Transformer for Large
// Language Models", 2023): its token mixer, multi-scale retention — linear attention over rotary-embedded queries and
// keys with a fixed decay per head — on the chunkwise recurrence HGRN2 and GLA run (ops/gla_recurrence.h, with one
// constant log decay per head: its scalar-decay mode), and its description.
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/trace.h"
#include "io/hf_config_reader.h"
#include "models/cost.h"
#include "models/linear_attention.h"
#include "models/registry.h"
#include "ops/gla_recurrence.h"
#include "ops/linear.h"
#include "ops/rotary_embedding.h"

namespace hgrn {
namespace {

// RetNetConfig's defaults (fla/models/retnet/configuration_retnet.py).
constexpr HeadDefaults kRetNetDefaults{/*num_heads=*/8, /*expand_k=*/1.0, /*expand_v=*/2.0};
constexpr int64_t kRetNetHiddenRatio = 2;

// The log decay of head h, log γ_h = log(1 − 2^(−5−h)) (fla's chunk_retention), in T: fla forms it in fp32.
template <typename T>
T log_decay(int64_t head) {
  return std::log(T(1) - std::exp2(T(-5) - static_cast<T>(head)));
}

// MultiScaleRetention (fla/layers/multiscale_retention.py): q, k, v and the output gate g from one GEMM; q and k
// rotated (rotary embedding, positions from 0); per head S_t = γ_h S_{t−1} + k_tᵀ v_t, o_t = K^−½ q_t S_t; then
// o_proj(RMSNorm_per_head(o) ⊙ silu(g)), whose GEMM adds the residual stream h.
// The carried and decoding states are kept in the frame of the next position: the state after T tokens rotated by
// −T (rotary_state_shift), so that every piece read with a carried state, and every decoding step, starts its
// positions at 0 (the products of rotated queries and keys depend only on their distance).
class RetNetMixer final : public TokenMixer {
 public:
  explicit RetNetMixer(const ModelConfig& config) : config_(config), layout_(head_layout(config, kRetNetDefaults)) {}

  Var forward(Tape& tape, const MixerCall& call) const override {
    const std::vector<Var>& w = *call.weights;
    const ModelMemoryConfig& memory = *call.memory;
    std::vector<Var> qkvg;
    {
      TraceLayer trace(tape, "q/k/v/g projections");
      qkvg = linear_columns(tape, call.x, {w[0], w[1], w[2], w[3]});
    }
    // q and k rotated over their own columns of the projection's output, which is kept anyway (v and g are read
    // from it, and nothing else reads the unrotated q̂ and k̂): the backward finds them there, for no memory of their
    // own, and the recurrence reads them in place.
    Var q, k;
    {
      TraceLayer trace(tape, "rotary embedding");
      q = rotary_embedding_in_place(tape, qkvg[0], layout_.heads, 0);
      k = rotary_embedding_in_place(tape, qkvg[1], layout_.heads, 0);
    }
    const int64_t seq_len = call.x->value.size(1);
    const RecurrenceMode mode = uses_chunk_form(config_, seq_len) ? RecurrenceMode::Chunk : RecurrenceMode::Naive;
    GlaOutputs r;
    {
      TraceLayer trace(tape, "recurrence");
      r = gla_recurrence(tape, q, k, qkvg[2], decays(q->value), call.state ? *call.state : nullptr, layout_.heads,
                         layout_.query_scale(), mode, /*chunk_size=*/0, /*gates=*/nullptr,
                         /*keep_states=*/call.layer < memory.keep_recurrence_states, call.resets);
    }
    if (call.state) *call.state = rotary_state_shift(tape, r.final_state, -seq_len);
    TraceLayer trace(tape, "g_norm_swish_gate + o_proj");
    return gated_head_norm_output(tape, r.output, qkvg[3], w[5], w[4], layout_.value_dim, config_.norm_eps, memory,
                                  call.h);
  }

  // One token at position 0 of the state's frame (its rotation is the identity): S ← γ_h S + kᵀ v, o = K^−½ q S,
  // then the state moved on by one position, and the gated norm and o_proj as in forward.
  Var step(Tape& tape, const MixerStep& call, RecurrentState& state) const override {
    const std::vector<Var>& w = *call.weights;
    const std::vector<Var> qkvg = linear_columns(tape, call.x, {w[0], w[1], w[2], w[3]});
    const Var q = rotary_embedding(tape, qkvg[0], layout_.heads, 0), k = rotary_embedding(tape, qkvg[1], layout_.heads, 0);
    const GlaOutputs r = gla_recurrence(tape, q, k, qkvg[2], decays(q->value), state.as_initial_state(), layout_.heads,
                                        layout_.query_scale(), RecurrenceMode::Naive);
    state.tensor = rotary_state_shift(tape, r.final_state, -1)->value;
    return gated_head_norm_output(tape, r.output, qkvg[3], w[5], w[4], layout_.value_dim, config_.norm_eps,
                                  ModelMemoryConfig{}, call.h);
  }

 private:
  // The heads' log decays [H] where the recurrence reads its gates for q: fp32 on the GPU, q's dtype on the CPU.
  // Made once per device and dtype (a constant: no copy to the GPU per layer and step).
  Var decays(const Tensor& q) const {
    const DType dtype = q.device() == Device::CUDA ? DType::F32 : q.dtype();
    std::lock_guard<std::mutex> lock(decay_mutex_);
    Tensor& cached = decay_cache_[{q.device(), dtype}];
    if (!cached.defined()) {
      Tensor host = Tensor::empty({layout_.heads}, dtype);
      for (int64_t h = 0; h < layout_.heads; ++h)
        host.set_item(h, dtype == DType::F64 ? log_decay<double>(h) : static_cast<double>(log_decay<float>(h)));
      cached = on_device(host, q.device());
    }
    return make_var(cached);
  }

  ModelConfig config_;
  HeadLayout layout_;
  mutable std::mutex decay_mutex_;
  mutable std::map<std::pair<Device, DType>, Tensor> decay_cache_;
};

class RetNetFamily final : public ModelFamily {
 public:
  std::string type() const override { return "retnet"; }
  std::string display_name() const override { return "RetNet"; }
  std::string hf_architecture() const override { return "RetNetForCausalLM"; }
  std::vector<std::string> own_keys() const override { return linear_attention_keys(); }
  int64_t default_hidden_ratio() const override { return kRetNetHiddenRatio; }

  void validate(const ModelConfig& m, const ConfigChecker& checker) const override {
    validate_head_layout(m, kRetNetDefaults, /*rotary_keys=*/true, checker);
  }

  std::string mixer_summary(const ModelConfig& c) const override {
    const HeadLayout h = head_layout(c, kRetNetDefaults);
    return detail::concat(h.heads, " heads (key ", h.key_dim, ", value ", h.value_dim,
                          "), decays 1 - 2^-(5+h), rotary keys");
  }

  bool has_lower_bounds() const override { return false; }
  int64_t gate_width(const ModelConfig& c) const override { return head_layout(c, kRetNetDefaults).keys(); }

  std::vector<ParamSpec> mixer_param_specs(const ModelConfig& c) const override {
    return linear_attention_param_specs(c, kRetNetDefaults, /*gate=*/{});
  }

  std::unique_ptr<TokenMixer> make_mixer(const ModelConfig& c) const override {
    return std::make_unique<RetNetMixer>(c);
  }

  // The recurrence (gla_recurrence_flops_per_token; the constant decay does not change its products) and the rotary
  // embedding's 6 FLOPs per rotated pair of q and k; the projections' GEMMs are counted from the parameters.
  MixerCost mixer_cost(const ModelConfig& c, int64_t seq_len) const override {
    const HeadLayout h = head_layout(c, kRetNetDefaults);
    MixerCost cost;
    cost.flops_per_token = h.recurrence_flops_per_token(seq_len) +
                           2.0 * 3.0 * static_cast<double>(h.keys());
    return cost;
  }

  // The fused projection's output (q, k rotated in place, v, ĝ: 2Fk + 2Fv) and no gate (the [H] decays are read as
  // they are, no gradient); the gated product made from o (the gated norm never stores RMSNorm(o)).
  MixerMemory mixer_memory(const ModelConfig& c, int64_t layer, int64_t seq_len,
                           const MemoryTarget& target) const override {
    const HeadLayout h = head_layout(c, kRetNetDefaults);
    const double Fk = static_cast<double>(h.keys()), Fv = static_cast<double>(h.values());
    GlaMixerTensors tensors{h.heads, h.key_dim, h.value_dim};
    tensors.projection_width = 2.0 * Fk + 2.0 * Fv;
    tensors.own_query_key = false;
    tensors.key_wide_gate = false;
    tensors.gate_backward_bytes = 0.0;
    tensors.normed_outputs = 1;
    return gla_mixer_memory(c, tensors, layer, seq_len, target);
  }

  std::string signature(const ModelConfig& m) const override {
    return linear_attention_signature(type(), m, kRetNetDefaults);
  }

  void write_hf_config(const ModelConfig& m, nlohmann::json& c) const override {
    c["model_type"] = type();
    c["architectures"] = {hf_architecture()};
    write_head_layout(m, kRetNetDefaults, c);
  }

  void read_hf_config(const HfConfigReader& c, ModelConfig& m) const override {
    m.type = type();
    read_head_layout(c, kRetNetDefaults, /*rotary_keys=*/true, m);
    // RetNetConfig's hidden_ratio default is 2 (fla's MLP still takes null as 4).
    m.hidden_ratio = c.optional_int("hidden_ratio", kRetNetHiddenRatio).value_or(4);
    c.require_positive("hidden_ratio", m.hidden_ratio);
    m.use_lower_bound = ModelConfig{}.use_lower_bound;  // RetNet has none; the field keeps its default
    // fla's parallel retention is the same function in its quadratic form; hgrn's chunk path computes it.
    if (m.attn_mode == "parallel") m.attn_mode = "chunk";
  }
};

}  // namespace

const ModelFamily& retnet_family() {
  static const RetNetFamily family;
  return family;
}

}  // namespace hgrn
