// hgrn2.cpp: HGRN2 forward as a composition of ops on the tape (the backward comes from each op's own backward).
//
//   h = Embedding[ids];  gamma = lower_bound_transform(Γ)
//   per layer: h += TokenMixer(RMSNorm(h), gamma_l);  h += GatedMLP(RMSNorm(h))
//   logits = RMSNorm(h) · W_lmᵀ   (W_lm = embedding matrix when tie_word_embeddings)
// Each residual add is made by the branch's last GEMM (o_proj, down_proj: h + x·Wᵀ in the epilogue), so a branch's
// output is never stored on its own and the norm that follows reads only the new h.
// NVTX ranges name every layer's forward and (through markers on the tape) its backward, for Nsight timelines.
#include "model/hgrn2.h"

#include <cmath>

#include "core/random_fill.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/hgrn2_gates.h"
#include "ops/hgru2_recurrence.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu_linear.h"
#include "core/trace.h"

namespace hgrn {

// fla's g_norm (the RMSNorm fused with o_proj) uses the function default eps, not config.norm_eps (spec 1.2 step 7).
constexpr double kOutputNormEps = 1e-5;

Hgrn2Model::Hgrn2Model(const ModelConfig& config, Rng& init_rng, DType dtype)
    : config_(config), activation_dtype_(dtype) {
  const std::vector<ParamSpec> specs = hgrn2_param_specs(config);
  Tensor run;  // the buffer of a run of adjacent parameters (ParamSpec::adjacent_to_previous), and its next row
  int64_t run_row = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& spec = specs[i];
    if (!spec.adjacent_to_previous) {
      Shape run_shape = spec.shape;
      for (size_t j = i + 1; j < specs.size() && specs[j].adjacent_to_previous; ++j) run_shape[0] += specs[j].shape[0];
      run = Tensor::empty(run_shape, dtype);
      run_row = 0;
    }
    HGRN_CHECK(Shape(spec.shape.begin() + 1, spec.shape.end()) == Shape(run.shape().begin() + 1, run.shape().end()),
               "parameter ", spec.name, " ", shape_str(spec.shape), " cannot follow ", shape_str(run.shape()));
    Tensor value = run.rows(run_row, spec.shape[0]);
    run_row += spec.shape[0];
    switch (spec.init) {
      case ParamInit::Normal: fill_normal(value, config.initializer_range, init_rng); break;
      case ParamInit::Ones: value.fill(1.0); break;
      case ParamInit::Zeros: value.zero(); break;
    }
    params_.emplace_back(spec, make_var(std::move(value), true, spec.name));
  }
  embeddings_ = parameter("model.embeddings.weight");
  if (config.use_lower_bound) lower_bounds_ = parameter("model.lower_bounds");
  final_norm_ = parameter("model.norm.weight");
  lm_head_ = config.tie_word_embeddings ? embeddings_ : parameter("lm_head.weight");
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    layers_.push_back({parameter(p + "attn_norm.weight"), parameter(p + "attn.q_proj.weight"),
                       parameter(p + "attn.f_proj.weight"), parameter(p + "attn.i_proj.weight"),
                       parameter(p + "attn.g_norm.weight"), parameter(p + "attn.o_proj.weight"),
                       parameter(p + "mlp_norm.weight"), parameter(p + "mlp.gate_proj.weight"),
                       parameter(p + "mlp.up_proj.weight"), parameter(p + "mlp.down_proj.weight")});
  }
}

const Var& Hgrn2Model::parameter(const std::string& name) const {
  for (const auto& [spec, var] : params_)
    if (spec.name == name) return var;
  throw Error("the HGRN2 model has no parameter '" + name + "'");
}

void Hgrn2Model::load_parameters(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) {
  HGRN_CHECK(tensors.size() == params_.size(), source, " holds ", tensors.size(), " tensors, the model has ",
             params_.size(), " parameters");
  for (const auto& [name, tensor] : tensors) {
    const Var& param = parameter(name);
    HGRN_CHECK(tensor.shape() == param->value.shape(), source, ": ", name, " has shape ", shape_str(tensor.shape()),
               ", the model expects ", shape_str(param->value.shape()));
    // Convert on the host first: a dtype-converting copy does not cross devices.
    param->value.copy_from(tensor.dtype() == param->value.dtype() ? tensor : tensor.to(param->value.dtype()));
    param->invalidate_compute_copy();
  }
}

