// decoder_lm.cpp: the family's decoder as a composition of ops on the tape (the backward comes from each op's own
// backward); the member's token mixer records its part of each layer.
// Each residual add is made by the branch's last GEMM (o_proj, down_proj: h + x·Wᵀ in the epilogue), so a branch's
// output is never stored on its own and the norm that follows reads only the new h.
// NVTX ranges name every layer's forward and (through markers on the tape) its backward, for Nsight timelines.
#include "models/decoder_lm.h"

#include <cmath>
#include <memory>

#include "core/random_fill.h"
#include "models/fused_decoder.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/hgrn2_gates.h"
#include "ops/linear.h"
#include "ops/recompute.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu_linear.h"
#include "core/trace.h"
#include "models/registry.h"

namespace hgrn {

void DecoderLM::set_memory(const ModelMemoryConfig& memory) {
  memory_ = memory;
  layer_memory_.clear();
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) layer_memory_.push_back(layer_memory(memory, l));
}

DecoderLM::DecoderLM(const ModelConfig& config, std::unique_ptr<TokenMixer> mixer, Rng& init_rng, DType dtype)
    : config_(config), mixer_(std::move(mixer)), activation_dtype_(dtype) {
  set_memory(config.memory);
  const std::vector<ParamSpec> specs = model_param_specs(config);
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
      case ParamInit::RotaryAngles:
        for (int64_t j = 0; j < value.numel(); ++j)
          value.set_item(j, std::pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(value.numel())));
        break;
    }
    params_.emplace_back(spec, make_var(std::move(value), true, spec.name));
  }
  embeddings_ = parameter("model.embeddings.weight");
  if (lower_bounded(config)) lower_bounds_ = parameter("model.lower_bounds");
  final_norm_ = parameter("model.norm.weight");
  lm_head_ = config.tie_word_embeddings ? embeddings_ : parameter("lm_head.weight");
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer layer{parameter(p + "attn_norm.weight"), parameter(p + "mlp_norm.weight"),
                parameter(p + "mlp.gate_proj.weight"), parameter(p + "mlp.up_proj.weight"),
                parameter(p + "mlp.down_proj.weight"), {}, {}};
    for (const auto& [spec, var] : params_) {
      if (spec.name.rfind(p, 0) != 0) continue;
      layer.all.push_back(var);
      if (spec.name.rfind(p + "attn.", 0) == 0) layer.mixer.push_back(var);
    }
    layers_.push_back(std::move(layer));
  }
}

DecoderLM::DecoderLM(const ModelConfig& config, Rng& init_rng, DType dtype)
    : DecoderLM(config, model_family(config.type).make_mixer(config), init_rng, dtype) {}

const Var& DecoderLM::parameter(const std::string& name) const {
  for (const auto& [spec, var] : params_)
    if (spec.name == name) return var;
  throw Error("the " + config_.type + " model has no parameter '" + name + "'");
}

