// hgrn1.cpp: HGRN1 (fla's HGRNForCausalLM, hgrn-spec.md sections 3 and 5.2; Qin et al., "Hierarchically Gated
// Recurrent Neural Network for Sequence Modeling", NeurIPS 2023): its token mixer, the real-valued HGRU — an
// elementwise gated linear recurrence whose forget gate has the layer-wise lower bound — and its description, which
// also covers the paper's complex-valued HGRU (model.complex: true; models/hgrn1/complex_hgru.h).
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/trace.h"
#include "io/hf_config_reader.h"
#include "models/hgrn1/complex_hgru.h"
#include "models/registry.h"
#include "ops/activations.h"
#include "ops/elementwise.h"
#include "ops/gated_scan.h"
#include "ops/hgrn2_gates.h"
#include "ops/linear.h"
#include "ops/lower_bounded_gated_scan.h"
#include "ops/swiglu_linear.h"

namespace hgrn {
namespace {

// The recurrence width: fla's input_dim = hidden_size · expand_ratio (HGRNConfig's default expand_ratio is 1).
int64_t input_dim(const ModelConfig& c) { return c.hidden_size * c.expand_ratio.value_or(1); }

// HGRNAttention (spec 3): î, f̂, ĝ = x Wiᵀ, x Wfᵀ, x Wgᵀ; g = the lower-bounded log forget gate of f̂;
// u = silu(î) ⊙ (1 − e^g); h_t = e^{g_t} ⊙ h_{t−1} + u_t; then [RMSNorm(h) ⊙ silu(ĝ)] · Woᵀ, whose GEMM adds the
// residual stream: returns h + TokenMixer(x).
class Hgrn1Mixer final : public TokenMixer {
 public:
  explicit Hgrn1Mixer(const ModelConfig& config) : config_(config) {}

  Var forward(Tape& tape, const MixerCall& call) const override {
    const int64_t l = call.layer;
    const std::vector<Var>& w = *call.weights;  // i_proj, f_proj, g_proj, g_norm, o_proj
    const Var &i_proj = w[0], &f_proj = w[1], &g_proj = w[2], &g_norm = w[3], &o_proj = w[4];
    const ModelMemoryConfig& memory = *call.memory;
    Var i_hat, f_hat, g_hat;
    {
      TraceLayer trace(tape, "i/f/g projections");
      // One GEMM for the three (adjacent weights); the gates and the output gate read the column blocks.
      const std::vector<Var> ifg = linear_columns(tape, call.x, {i_proj, f_proj, g_proj});
      i_hat = ifg[0];
      f_hat = ifg[1];
      g_hat = ifg[2];
    }
    const Var gamma = call.gamma;
    const Var initial_state = call.state ? *call.state : nullptr;
    const ScanMode mode = uses_chunk_form(config_, call.x->value.size(1)) ? ScanMode::Chunk : ScanMode::Sequential;
    GatedScanOutputs r;
    if (call.x->value.device() == Device::CUDA) {
      // One op from î and f̂ to o: the gates are computed where the scan reads î and f̂ and recomputed in its backward,
      // so nothing but o and the chunk states is kept and there is nothing to recompute here.
      TraceLayer trace(tape, "recurrence");
      r = lower_bounded_gated_scan(tape, i_hat, f_hat, gamma, l, initial_state, mode, call.resets);
    } else {
      // The composition (the fused op's CPU reference, op by op): g, k = 1 − e^g and u = silu(î) ⊙ k, then the scan.
      const auto make_input = [l, i_hat, f_hat, gamma](Tape& t) {
        const Var g = hgrn2_forget_gate(t, contiguous_on_cpu(t, f_hat), gamma, l);
        const Var k = input_gate_from_forget(t, g, f_hat->value.dtype());
        return std::pair<Var, Var>{g, swiglu(t, contiguous(t, i_hat), k)};
      };
      Var g, u;
      {
        TraceLayer trace(tape, "gates");
        std::tie(g, u) = make_input(tape);
      }
      {
        TraceLayer trace(tape, "recurrence");
        r = gated_scan(tape, u, g, initial_state, mode, /*chunk_size=*/0, call.resets);
      }
      // g and u are elementwise functions of f̂ and î, which the gates keep for their own backward anyway.
      if (recomputes_gates(memory, l, call.num_layers))
        recompute_in_backward(tape, memory, {g, u}, [make_input](Tape& untaped) {
          const auto again = make_input(untaped);
          return std::vector<Tensor>{again.first->value, again.second->value};
        });
    }
    if (call.state) *call.state = r.final_state;
    TraceLayer trace(tape, "g_norm + o_proj");
    // FusedRMSNormGated: RMSNorm(o) ⊙ silu(ĝ), then o_proj; eps is the model's norm_eps here (unlike HGRN2's).
    const UpNorm norm{g_norm, config_.norm_eps, 0};
    return swiglu_linear(tape, g_hat, r.output, o_proj, /*keep_hidden=*/!memory.recompute_elementwise,
                         /*residual=*/call.h, &norm);
  }