void Hgrn2Model::to_device(Device device, DType activation_dtype) {
  HGRN_CHECK(activation_dtype == DType::F32 || activation_dtype == DType::F64 ||
                 (activation_dtype == DType::BF16 && device == Device::CUDA),
             "activations in ", dtype_name(activation_dtype), " on ", device_name(device),
             ": bf16 activations need the GPU");
  // Runs of adjacent parameters move as one buffer and stay adjacent.
  for (size_t i = 0; i < params_.size();) {
    size_t end = i + 1;
    while (end < params_.size() && params_[end].first.adjacent_to_previous) ++end;
    std::vector<Tensor> values;
    for (size_t j = i; j < end; ++j) values.push_back(params_[j].second->value);
    const Tensor run = Tensor::adjacent_rows(values);
    if (run.defined() && run.device() != device) {
      const Tensor moved = run.to(device);
      int64_t row = 0;
      for (size_t j = i; j < end; ++j) {
        Tensor& value = params_[j].second->value;
        const int64_t rows = value.size(0);
        value = moved.rows(row, rows);
        row += rows;
      }
    }
    for (size_t j = i; j < end; ++j) {
      Tensor& value = params_[j].second->value;
      if (value.device() != device) value = value.to(device);
    }
    i = end;
  }
  for (auto& [spec, var] : params_) var->invalidate_compute_copy();
  device_ = device;
  activation_dtype_ = activation_dtype;
}

std::vector<std::vector<Var>> Hgrn2Model::gradient_ready_groups() const {
  const int64_t num_layers = config_.num_hidden_layers;
  std::vector<std::vector<Var>> groups;
  // Each group is reported once the backward has passed the norm that makes its first projections' input (see
  // forward_hidden): the head with the final norm, each layer with its attn_norm, then the embedding and bounds.
  groups.push_back(config_.tie_word_embeddings ? std::vector<Var>{final_norm_} : std::vector<Var>{lm_head_, final_norm_});
  for (int64_t l = num_layers - 1; l >= 0; --l) {
    const Layer& p = layers_[l];
    groups.push_back({p.attn_norm, p.q_proj, p.f_proj, p.i_proj, p.g_norm, p.o_proj, p.mlp_norm, p.gate_proj,
                      p.up_proj, p.down_proj});
  }
  std::vector<Var> first{embeddings_};
  if (lower_bounds_) first.push_back(lower_bounds_);
  groups.push_back(first);
  return groups;
}

// The tape runs closures in reverse: a marker recorded before the ops that use a group's parameters runs after
// all their backwards.
void Hgrn2Model::mark_gradients_ready(Tape& tape, size_t group) const {
  if (gradient_ready_hook_) tape.record([hook = gradient_ready_hook_, group] { hook(group); });
}

void Hgrn2Model::recompute_in_backward(Tape& tape, const std::vector<Var>& vars, RematerializeFn values) const {
  if (recompute_elementwise_) rematerialize(tape, vars, std::move(values));
}

// normed = RMSNorm(input) ⊙ weight is not kept for its consumers' backward (under recompute_elementwise). Where only
// linears read it (read_early false), the norm's own backward, which reads input anyway, writes it again and the
// linears' weight gradients run there (release_until_producer_backward): no pass of its own. Where something reads
// it before that backward (a block replayed whole, training.recompute; the MLP's gate and up recomputed from it,
// training.recompute_mlp_projections), a forward recomputes it from input (the same bits) before the first
// consumer's backward.
void Hgrn2Model::free_norm_output(Tape& tape, const Var& normed, const Var& input, const Var& weight, double eps,
                                  bool read_early) const {
  if (!recompute_elementwise_) return;
  if (!read_early) {
    release_until_producer_backward(tape, normed);
    return;
  }
  recompute_in_backward(tape, {normed}, [input, weight, eps](Tape& untaped) {
    return std::vector<Tensor>{rmsnorm(untaped, input, weight, eps)->value};
  });
}

