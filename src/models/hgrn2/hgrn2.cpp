// hgrn2.cpp: HGRN2 (fla's HGRN2ForCausalLM, hgrn-spec.md sections 1, 5.1 and 5.3): its token mixer, the HGRU2 —
// gated linear attention with key k = 1 − λ and a layer-wise lower bound on the forget gate — and its description.
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/trace.h"
#include "io/hf_config_reader.h"
#include "models/cost.h"
#include "models/registry.h"
#include "ops/gla_recurrence.h"
#include "ops/hgrn2_gates.h"
#include "ops/linear.h"
#include "ops/lower_bounded_gla_step.h"
#include "ops/rmsnorm.h"

namespace hgrn {
namespace {

// fla's g_norm (the RMSNorm fused with o_proj) uses the function default eps, not config.norm_eps (spec 1.2 step 7).
constexpr double kOutputNormEps = 1e-5;

// HGRN2Attention (spec 1.2): q = silu(x Wqᵀ), g = lower-bounded log forget gate of x Wfᵀ, k = 1 - exp(g),
// i = x Wiᵀ; the HGRU2 recurrence per head; then RMSNorm over all of D and o_proj, whose GEMM adds the residual
// stream h: returns h + TokenMixer(x).
class Hgrn2Mixer final : public TokenMixer {
 public:
  explicit Hgrn2Mixer(const ModelConfig& config) : config_(config) {}

  Var forward(Tape& tape, const MixerCall& call) const override {
    const int64_t l = call.layer;
    const std::vector<Var>& w = *call.weights;  // q_proj, f_proj, i_proj, g_norm, o_proj
    const Var &q_proj = w[0], &f_proj = w[1], &i_proj = w[2], &g_norm = w[3], &o_proj = w[4];
    const ModelMemoryConfig& memory = *call.memory;
    const Var& gamma = call.gamma;
    Var q_hat, f_hat, i;
    {
      TraceLayer trace(tape, "q/f/i projections");
      // One GEMM for the three (their weights are adjacent), whose output's column blocks the gates and the
      // recurrence read in place; their gradients land in one buffer, which dx reads in one GEMM too.
      const std::vector<Var> qfi = linear_columns(tape, call.x, {q_proj, f_proj, i_proj});
      q_hat = qfi[0];
      f_hat = qfi[1];
      i = qfi[2];
    }
    // q = silu(q̂), g = the lower-bounded log forget gate of f̂ (fp32 on the GPU, spec 1.3) and k = 1 − exp(g) in the
    // activation dtype (f̂'s).
    const auto make_gates = [l, q_hat, f_hat, gamma](Tape& t) { return hgrn2_gates(t, q_hat, f_hat, gamma, l); };
    Hgrn2Gates gates;
    {
      TraceLayer trace(tape, "gates");
      gates = make_gates(tape);
    }
    const RecurrenceMode mode =
        uses_chunk_form(config_, call.x->value.size(1)) ? RecurrenceMode::Chunk : RecurrenceMode::Naive;
    GlaOutputs r;
    {
      TraceLayer trace(tape, "recurrence");
      // Given the gates' origin, the recurrence's backward on the GPU also does the gates' backward (one pass
      // fewer). The first keep_recurrence_states layers keep their per-chunk states for the backward (GPU: one state
      // pass fewer, the same bits), the rest have them recomputed there.
      r = gla_recurrence(tape, gates.q, gates.k, i, gates.g, call.state ? *call.state : nullptr, config_.heads(),
                         scale(), mode, /*chunk_size=*/0, gates.origin,
                         /*keep_states=*/l < memory.keep_recurrence_states, call.resets);
    }
    if (call.state) *call.state = r.final_state;
    // q, g and k (8 bytes per channel and token under bf16) are elementwise functions of q̂ and f̂, which silu and
    // the forget gate keep for their own backward anyway: recomputed there instead of kept (in every layer, or in
    // the last recompute_gates_layers ones).
    if (recomputes_gates(memory, l, call.num_layers))
      recompute_in_backward(tape, memory, {gates.q, gates.g, gates.k}, [make_gates](Tape& untaped) {
        const Hgrn2Gates again = make_gates(untaped);
        return std::vector<Tensor>{again.q->value, again.g->value, again.k->value};
      });
    TraceLayer trace(tape, "g_norm + o_proj");
    const Var normed = rmsnorm(tape, r.output, g_norm, kOutputNormEps);
    const Var out = linear(tape, normed, o_proj, /*residual=*/call.h);
    free_norm_output(tape, memory, normed, r.output, g_norm, kOutputNormEps, /*read_early=*/false);
    return out;
  }