  // One token: h ← e^g ⊙ h + silu(î) ⊙ (1 − e^g), then RMSNorm(h) ⊙ silu(ĝ) and o_proj as in forward.
  Var step(Tape& tape, const MixerStep& call, RecurrentState& state) const override {
    const std::vector<Var>& w = *call.weights;
    const std::vector<Var> ifg = linear_columns(tape, call.x, {w[0], w[1], w[2]});
    const GatedScanOutputs r = lower_bounded_gated_scan(tape, ifg[0], ifg[1], call.gamma, call.layer,
                                                        state.as_initial_state(), ScanMode::Sequential);
    state.tensor = r.final_state->value;
    const UpNorm norm{w[3], config_.norm_eps, 0};
    return swiglu_linear(tape, ifg[2], r.output, w[4], /*keep_hidden=*/false, /*residual=*/call.h, &norm);
  }

  std::string fused_step_refusal() const override { return {}; }
  std::unique_ptr<FusedMixerStep> make_fused_step(const FusedStepSetup& setup) const override;

 private:
  ModelConfig config_;
};

// HGRN1's fused decoding step (TokenMixer::make_fused_step), Hgrn1Mixer::step's function on fixed buffers: the i/f/g
// GEMM, then the gates, the scan step and the gated output norm in one kernel (lower_bounded_gated_scan_step: the
// state read and written once), and o_proj's GEMM adding into h.
class Hgrn1FusedStep final : public FusedMixerStep {
 public:
  Hgrn1FusedStep(const ModelConfig& c, const FusedStepSetup& s)
      : layer_(s.layer), width_(input_dim(c)), eps_(c.norm_eps), input_eps_(s.norm_eps), gamma_(s.gamma), x_(s.x),
        input_norm_(s.input_norm), input_rstd_(s.rstd) {
    const std::vector<Var>& w = *s.weights;  // i_proj, f_proj, g_proj, g_norm, o_proj
    const Device device = x_.device();
    const DType fp = device == Device::CUDA ? DType::F32 : x_.dtype();  // the state's
    ifg_ = Tensor::empty({s.batch, 3 * width_}, x_.dtype(), device);
    output_ = Tensor::empty({s.batch, width_}, x_.dtype(), device);
    state_ = Tensor::zeros({s.batch, width_}, fp, device);
    ifg_weights_ = column_weights_for_input({w[0], w[1], w[2]}, x_);
    o_weight_ = weight_for_input(w[4], output_);
    g_norm_ = w[3]->value;
  }

  void run(Tensor& h) override {
    normed_linear_product_into(h, input_norm_, input_eps_, x_, input_rstd_, ifg_weights_, ifg_, /*accumulate=*/false);
    lower_bounded_gated_scan_step(ifg_.columns(0, width_), ifg_.columns(width_, width_), gamma_, layer_, state_,
                                  ifg_.columns(2 * width_, width_), g_norm_, eps_, output_);
    linear_product_into(output_, {o_weight_}, h, /*accumulate=*/true);
  }
  Tensor& state() override { return state_; }

 private:
  int64_t layer_, width_;
  double eps_, input_eps_;
  Tensor gamma_, x_, input_norm_, input_rstd_, g_norm_, o_weight_;
  std::vector<Tensor> ifg_weights_;
  Tensor ifg_, output_, state_;
};

std::unique_ptr<FusedMixerStep> Hgrn1Mixer::make_fused_step(const FusedStepSetup& setup) const {
  return std::make_unique<Hgrn1FusedStep>(config_, setup);
}

class Hgrn1Family final : public ModelFamily {
 public:
  std::string type() const override { return "hgrn"; }
  std::string display_name() const override { return "HGRN1"; }
  std::string hf_architecture() const override { return "HGRNForCausalLM"; }
  std::vector<std::string> own_keys() const override {
    return {"model.complex", "model.expand_ratio", "model.use_lower_bound"};
  }

  void validate(const ModelConfig& m, const ConfigChecker& checker) const override {
    if (m.expand_ratio && *m.expand_ratio <= 0)
      checker.fail_key("model.expand_ratio", "expected a positive integer (the recurrence is hidden_size x "
                                             "expand_ratio wide; fla's HGRNConfig default is 1), got " +
                                                 std::to_string(*m.expand_ratio));
  }

  std::string mixer_summary(const ModelConfig& c) const override {
    return detail::concat(c.complex ? "complex recurrence width " : "recurrence width ", input_dim(c),
                          " (expand_ratio ", c.expand_ratio.value_or(1), ")");
  }

