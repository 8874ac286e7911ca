// decoder_lm.h: the HGRN family's causal LM (hgrn-spec.md section 4), shared by every member; the member supplies the
// token mixer (models/registry.h).
//
//   h = Embedding[ids];  gamma = lower_bound_transform(Γ)
//   per layer: h += TokenMixer(RMSNorm(h), gamma_l);  h += GatedMLP(RMSNorm(h))
//   logits = RMSNorm(h) · W_lmᵀ   (W_lm = embedding matrix when tie_word_embeddings)
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "models/causal_lm.h"
#include "models/params.h"
#include "models/token_mixer.h"

namespace hgrn {

class DecoderLM final : public CausalLM {
 public:
  // Creates every parameter of model_param_specs(config) in `dtype` and initialises it as fla does (registry.h).
  DecoderLM(const ModelConfig& config, std::unique_ptr<TokenMixer> mixer, Rng& init_rng, DType dtype = DType::F32);
  // With the token mixer of config.type's family member.
  DecoderLM(const ModelConfig& config, Rng& init_rng, DType dtype = DType::F32);

  Var forward(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states = nullptr,
              const Tensor& resets = Tensor()) const override;
  Var forward_hidden(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states = nullptr,
                     const Tensor& resets = Tensor()) const override;
  const Var& lm_head() const override { return lm_head_; }
  Tensor decode_step(const Tensor& token_ids, std::vector<RecurrentState>& states) const override;
  std::unique_ptr<FusedDecoder> make_fused_decoder(const FusedDecoderOptions& options) const override;
  std::string fused_decoding_refusal() const override { return mixer_->fused_step_refusal(); }

  void to_device(Device device, DType activation_dtype) override;
  Device device() const override { return device_; }
  DType activation_dtype() const override { return activation_dtype_; }
  void set_memory(const ModelMemoryConfig& memory) override;
  const ModelMemoryConfig& memory() const { return memory_; }

  // Groups: 0 is the lm_head (with the final norm), then one group per layer from the last to the first (its
  // weights, and the next layer's attn_norm or the final norm, which its residual add feeds), and last the
  // embedding and the lower bounds. forward enters each group where it first reads it (begin_group). The backward
  // reports them in index order, except that with a hook set layer 0's comes after the embedding's (its weight
  // gradients are deferred past the embedding's backward).
  std::vector<std::vector<Var>> gradient_ready_groups() const override;
  void set_gradient_ready_hook(std::function<void(size_t group)> hook) override {
    gradient_ready_hook_ = std::move(hook);
  }
  void set_parameters_needed_hook(std::function<void(size_t group)> hook) override {
    parameters_needed_hook_ = std::move(hook);
  }

  const ModelConfig& config() const override { return config_; }
  const std::vector<std::pair<ParamSpec, Var>>& parameters() const override { return params_; }
  const Var& parameter(const std::string& name) const override;
  void load_parameters(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) override;

 private:
  struct Layer {
    Var attn_norm, mlp_norm, gate_proj, up_proj, down_proj;
    std::vector<Var> mixer;        // the token mixer's parameters, in ModelFamily::mixer_param_specs order
    std::vector<Var> all;          // every parameter of the layer, in model_param_specs order
  };
  // h + GatedMLP(x): down(silu(gate(x)) * up(x)), whose GEMM adds the residual stream h.
  Var mlp(Tape& tape, int64_t layer, const Var& x, const Var& h) const;
  // One layer of a decoding step: h += TokenMixer step(x), then h += GatedMLP(mlp_norm(h)); x comes in as
  // attn_norm(h) and leaves as the next layer's attn_norm (or the final norm) of the new h.
  void decode_layer(Tape& tape, int64_t layer, const Var& gamma, Var& x, Var& h, RecurrentState& state) const;
  // Where the forward first reads group `group`'s parameters: calls the parameters-needed hook and, with `mark`,
  // records the marker whose backward reports the group's gradients complete (the tape runs it after every use's
  // backward).
  void begin_group(Tape& tape, size_t group, bool mark = true) const;

  ModelConfig config_;
  std::unique_ptr<TokenMixer> mixer_;
  ModelMemoryConfig memory_;
  std::vector<ModelMemoryConfig> layer_memory_;  // layer_memory(memory_, l) for every layer l
  Device device_ = Device::CPU;
  DType activation_dtype_ = DType::F32;
  std::function<void(size_t)> gradient_ready_hook_, parameters_needed_hook_;
  std::vector<std::pair<ParamSpec, Var>> params_;
  Var embeddings_, lower_bounds_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace hgrn