  // One token: S ← Diag(e^g) S + kᵀ i per head, o = scale · q S, then g_norm and o_proj as in forward.
  Var step(Tape& tape, const MixerStep& call, RecurrentState& state) const override {
    const std::vector<Var>& w = *call.weights;
    const std::vector<Var> qfi = linear_columns(tape, call.x, {w[0], w[1], w[2]});
    const Hgrn2Gates gates = hgrn2_gates(tape, qfi[0], qfi[1], call.gamma, call.layer);
    const GlaOutputs r = gla_recurrence(tape, gates.q, gates.k, qfi[2], gates.g, state.as_initial_state(),
                                        config_.heads(), scale(), RecurrenceMode::Naive);
    state.tensor = r.final_state->value;
    return linear(tape, rmsnorm(tape, r.output, w[3], kOutputNormEps), w[4], /*residual=*/call.h);
  }

  std::string fused_step_refusal() const override { return {}; }
  std::unique_ptr<FusedMixerStep> make_fused_step(const FusedStepSetup& setup) const override;

 private:
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(config_.key_dim())); }  // fla's GLA default K^-1/2

  ModelConfig config_;
};

// HGRN2's fused decoding step (TokenMixer::make_fused_step), Hgrn2Mixer::step's function on fixed buffers: the q/f/i
// GEMM, the gates and the recurrence in one kernel (lower_bounded_gla_step: the state read and written once),
// g_norm, and o_proj's GEMM adding into h.
class Hgrn2FusedStep final : public FusedMixerStep {
 public:
  Hgrn2FusedStep(const ModelConfig& c, const FusedStepSetup& s, double scale)
      : layer_(s.layer), heads_(c.heads()), scale_(scale), input_eps_(s.norm_eps), gamma_(s.gamma), x_(s.x),
        input_norm_(s.input_norm) {
    const std::vector<Var>& w = *s.weights;  // q_proj, f_proj, i_proj, g_norm, o_proj
    const Device device = x_.device();
    const DType fp = device == Device::CUDA ? DType::F32 : x_.dtype();  // the state's and the norm's statistics'
    const int64_t B = s.batch, F = c.heads() * c.key_dim();
    keys_ = F;
    values_ = c.heads() * c.value_dim();
    qfi_ = Tensor::empty({B, 2 * F + values_}, x_.dtype(), device);
    output_ = Tensor::empty({B, values_}, x_.dtype(), device);
    normed_ = Tensor::empty({B, values_}, x_.dtype(), device);
    rstd_ = Tensor::empty({B}, fp, device);
    state_ = Tensor::zeros({B, c.heads(), c.key_dim(), c.value_dim()}, fp, device);
    qfi_weights_ = column_weights_for_input({w[0], w[1], w[2]}, x_);
    o_weight_ = weight_for_input(w[4], normed_);
    g_norm_ = w[3]->value;
  }

  void run(Tensor& h) override {
    normed_linear_product_into(h, input_norm_, input_eps_, x_, rstd_, qfi_weights_, qfi_, /*accumulate=*/false);
    lower_bounded_gla_step(qfi_.columns(0, keys_), qfi_.columns(keys_, keys_), qfi_.columns(2 * keys_, values_),
                           gamma_, layer_, heads_, scale_, state_, output_);
    normed_linear_product_into(output_, g_norm_, kOutputNormEps, normed_, rstd_, {o_weight_}, h, /*accumulate=*/true);
  }
  Tensor& state() override { return state_; }

