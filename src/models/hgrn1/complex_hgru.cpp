// complex_hgru.cpp: the complex-valued HGRU of the HGRN1 paper. With x the attn_norm output and γ_ℓ the layer's
// lower bound:
//   Re c = silu(x W_cr + b_cr), Im c = silu(x W_ci + b_ci), λ = γ_ℓ + (1 − γ_ℓ) σ(x W_f + b_f),
//   h_t = λ_t e^{iθ} h_{t−1} + (1 − λ_t) c_t,   g = σ(x W_g + b_g) ∈ R^{2d},
//   o = LayerNorm(g ⊙ [Re h, Im h]) W_o + b_o,
// with the recurrence in log space (log λ, as the real HGRU) through complex_gated_scan. On the GPU the activations
// are fp32 or bf16 and log λ, θ, the biases, the norm's parameters and the recurrent state fp32.
#include "models/hgrn1/complex_hgru.h"

#include "core/trace.h"
#include "ops/activations.h"
#include "ops/complex_gated_scan.h"
#include "ops/elementwise.h"
#include "ops/hgrn2_gates.h"
#include "ops/layernorm.h"
#include "ops/linear.h"

namespace hgrn {
namespace {

int64_t width(const ModelConfig& c) { return c.hidden_size * c.expand_ratio.value_or(1); }

class ComplexHgruMixer final : public TokenMixer {
 public:
  explicit ComplexHgruMixer(const ModelConfig& config) : config_(config) {}

  Var forward(Tape& tape, const MixerCall& call) const override {
    const std::vector<Var>& w = *call.weights;  // complex_hgru_param_specs order
    const Var &cr_w = w[0], &ci_w = w[1], &f_w = w[2], &g_w = w[3];
    const Var &cr_b = w[4], &ci_b = w[5], &f_b = w[6], &g_b = w[7];
    const Var &theta = w[8], &norm_w = w[9], &norm_b = w[10], &o_w = w[11], &o_b = w[12];
    Var cr, ci, f_hat, g_hat;
    {
      TraceLayer trace(tape, "cr/ci/f/g projections");
      const std::vector<Var> p = linear_columns(tape, call.x, {cr_w, ci_w, f_w, g_w});
      cr = add_bias(tape, contiguous(tape, p[0]), cr_b);
      ci = add_bias(tape, contiguous(tape, p[1]), ci_b);
      f_hat = add_bias(tape, contiguous(tape, p[2]), f_b);
      g_hat = add_bias(tape, contiguous(tape, p[3]), g_b);
    }
    Var log_lambda, x_re, x_im;
    {
      TraceLayer trace(tape, "gates");
      log_lambda = hgrn2_forget_gate(tape, f_hat, call.gamma, call.layer);  // log(γ + (1 − γ) σ(f̂))
      // 1 − λ in the activation dtype (log λ is fp32 on the GPU).
      const Var one_minus_lambda = input_gate_from_forget(tape, log_lambda, cr->value.dtype());
      x_re = swiglu(tape, cr, one_minus_lambda);  // (1 − λ) Re c
      x_im = swiglu(tape, ci, one_minus_lambda);  // (1 − λ) Im c
    }
    const ScanMode mode = uses_chunk_form(config_, call.x->value.size(1)) ? ScanMode::Chunk : ScanMode::Sequential;
    ComplexGatedScanOutputs r;
    {
      TraceLayer trace(tape, "recurrence");
      r = complex_gated_scan(tape, x_re, x_im, log_lambda, theta, call.state ? *call.state : nullptr, mode,
                             /*chunk_size=*/0, call.resets);
    }
    if (call.state) *call.state = r.final_state;
    TraceLayer trace(tape, "output gate + out_norm + o_proj");
    const Var gated = mul(tape, sigmoid(tape, g_hat), r.output);
    const Var normed = layernorm(tape, gated, norm_w, norm_b, config_.norm_eps);
    return add_bias(tape, linear(tape, normed, o_w, /*residual=*/call.h), o_b);
  }

  // One token: forward's ops on one position, which run step by step (the scan's Sequential form).
  Var step(Tape& tape, const MixerStep& call, RecurrentState& state) const override {
    Var carried = state.as_initial_state();
    const ModelMemoryConfig unused;  // forward reads no memory policy
    const Var out = forward(tape, MixerCall{call.layer, call.num_layers, call.weights, &unused, call.x, call.gamma,
                                            call.h, &carried});
    state.tensor = carried->value;
    return out;
  }

  std::string fused_step_refusal() const override {
    return "the complex HGRU (model.complex) has no fused decoding step";
  }

 private:
  ModelConfig config_;
};

}  // namespace

std::vector<ParamSpec> complex_hgru_param_specs(const ModelConfig& c) {
  const int64_t D = c.hidden_size, d = width(c);
  return {
      {"cr_proj.weight", {d, D}, ParamGroup::Mixer, ParamInit::Normal},
      {"ci_proj.weight", {d, D}, ParamGroup::Mixer, ParamInit::Normal, true},
      {"f_proj.weight", {d, D}, ParamGroup::Mixer, ParamInit::Normal, true},
      {"g_proj.weight", {2 * d, D}, ParamGroup::Mixer, ParamInit::Normal, true},
      {"cr_proj.bias", {d}, ParamGroup::MixerVector, ParamInit::Zeros},
      {"ci_proj.bias", {d}, ParamGroup::MixerVector, ParamInit::Zeros},
      {"f_proj.bias", {d}, ParamGroup::MixerVector, ParamInit::Zeros},
      {"g_proj.bias", {2 * d}, ParamGroup::MixerVector, ParamInit::Zeros},
      // hgrn's choice, after the official implementation's RoPE-like angles: θ_j = 10000^(−2j/d), learned.
      {"theta", {d}, ParamGroup::MixerVector, ParamInit::RotaryAngles},
      {"out_norm.weight", {2 * d}, ParamGroup::Norm, ParamInit::Ones},
      {"out_norm.bias", {2 * d}, ParamGroup::Norm, ParamInit::Zeros},
      {"o_proj.weight", {D, 2 * d}, ParamGroup::Mixer, ParamInit::Normal},
      {"o_proj.bias", {D}, ParamGroup::MixerVector, ParamInit::Zeros},
  };
}

std::unique_ptr<TokenMixer> make_complex_hgru_mixer(const ModelConfig& c) {
  return std::make_unique<ComplexHgruMixer>(c);
}

// The scan is a complex multiply-add per channel and token (about 8 real operations).
MixerCost complex_hgru_cost(const ModelConfig& c) {
  MixerCost cost;
  cost.flops_per_token = 8.0 * static_cast<double>(width(c));
  return cost;
}

// Kept per token (op by op, on either device): the four projections with their biases added (5d), log λ, 1 − λ,
// (1 − λ)c (4d), h, σ(ĝ), the gated and the normed output (8d); the final complex state. Its backward holds about as
// many gradients.
MixerMemory complex_hgru_memory(const ModelConfig& c, int64_t seq_len, const MemoryTarget& target) {
  const double d = static_cast<double>(width(c)), b = static_cast<double>(target.bytes_per_activation);
  const double kept = b * 17.0 * d * static_cast<double>(seq_len), final_state = b * 2.0 * d;
  MixerMemory memory;
  if (c.memory.recompute) {
    memory.replayed = kept + final_state;
  } else {
    memory.states = final_state;
    memory.activations = kept;
  }
  memory.backward = kept;
  return memory;
}

}  // namespace hgrn