void DecoderLM::load_parameters(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) {
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

void DecoderLM::to_device(Device device, DType activation_dtype) {
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

std::vector<std::vector<Var>> DecoderLM::gradient_ready_groups() const {
  const int64_t num_layers = config_.num_hidden_layers;
  std::vector<std::vector<Var>> groups;
  // Each group is reported once the backward has passed the norm that makes its first projections' input (see
  // forward_hidden): the head with the final norm, each layer with its attn_norm, then the embedding and bounds.
  groups.push_back(config_.tie_word_embeddings ? std::vector<Var>{final_norm_} : std::vector<Var>{lm_head_, final_norm_});
  for (int64_t l = num_layers - 1; l >= 0; --l) groups.push_back(layers_[l].all);
  std::vector<Var> first{embeddings_};
  if (lower_bounds_) first.push_back(lower_bounds_);
  groups.push_back(first);
  return groups;
}

void DecoderLM::begin_group(Tape& tape, size_t group, bool mark) const {
  if (parameters_needed_hook_) parameters_needed_hook_(group);
  if (mark && gradient_ready_hook_) tape.record([hook = gradient_ready_hook_, group] { hook(group); });
}

// GatedMLP: down(silu(gate(x)) * up(x)), whose GEMM adds the residual stream h: returns h + GatedMLP(x).
Var DecoderLM::mlp(Tape& tape, int64_t l, const Var& x, const Var& h) const {
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
  const Var out = swiglu_linear(tape, gate, up, p.down_proj,
                                /*keep_hidden=*/!layer_memory_[l].recompute_elementwise, /*residual=*/h);
  // gate and up themselves (2 x the MLP width per token), recomputed from x by the same GEMMs: recorded after the
  // op above, so in the backward they are back before its backward reads them. x is kept, or (an RMSNorm
  // output) recomputed by a step recorded after this one, which therefore runs first.
  if (memory_.recompute_mlp_projections)
    rematerialize(tape, {gate, up}, [this, l, x](Tape& untaped) {
      const Layer& p = layers_[l];
      const std::vector<Var> gate_up = linear_columns(untaped, x, {p.gate_proj, p.up_proj});
      return std::vector<Tensor>{gate_up[0]->value, gate_up[1]->value};
    });
  return out;
}

Var DecoderLM::forward(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states,
                       const Tensor& resets) const {
  const Var hidden = forward_hidden(tape, input_ids, recurrent_states, resets);
  TraceLayer trace(tape, "lm_head");
  return linear(tape, hidden, lm_head_);
}

Var DecoderLM::forward_hidden(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states,
                              const Tensor& resets) const {
  HGRN_CHECK(input_ids.dim() == 2, "model input must be token ids [batch, seq], got ", shape_str(input_ids.shape()));
  if (resets.defined())
    HGRN_CHECK(resets.dtype() == DType::I32 && resets.shape() == input_ids.shape(),
               "reset flags must be int32 like the token ids ", shape_str(input_ids.shape()), ", got ",
               dtype_name(resets.dtype()), " ", shape_str(resets.shape()));
  if (recurrent_states) recurrent_states->resize(config_.num_hidden_layers);
  // Host ids go to embedding() as they are: it checks them on the host and uploads them without a wait.
  const Tensor ids = input_ids.device() == Device::CPU ? input_ids : on_device(input_ids, device_);
  const Tensor layer_resets = resets.defined() ? on_device(resets, device_) : Tensor();  // every layer reads them
  const size_t num_layers = static_cast<size_t>(config_.num_hidden_layers);
  // Under data parallelism layer 0's weight gradients wait for the embedding's backward (WeightGradientQueue), so
  // that the embedding gradient, complete only at the very end, is reduced while they run; layer 0's group is
  // reported after them.
  const std::shared_ptr<WeightGradientQueue> layer_0_weight_gradients =
      gradient_ready_hook_ && tape.enabled() && num_layers > 0 ? std::make_shared<WeightGradientQueue>() : nullptr;
  if (layer_0_weight_gradients)
    tape.record([hook = gradient_ready_hook_, num_layers, queue = layer_0_weight_gradients] {
      queue->run();
      hook(num_layers);
    });
  begin_group(tape, num_layers + 1);  // the embedding and lower bounds: complete last
  Var h;
  {
    TraceLayer trace(tape, "embedding");
    h = embedding(tape, embeddings_, ids, activation_dtype_);
  }
  Var gamma = lower_bounded(config_) ? lower_bound_transform(tape, lower_bounds_) : nullptr;
  // A group's marker is recorded just before the norm that makes its first projections' input, so that it fires
  // after that norm's backward, where those projections' weight gradients may run (free_norm_output).
  begin_group(tape, num_layers, /*mark=*/!layer_0_weight_gradients);  // layer 0's (without layers, the head's)
  Var x = rmsnorm(tape, h, layers_.empty() ? final_norm_ : layers_[0].attn_norm, config_.norm_eps);
  // A block of the layer, run under recomputation when model.memory.recompute is on.
  auto block = [&](const std::vector<Var>& inputs, const RecomputedFn& f) {
    return memory_.recompute ? recompute(tape, inputs, f) : f(tape, inputs);
  };
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    const Layer& p = layers_[l];
    const Var& next_norm = l + 1 < config_.num_hidden_layers ? layers_[l + 1].attn_norm : final_norm_;
    Var* state = recurrent_states ? &(*recurrent_states)[l] : nullptr;
    TraceLayer trace(tape, "layer " + std::to_string(l));
    // h + TokenMixer(x). A carried state flows out of the token mixer, so that call is never recomputed.
    const auto token_mixer = [this, l, layer_resets](Tape& t, const Var& in_x, const Var& in_gamma, const Var& in_h,
                                                     Var* st) {
      return mixer_->forward(t, MixerCall{l, config_.num_hidden_layers, &layers_[l].mixer, &layer_memory_[l], in_x,
                                          in_gamma, in_h, st, layer_resets});
    };
    const Var mixed = state ? token_mixer(tape, x, gamma, h, state)
                            : block({x, gamma, h}, [token_mixer](Tape& t, const std::vector<Var>& in) {
                                return token_mixer(t, in[0], in[1], in[2], nullptr);
                              });
    // Each block's normalised input comes back from the residual stream for its projections' weight gradients.
    free_norm_output(tape, layer_memory_[l], x, h, p.attn_norm, config_.norm_eps, /*read_early=*/memory_.recompute);
    h = mixed;
    {
      TraceLayer trace(tape, "rmsnorm");
      x = rmsnorm(tape, h, p.mlp_norm, config_.norm_eps);
    }
    const Var mlp_out =
        block({x, h}, [this, l](Tape& t, const std::vector<Var>& in) { return mlp(t, l, in[0], in[1]); });
    free_norm_output(tape, layer_memory_[l], x, h, p.mlp_norm, config_.norm_eps,
                     /*read_early=*/memory_.recompute || memory_.recompute_mlp_projections);
    h = mlp_out;
    if (l == 0 && layer_0_weight_gradients)  // opens after the next marker's report, before layer 0's backward
      tape.record([queue = layer_0_weight_gradients] { queue->open(); });
    begin_group(tape, l + 1 < config_.num_hidden_layers ? num_layers - static_cast<size_t>(l + 1) : 0);
    {
      TraceLayer trace(tape, "rmsnorm");
      x = rmsnorm(tape, h, next_norm, config_.norm_eps);
    }
    // The layer's bf16 weight copies (2 bytes per weight) are next read by its backward: with
    // recompute_weight_copies they are dropped until then, and linear's backward casts them again (the same bits).
    if (memory_.recompute_weight_copies && tape.enabled())
      for (const Var& w : p.all)
        if (w->value.dim() == 2) w->invalidate_compute_copy();
  }
  // Whatever uses lm_head next (linear, linear_cross_entropy) is recorded after group 0's marker (above).
  return x;
}

Tensor DecoderLM::decode_step(const Tensor& token_ids, std::vector<RecurrentState>& states) const {
  HGRN_CHECK(token_ids.dim() == 1, "decode_step takes one token per sequence [batch], got ",
             shape_str(token_ids.shape()));
  const int64_t batch = token_ids.size(0);
  states.resize(config_.num_hidden_layers);
  Tape tape;
  tape.set_enabled(false);
  Var h = embedding(tape, embeddings_, on_device(token_ids.reshape({batch, 1}), device_), activation_dtype_);
  const Var gamma = lower_bounded(config_) ? lower_bound_transform(tape, lower_bounds_) : nullptr;
  Var x = rmsnorm(tape, h, layers_.empty() ? final_norm_ : layers_[0].attn_norm, config_.norm_eps);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) decode_layer(tape, l, gamma, x, h, states[l]);
  return linear(tape, x, lm_head_)->value.reshape({batch, config_.vocab_size});
}

std::unique_ptr<FusedDecoder> DecoderLM::make_fused_decoder(const FusedDecoderOptions& options) const {
  FusedDecoderWeights weights{embeddings_, lower_bounds_, final_norm_, lm_head_, {}};
  for (const Layer& p : layers_)
    weights.layers.push_back({p.attn_norm, p.mlp_norm, p.gate_proj, p.up_proj, p.down_proj, &p.mixer});
  return std::make_unique<FusedDecoder>(config_, weights, *mixer_, device_, options);
}

void DecoderLM::decode_layer(Tape& tape, int64_t l, const Var& gamma, Var& x, Var& h, RecurrentState& state) const {
  const Layer& p = layers_[l];
  h = mixer_->step(tape, MixerStep{l, config_.num_hidden_layers, &p.mixer, x, gamma, h}, state);
  h = mlp(tape, l, rmsnorm(tape, h, p.mlp_norm, config_.norm_eps), h);
  const Var& next_norm = l + 1 < config_.num_hidden_layers ? layers_[l + 1].attn_norm : final_norm_;
  x = rmsnorm(tape, h, next_norm, config_.norm_eps);
}

}  // namespace hgrn