 private:
  int64_t layer_, heads_, keys_ = 0, values_ = 0;
  double scale_, input_eps_;
  Tensor gamma_, x_, input_norm_, g_norm_, o_weight_;
  std::vector<Tensor> qfi_weights_;
  Tensor qfi_, output_, normed_, rstd_, state_;  // rstd_: the input norm's, then g_norm's
};

std::unique_ptr<FusedMixerStep> Hgrn2Mixer::make_fused_step(const FusedStepSetup& setup) const {
  return std::make_unique<Hgrn2FusedStep>(config_, setup, scale());
}

class Hgrn2Family final : public ModelFamily {
 public:
  std::string type() const override { return "hgrn2"; }
  std::string display_name() const override { return "HGRN2"; }
  std::string hf_architecture() const override { return "HGRN2ForCausalLM"; }
  std::vector<std::string> own_keys() const override {
    return {"model.num_heads", "model.memory.keep_recurrence_states", "model.expand_ratio", "model.use_lower_bound"};
  }

  void validate(const ModelConfig& m, const ConfigChecker& checker) const override {
    if (!m.expand_ratio && !m.num_heads)
      checker.fail_key("model.expand_ratio",
                       "missing: expected model.expand_ratio (the key width per head, fla's default 128) or "
                       "model.num_heads; fla's HGRN2Config needs one of them");
    if (m.expand_ratio) {
      if (*m.expand_ratio <= 0)
        checker.fail_key("model.expand_ratio", "expected a positive integer, got " + std::to_string(*m.expand_ratio));
      if (m.hidden_size % *m.expand_ratio != 0)
        checker.fail_key("model.expand_ratio", "expected a divisor of model.hidden_size = " +
                                                   std::to_string(m.hidden_size) +
                                                   " (heads = hidden_size / expand_ratio), got " +
                                                   std::to_string(*m.expand_ratio));
    }
    if (m.num_heads) {
      if (*m.num_heads <= 0)
        checker.fail_key("model.num_heads", "expected a positive integer, got " + std::to_string(*m.num_heads));
      if (m.hidden_size % *m.num_heads != 0)
        checker.fail_key("model.num_heads", "expected a divisor of model.hidden_size = " +
                                                std::to_string(m.hidden_size) +
                                                " (value width = hidden_size / num_heads), got " +
                                                std::to_string(*m.num_heads));
    }
    // fla takes H from expand_ratio when both are set; a num_heads that disagrees would be silently ignored.
    if (m.expand_ratio && m.num_heads && m.hidden_size / *m.expand_ratio != *m.num_heads)
      checker.fail_key("model.num_heads",
                       "contradicts model.expand_ratio = " + std::to_string(*m.expand_ratio) + ": with hidden_size " +
                           std::to_string(m.hidden_size) + " that gives " + std::to_string(m.hidden_size / *m.expand_ratio) +
                           " heads, but model.num_heads = " + std::to_string(*m.num_heads) +
                           "; set only one of them, or both consistently (num_heads = hidden_size / expand_ratio)");
  }

  std::string mixer_summary(const ModelConfig& c) const override {
    return detail::concat(c.heads(), " heads (key ", c.key_dim(), ", value ", c.value_dim(), ")");
  }

  int64_t gate_width(const ModelConfig& c) const override { return c.hidden_size; }

