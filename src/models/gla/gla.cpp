// gla.cpp: GLA (fla's GLAForCausalLM; Yang et al., "Gated Linear Attention Transformers with Hardware-Efficient
// Training", ICML 2024): its token mixer, gated linear attention with a data-dependent low-rank forget gate per key
// channel, on the chunkwise recurrence HGRN2 runs (ops/gla_recurrence.h), and its description.
#include <nlohmann/json.hpp>

#include "core/trace.h"
#include "io/hf_config_reader.h"
#include "models/cost.h"
#include "models/linear_attention.h"
#include "models/registry.h"
#include "ops/gla_recurrence.h"
#include "ops/linear.h"
#include "ops/low_rank_gate.h"

namespace hgrn {
namespace {

// GLAConfig's defaults (fla/models/gla/configuration_gla.py).
constexpr HeadDefaults kGlaDefaults{/*num_heads=*/4, /*expand_k=*/0.5, /*expand_v=*/1.0};
// GatedLinearAttention's own defaults, which GLAConfig does not expose: the forget gate's low rank and the divisor
// of its log-sigmoid.
constexpr int64_t kGateLowRankDim = 16;
constexpr double kGateLogitNormalizer = 16.0;

// GatedLinearAttention (fla/layers/gla.py): q, k, v, ĝ and the gate's low-rank input u = x W₁ᵀ from one GEMM;
// the forget gate gk = log σ(u W₂ᵀ + b) / 16 per key channel; per head S_t = Diag(e^{gk_t}) S_{t−1} + k_tᵀ v_t,
// o_t = K^−½ q_t S_t; then o_proj(RMSNorm_per_head(o) ⊙ silu(ĝ)), whose GEMM adds the residual stream h.
class GlaMixer final : public TokenMixer {
 public:
  explicit GlaMixer(const ModelConfig& config) : config_(config), layout_(head_layout(config, kGlaDefaults)) {}

  Var forward(Tape& tape, const MixerCall& call) const override {
    const std::vector<Var>& w = *call.weights;
    const ModelMemoryConfig& memory = *call.memory;
    Projections p;
    {
      TraceLayer trace(tape, "q/k/v/g/gate projections");
      p = project(tape, w, call.x);
    }
    // The forget gate: a function of the projection's output, which is kept anyway (the recurrence reads q, k and v
    // from it in place, the output gate reads g).
    const auto make_gate = [w, p](Tape& t) { return forget_gate(t, w, p); };
    Var gate;
    {
      TraceLayer trace(tape, "gates");
      gate = make_gate(tape);
    }
    const RecurrenceMode mode =
        uses_chunk_form(config_, call.x->value.size(1)) ? RecurrenceMode::Chunk : RecurrenceMode::Naive;
    GlaOutputs r;
    {
      TraceLayer trace(tape, "recurrence");
      r = gla_recurrence(tape, p.q, p.k, p.v, gate, call.state ? *call.state : nullptr, layout_.heads,
                         layout_.query_scale(), mode, /*chunk_size=*/0, /*gates=*/nullptr,
                         /*keep_states=*/call.layer < memory.keep_recurrence_states, call.resets);
    }
    if (call.state) *call.state = r.final_state;
    if (recomputes_gates(memory, call.layer, call.num_layers))
      recompute_in_backward(tape, memory, {gate}, [make_gate](Tape& untaped) {
        return std::vector<Tensor>{make_gate(untaped)->value};
      });
    TraceLayer trace(tape, "g_norm_swish_gate + o_proj");
    return gated_head_norm_output(tape, r.output, p.g, w[8], w[7], layout_.value_dim, config_.norm_eps, memory, call.h);
  }

  // One token: S ← Diag(e^{gk}) S + kᵀ v per head, o = K^−½ q S, then the gated norm and o_proj as in forward.
  Var step(Tape& tape, const MixerStep& call, RecurrentState& state) const override {
    const std::vector<Var>& w = *call.weights;
    const Projections p = project(tape, w, call.x);
    const GlaOutputs r = gla_recurrence(tape, p.q, p.k, p.v, forget_gate(tape, w, p), state.as_initial_state(),
                                        layout_.heads, layout_.query_scale(), RecurrenceMode::Naive);
    state.tensor = r.final_state->value;
    return gated_head_norm_output(tape, r.output, p.g, w[8], w[7], layout_.value_dim, config_.norm_eps,
                                  ModelMemoryConfig{}, call.h);
  }

 private:
  struct Projections {
    Var q, k, v, g, low_rank;  // column blocks of one GEMM's output
  };

  // w: q_proj, k_proj, v_proj, g_proj, gk_proj.0 (adjacent: one GEMM), gk_proj.1 weight and bias, o_proj,
  // g_norm_swish_gate.
  static Projections project(Tape& tape, const std::vector<Var>& w, const Var& x) {
    const std::vector<Var> blocks = linear_columns(tape, x, {w[0], w[1], w[2], w[3], w[4]});
    return {blocks[0], blocks[1], blocks[2], blocks[3], blocks[4]};
  }