// HGRN2Attention (spec 1.2): q = silu(x Wqᵀ), g = lower-bounded log forget gate of x Wfᵀ, k = 1 - exp(g),
// i = x Wiᵀ; the HGRU2 recurrence per head; then RMSNorm over all of D and o_proj, whose GEMM adds the residual
// stream h: returns h + TokenMixer(x).
// `state` (optional): in, the initial recurrent state (or an undefined Var for zero); out, the final state.
Var Hgrn2Model::token_mixer(Tape& tape, int64_t l, const Var& x, const Var& gamma, const Var& h, Var* state) const {
  const Layer& p = layers_[l];
  Var q_hat, f_hat, i;
  {
    TraceLayer trace(tape, "q/f/i projections");
    // One GEMM for the three (their weights are adjacent), whose output's column blocks the gates and the
    // recurrence read in place; their gradients land in one buffer, which dx reads in one GEMM too.
    const std::vector<Var> qfi = linear_columns(tape, x, {p.q_proj, p.f_proj, p.i_proj});
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
  const double scale = 1.0 / std::sqrt(static_cast<double>(config_.key_dim()));  // fla's default GLA scale K^-1/2
  // As fla: the step-by-step form for short sequences (T <= 64, also in training), else the configured mode.
  // Both compute the same function; the choice is about speed.
  const int64_t seq_len = x->value.size(1);
  const RecurrenceMode mode =
      config_.attn_mode == "chunk" && seq_len > 64 ? RecurrenceMode::Chunk : RecurrenceMode::Naive;
  Hgru2Outputs r;
  {
    TraceLayer trace(tape, "recurrence");
    // Given the gates' origin, the recurrence's backward on the GPU also does the gates' backward (one pass fewer).
    // The first kept_recurrence_states_ layers keep their per-chunk states for the backward (GPU: one state pass
    // fewer, the same bits), the rest have them recomputed there.
    r = hgru2_recurrence(tape, gates.q, gates.k, i, gates.g, state ? *state : nullptr, config_.heads(), scale, mode,
                         /*chunk_size=*/0, gates.origin, /*keep_states=*/l < kept_recurrence_states_);
  }
  if (state) *state = r.final_state;
  // q, g and k (8 bytes per channel and token under bf16) are elementwise functions of q̂ and f̂, which silu and
  // the forget gate keep for their own backward anyway: recomputed there instead of kept (in every layer, or in the
  // last recompute_gates_layers_ ones).
  const int64_t layers = static_cast<int64_t>(layers_.size());
  if (recompute_gates_ || l >= layers - recompute_gates_layers_)
    recompute_in_backward(tape, {gates.q, gates.g, gates.k}, [make_gates](Tape& untaped) {
      const Hgrn2Gates again = make_gates(untaped);
      return std::vector<Tensor>{again.q->value, again.g->value, again.k->value};
    });
  TraceLayer trace(tape, "g_norm + o_proj");
  const Var normed = rmsnorm(tape, r.output, p.g_norm, kOutputNormEps);
  const Var out = linear(tape, normed, p.o_proj, /*residual=*/h);
  free_norm_output(tape, normed, r.output, p.g_norm, kOutputNormEps, /*read_early=*/false);
  return out;
}

// GatedMLP: down(silu(gate(x)) * up(x)), whose GEMM adds the residual stream h: returns h + GatedMLP(x).
Var Hgrn2Model::mlp(Tape& tape, int64_t l, const Var& x, const Var& h) const {
  const Layer& p = layers_[l];
  Var gate, up;
  {
    TraceLayer trace(tape, "mlp gate/up projections");
    // One GEMM for both (adjacent weights); SwiGLU reads the two column blocks in place.
    const std::vector<Var> gate_up = linear_columns(tape, x, {p.gate_proj, p.up_proj});
    gate = gate_up[0];
    up = gate_up[1];
  }
  TraceLayer trace(tape, "swiglu + down projection");
  // The MLP's widest activation, silu(gate) ⊙ up, is kept for the backward only without elementwise recomputation;
  // with it, the backward makes it again in the pass that reads gate and up for their gradients.
  const Var out = swiglu_linear(tape, gate, up, p.down_proj, /*keep_hidden=*/!recompute_elementwise_, /*residual=*/h);
  // gate and up themselves (2 x the MLP width per token), recomputed from x by the same GEMMs: recorded after the
  // op above, so in the backward they are back before its backward reads them. x is kept, or (an RMSNorm
  // output) recomputed by a step recorded after this one, which therefore runs first.
  if (recompute_mlp_projections_)
    rematerialize(tape, {gate, up}, [this, l, x](Tape& untaped) {
      const Layer& p = layers_[l];
      const std::vector<Var> gate_up = linear_columns(untaped, x, {p.gate_proj, p.up_proj});
      return std::vector<Tensor>{gate_up[0]->value, gate_up[1]->value};
    });
  return out;
}

Var Hgrn2Model::forward(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states) const {
  const Var hidden = forward_hidden(tape, input_ids, recurrent_states);
  TraceLayer trace(tape, "lm_head");
  return linear(tape, hidden, lm_head_);
}

Var Hgrn2Model::forward_hidden(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states) const {
  HGRN_CHECK(input_ids.dim() == 2, "model input must be token ids [batch, seq], got ", shape_str(input_ids.shape()));
  if (recurrent_states) recurrent_states->resize(config_.num_hidden_layers);
  const Tensor ids = on_device(input_ids, device_);
  const size_t num_layers = static_cast<size_t>(config_.num_hidden_layers);
  mark_gradients_ready(tape, num_layers + 1);  // the embedding and lower bounds: complete last
  Var h;
  {
    TraceLayer trace(tape, "embedding");
    h = embedding(tape, embeddings_, ids, activation_dtype_);
  }
  Var gamma = config_.use_lower_bound ? lower_bound_transform(tape, lower_bounds_) : nullptr;
  // A group's marker is recorded just before the norm that makes its first projections' input, so that it fires
  // after that norm's backward, where those projections' weight gradients may run (free_norm_output).
  mark_gradients_ready(tape, num_layers);  // layer 0's group (or, without layers, the head's)
  Var x = rmsnorm(tape, h, layers_.empty() ? final_norm_ : layers_[0].attn_norm, config_.norm_eps);
  // A block of the layer, run under recomputation when training.recompute is on.
  auto block = [&](const std::vector<Var>& inputs, const RecomputedFn& f) {
    return recompute_ ? recompute(tape, inputs, f) : f(tape, inputs);
  };
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const Layer& p = layers_[l];
    const Var& next_norm = l + 1 < config_.num_hidden_layers ? layers_[l + 1].attn_norm : final_norm_;
    Var* state = recurrent_states ? &(*recurrent_states)[l] : nullptr;
    TraceLayer trace(tape, "layer " + std::to_string(l));
    // h + TokenMixer(x). A carried state flows out of the token mixer, so that call is never recomputed.
    const Var mixed = state ? token_mixer(tape, l, x, gamma, h, state)
                            : block({x, gamma, h}, [this, l](Tape& t, const std::vector<Var>& in) {
                                return token_mixer(t, l, in[0], in[1], in[2], nullptr);
                              });
    // Each block's normalised input comes back from the residual stream for its projections' weight gradients.
    free_norm_output(tape, x, h, p.attn_norm, config_.norm_eps, /*read_early=*/recompute_);
    h = mixed;
    {
      TraceLayer trace(tape, "rmsnorm");
      x = rmsnorm(tape, h, p.mlp_norm, config_.norm_eps);
    }
    const Var mlp_out =
        block({x, h}, [this, l](Tape& t, const std::vector<Var>& in) { return mlp(t, l, in[0], in[1]); });
    free_norm_output(tape, x, h, p.mlp_norm, config_.norm_eps,
                     /*read_early=*/recompute_ || recompute_mlp_projections_);
    h = mlp_out;
    mark_gradients_ready(tape, l + 1 < config_.num_hidden_layers ? num_layers - static_cast<size_t>(l + 1) : 0);
    {
      TraceLayer trace(tape, "rmsnorm");
      x = rmsnorm(tape, h, next_norm, config_.norm_eps);
    }
    // The layer's bf16 weight copies (2 bytes per weight) are next read by its backward: with
    // recompute_weight_copies they are dropped until then, and linear's backward casts them again (the same bits).
    if (recompute_weight_copies_ && tape.enabled())
      for (const Var* w : {&p.q_proj, &p.f_proj, &p.i_proj, &p.o_proj, &p.gate_proj, &p.up_proj, &p.down_proj})
        (*w)->invalidate_compute_copy();
  }
  // Whatever uses lm_head next (linear, linear_cross_entropy) is recorded after group 0's marker (above).
  return x;
}

}  // namespace hgrn