  std::vector<ParamSpec> mixer_param_specs(const ModelConfig& c) const override {
    const int64_t D = c.hidden_size, F = c.heads() * c.key_dim();
    return {
        {"q_proj.weight", {F, D}, ParamGroup::Mixer, ParamInit::Normal},
        {"f_proj.weight", {F, D}, ParamGroup::Mixer, ParamInit::Normal, true},
        {"i_proj.weight", {D, D}, ParamGroup::Mixer, ParamInit::Normal, true},
        {"g_norm.weight", {D}, ParamGroup::Norm, ParamInit::Ones},
        {"o_proj.weight", {D, D}, ParamGroup::Mixer, ParamInit::Normal},
    };
  }

  std::unique_ptr<TokenMixer> make_mixer(const ModelConfig& c) const override {
    return std::make_unique<Hgrn2Mixer>(c);
  }

  // Counting multiply-adds as 2 FLOPs (gla_recurrence_flops_per_token).
  MixerCost mixer_cost(const ModelConfig& c, int64_t seq_len) const override {
    MixerCost cost;
    cost.flops_per_token = gla_recurrence_flops_per_token(c.heads(), c.key_dim(), c.value_dim(),
                                                          gla_chunk_size(seq_len));
    return cost;
  }

  // The q/f/i projection's output q̂, f̂, i (2F + D); the forget gate g next to q and k, with no backward share of
  // its own (the recurrence's backward does the gates'); g_norm(o) made from o.
  MixerMemory mixer_memory(const ModelConfig& c, int64_t layer, int64_t seq_len,
                           const MemoryTarget& target) const override {
    const double D = static_cast<double>(c.hidden_size), F = static_cast<double>(c.heads() * c.key_dim());
    GlaMixerTensors tensors{c.heads(), c.key_dim(), c.value_dim()};
    tensors.projection_width = 2.0 * F + D;
    tensors.key_wide_gate = true;
    tensors.gate_backward_bytes = 0.0;
    tensors.normed_outputs = 1;
    return gla_mixer_memory(c, tensors, layer, seq_len, target);
  }

  std::string signature(const ModelConfig& m) const override {
    return detail::concat("hgrn2 L=", m.num_hidden_layers, " D=", m.hidden_size, " H=", m.heads(), " K=", m.key_dim(),
                          " V=", m.value_dim(), " I=", m.mlp_size(), " vocab=", m.vocab_size,
                          " lower_bound=", m.use_lower_bound, " tied=", m.tie_word_embeddings);
  }

  void write_hf_config(const ModelConfig& m, nlohmann::json& c) const override {
    c["model_type"] = type();
    c["architectures"] = {hf_architecture()};
    // Both resolved, as HGRN2Config stores them; fla's layer then uses H = hidden_size / expand_ratio, which is
    // hgrn's heads() in either way the hgrn config was written.
    c["expand_ratio"] = m.key_dim();
    c["num_heads"] = m.heads();
  }

  void read_hf_config(const HfConfigReader& c, ModelConfig& m) const override {
    constexpr int64_t kFlaDefaultExpandRatio = 128;
    m.type = type();
    m.expand_ratio = c.optional_int("expand_ratio", kFlaDefaultExpandRatio);
    m.num_heads = c.optional_int("num_heads", std::nullopt);
    if (!m.expand_ratio && !m.num_heads)
      c.fail("expand_ratio", "expand_ratio and num_heads are both null; HGRN2Config needs one of them");
    if (m.expand_ratio) {
      c.require_positive("expand_ratio", *m.expand_ratio);
      if (m.hidden_size % *m.expand_ratio != 0)
        c.fail("expand_ratio", "expected a divisor of hidden_size = " + std::to_string(m.hidden_size) + ", got " +
                                   std::to_string(*m.expand_ratio));
    }
    if (m.num_heads) {
      c.require_positive("num_heads", *m.num_heads);
      if (m.hidden_size % *m.num_heads != 0)
        c.fail("num_heads", "expected a divisor of hidden_size = " + std::to_string(m.hidden_size) + ", got " +
                                std::to_string(*m.num_heads));
    }
  }
};

}  // namespace

const ModelFamily& hgrn2_family() {
  static const Hgrn2Family family;
  return family;
}

}  // namespace hgrn