  // gk: fp32 on the GPU, the activation dtype on the CPU; read from u in place, its logits never stored.
  static Var forget_gate(Tape& tape, const std::vector<Var>& w, const Projections& p) {
    const Tensor& u = p.low_rank->value;
    const DType gate_dtype = u.device() == Device::CUDA ? DType::F32 : u.dtype();
    return low_rank_log_sigmoid_gate(tape, p.low_rank, w[5], w[6], kGateLogitNormalizer, gate_dtype);
  }

  ModelConfig config_;
  HeadLayout layout_;
};

class GlaFamily final : public ModelFamily {
 public:
  std::string type() const override { return "gla"; }
  std::string display_name() const override { return "GLA"; }
  std::string hf_architecture() const override { return "GLAForCausalLM"; }
  std::vector<std::string> own_keys() const override { return linear_attention_keys(); }

  void validate(const ModelConfig& m, const ConfigChecker& checker) const override {
    validate_head_layout(m, kGlaDefaults, /*rotary_keys=*/false, checker);
  }

  std::string mixer_summary(const ModelConfig& c) const override {
    const HeadLayout h = head_layout(c, kGlaDefaults);
    return detail::concat(h.heads, " heads (key ", h.key_dim, ", value ", h.value_dim, "), forget gate of rank ",
                          kGateLowRankDim);
  }

  bool has_lower_bounds() const override { return false; }
  int64_t gate_width(const ModelConfig& c) const override { return head_layout(c, kGlaDefaults).keys(); }

  std::vector<ParamSpec> mixer_param_specs(const ModelConfig& c) const override {
    const int64_t D = c.hidden_size, Fk = head_layout(c, kGlaDefaults).keys();
    return linear_attention_param_specs(
        c, kGlaDefaults,
        {
            {"gk_proj.0.weight", {kGateLowRankDim, D}, ParamGroup::Mixer, ParamInit::Normal, true},
            {"gk_proj.1.weight", {Fk, kGateLowRankDim}, ParamGroup::Mixer, ParamInit::Normal},
            {"gk_proj.1.bias", {Fk}, ParamGroup::MixerVector, ParamInit::Zeros},
        });
  }

  std::unique_ptr<TokenMixer> make_mixer(const ModelConfig& c) const override {
    return std::make_unique<GlaMixer>(c);
  }

  // The recurrence (gla_recurrence_flops_per_token); the gate's and the projections' GEMMs are counted from the
  // parameters.
  MixerCost mixer_cost(const ModelConfig& c, int64_t seq_len) const override {
    const HeadLayout h = head_layout(c, kGlaDefaults);
    MixerCost cost;
    cost.flops_per_token = h.recurrence_flops_per_token(seq_len);
    return cost;
  }

  // The fused projection's output (q, k, v, ĝ and u: 2Fk + 2Fv + 16; the recurrence reads q and k in it, the gate
  // reads u, and the gate's logits are never stored); the forget gate gk, and its gradient (fp32 on the GPU) in the
  // backward; the gated product made from o (the gated norm never stores RMSNorm(o)).
  MixerMemory mixer_memory(const ModelConfig& c, int64_t layer, int64_t seq_len,
                           const MemoryTarget& target) const override {
    const HeadLayout h = head_layout(c, kGlaDefaults);
    const double Fk = static_cast<double>(h.keys()), Fv = static_cast<double>(h.values());
    const double r = static_cast<double>(kGateLowRankDim);
    GlaMixerTensors tensors{h.heads, h.key_dim, h.value_dim};
    tensors.projection_width = 2.0 * Fk + 2.0 * Fv + r;
    tensors.own_query_key = false;
    tensors.key_wide_gate = true;
    tensors.gate_backward_bytes = target.gpu ? 4.0 : static_cast<double>(target.bytes_per_activation);
    tensors.normed_outputs = 1;
    return gla_mixer_memory(c, tensors, layer, seq_len, target);
  }

  std::string signature(const ModelConfig& m) const override {
    return linear_attention_signature(type(), m, kGlaDefaults);
  }

  void write_hf_config(const ModelConfig& m, nlohmann::json& c) const override {
    c["model_type"] = type();
    c["architectures"] = {hf_architecture()};
    write_head_layout(m, kGlaDefaults, c);
    c["clamp_min"] = nullptr;
    c["use_gk"] = true;
    c["use_gv"] = false;
  }

  void read_hf_config(const HfConfigReader& c, ModelConfig& m) const override {
    m.type = type();
    read_head_layout(c, kGlaDefaults, /*rotary_keys=*/false, m);
    if (c.has_non_null("clamp_min"))
      c.fail("clamp_min", "a lower clamp of the forget gate is not part of hgrn's GLA; expected null");
    m.use_lower_bound = ModelConfig{}.use_lower_bound;  // GLA has none; the field keeps its default
  }
};

}  // namespace

const ModelFamily& gla_family() {
  static const GlaFamily family;
  return family;
}

}  // namespace hgrn