  int64_t gate_width(const ModelConfig& c) const override { return input_dim(c); }

  std::vector<ParamSpec> mixer_param_specs(const ModelConfig& c) const override {
    if (c.complex) return complex_hgru_param_specs(c);
    const int64_t D = c.hidden_size, E = input_dim(c);
    return {
        {"i_proj.weight", {E, D}, ParamGroup::Mixer, ParamInit::Normal},
        {"f_proj.weight", {E, D}, ParamGroup::Mixer, ParamInit::Normal, true},
        {"g_proj.weight", {E, D}, ParamGroup::Mixer, ParamInit::Normal, true},
        {"g_norm.weight", {E}, ParamGroup::Norm, ParamInit::Ones},
        {"o_proj.weight", {D, E}, ParamGroup::Mixer, ParamInit::Normal},
    };
  }

  std::unique_ptr<TokenMixer> make_mixer(const ModelConfig& c) const override {
    if (c.complex) return make_complex_hgru_mixer(c);
    return std::make_unique<Hgrn1Mixer>(c);
  }

  // The scan is one multiply-add per channel and token.
  MixerCost mixer_cost(const ModelConfig& c, int64_t) const override {
    if (c.complex) return complex_hgru_cost(c);
    MixerCost cost;
    cost.flops_per_token = 2.0 * static_cast<double>(input_dim(c));
    return cost;
  }

  // Per layer, kept for the backward: the i/f/g projection's output î, f̂, ĝ (3E) and the recurrence's output o (E);
  // without recompute_elementwise also the output gate's product (E; the gated norm never stores RMSNorm(o)). On the
  // GPU the fused scan keeps the fp32 state entering each 64-token chunk after the first; on the CPU the composition
  // keeps k = 1 − e^g, and g and u unless the gates are recomputed (3E). The backward holds the output gate's input
  // gradient, the projection's gradient (3E) and o's gradient.
  MixerMemory mixer_memory(const ModelConfig& c, int64_t layer, int64_t seq_len,
                           const MemoryTarget& target) const override {
    if (c.complex) return complex_hgru_memory(c, seq_len, target);
    const ModelMemoryConfig knobs = layer_memory(c.memory, layer);
    const double T = static_cast<double>(seq_len), b = static_cast<double>(target.bytes_per_activation);
    const double E = static_cast<double>(input_dim(c)), width = b * E * T;  // one E-wide activation
    const double fp32 = target.gpu ? 4.0 : b;
    const double final_state = fp32 * E;
    const double chunk_states = target.gpu ? 4.0 * E * std::max(0.0, std::ceil(T / 64.0) - 1.0) : 0.0;
    const bool gates_recomputed = recomputes_gates(knobs, layer, c.num_hidden_layers);
    const double gates = target.gpu ? 0.0 : (gates_recomputed ? 1.0 : 3.0) * width;
    const double output_gate_hidden = knobs.recompute_elementwise ? 0.0 : width;
    MixerMemory memory;
    if (knobs.recompute) {
      memory.replayed = 4.0 * width + gates + output_gate_hidden + chunk_states + final_state;
      memory.backward = 5.0 * width + 2.0 * chunk_states;
      return memory;
    }
    memory.states = final_state + chunk_states;
    memory.activations = 4.0 * width + gates + output_gate_hidden;
    memory.backward = 5.0 * width + 2.0 * chunk_states;
    return memory;
  }

  std::string signature(const ModelConfig& m) const override {
    return detail::concat("hgrn L=", m.num_hidden_layers, " D=", m.hidden_size, " E=", input_dim(m),
                          " I=", m.mlp_size(), " vocab=", m.vocab_size, " lower_bound=", m.use_lower_bound,
                          " tied=", m.tie_word_embeddings, m.complex ? " complex=1" : "");
  }

  void write_hf_config(const ModelConfig& m, nlohmann::json& c) const override {
    c["model_type"] = type();
    c["architectures"] = {hf_architecture()};
    c["expand_ratio"] = m.expand_ratio.value_or(1);
    if (m.complex) c["complex"] = true;  // hgrn's own field: the HDF5 export's config says which mixer it holds
  }

  std::string hf_export_refusal(const ModelConfig& m) const override {
    if (!m.complex) return {};
    return "model.complex: fla has no complex-valued HGRU, so this model has no Hugging Face form; export it with "
           "--format hdf5";
  }

  void read_hf_config(const HfConfigReader& c, ModelConfig& m) const override {
    m.type = type();
    m.expand_ratio = c.integer("expand_ratio", 1);
    c.require_positive("expand_ratio", *m.expand_ratio);
  }
};

}  // namespace

const ModelFamily& hgrn1_family() {
  static const Hgrn1Family family;
  return family;
}

}  // namespace hgrn
