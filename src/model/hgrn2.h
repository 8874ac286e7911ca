// hgrn2.h: the HGRN2 causal language model (fla's HGRN2ForCausalLM, hgrn-spec.md sections 1, 2, 4 and 6).
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/autograd.h"
#include "core/rng.h"
#include "model/hgrn2_params.h"
#include "ops/recompute.h"

namespace hgrn {

class Hgrn2Model {
 public:
  // Creates every parameter of hgrn2_param_specs(config) in `dtype` and initialises it as fla does: N(0, range)
  // for projections and embeddings (drawn in spec order from `init_rng`), ones for norms, zeros for lower bounds.
  Hgrn2Model(const ModelConfig& config, Rng& init_rng, DType dtype = DType::F32);

  // input_ids: int32 or int64 [B, T]. Returns logits [B, T, vocab_size].
  // recurrent_states (optional) carries each layer's HGRU2 state [B, H, K, V] across calls, which is how an RNN
  // reads unlimited context: on input, a layer's entry (if defined) is its initial state; on return, every entry
  // holds that layer's final state. Null: every sequence starts from the zero state.
  Var forward(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states = nullptr) const;
  // forward without the LM head: the final normed hidden states [B, T, D], which forward multiplies by lm_head().
  // Training feeds them to linear_cross_entropy, which never holds the whole batch's logits.
  Var forward_hidden(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states = nullptr) const;
  const Var& lm_head() const { return lm_head_; }  // [vocab, D]; the embedding matrix when tied

  // Moves every parameter to `device` (fp32 master weights stay fp32) and sets the dtype activations are computed
  // in: fp32, or bf16 on the GPU (mixed precision: GEMMs on bf16 copies of the weights, fp32 gradients).
  void to_device(Device device, DType activation_dtype);
  Device device() const { return device_; }
  // Training with recomputation: each token mixer and MLP keeps only its input and is run again in the backward.
  void set_recompute(bool recompute) { recompute_ = recompute; }
  // Recompute the outputs of the gates, norms and SwiGLU in the backward instead of keeping them (rematerialize).
  void set_recompute_elementwise(bool recompute) { recompute_elementwise_ = recompute; }
  // Recompute the MLP's gate and up projections (two GEMMs) in the backward instead of keeping them (rematerialize).
  void set_recompute_mlp_projections(bool recompute) { recompute_mlp_projections_ = recompute; }
  // With recompute_elementwise: also the gates' outputs q, g, k (false keeps them: 8 bytes per channel and token).
  void set_recompute_gates(bool recompute) { recompute_gates_ = recompute; }
  // Without recompute_gates: the last `layers` layers recompute their gates anyway (the memory they free can keep
  // recurrence states, set_kept_recurrence_states, which saves more time per byte).
  void set_recompute_gates_layers(int64_t layers) { recompute_gates_layers_ = layers; }
  // The first `layers` layers keep the recurrence's per-chunk states for the backward instead of recomputing them
  // there (GPU only: B·H·ceil(T/64)·K·V activation-dtype values a layer, for one state pass fewer; same bits).
  void set_kept_recurrence_states(int64_t layers) { kept_recurrence_states_ = layers; }
  // Drop each layer's bf16 weight copies after its forward; the backward casts them again (mixed precision only).
  void set_recompute_weight_copies(bool recompute) { recompute_weight_copies_ = recompute; }
  DType activation_dtype() const { return activation_dtype_; }

  // Data parallelism overlaps the gradient reduction with the backward pass. The parameters fall into groups, in the
  // order their gradients become final during a backward: group 0 is the lm_head (empty when tied), then one group
  // per layer from the last to the first (its weights, and the next layer's attn_norm or the final norm, which its
  // residual add feeds), and last the embedding, the lower bounds and the first norm. Every parameter is in exactly
  // one group. With a hook set, forward records a marker on the tape per group; the backward calls hook(group)
  // as soon as every gradient of that group is complete (on the GPU: all kernels writing them are queued).
  std::vector<std::vector<Var>> gradient_ready_groups() const;
  void set_gradient_ready_hook(std::function<void(size_t group)> hook) { gradient_ready_hook_ = std::move(hook); }

  const ModelConfig& config() const { return config_; }
  const std::vector<std::pair<ParamSpec, Var>>& parameters() const { return params_; }
  const Var& parameter(const std::string& name) const;  // throws if the model has no such tensor
  // Copies named tensors (a checkpoint's or an imported model's) into the parameters: the names and shapes must be
  // exactly the model's, in any order; `source` names where they came from in messages.
  void load_parameters(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source);

 private:
  struct Layer {
    Var attn_norm, q_proj, f_proj, i_proj, g_norm, o_proj, mlp_norm, gate_proj, up_proj, down_proj;
  };
  // Each returns h + the block's output (the residual add made by the block's last GEMM).
  Var token_mixer(Tape& tape, int64_t layer, const Var& x, const Var& gamma, const Var& h, Var* state) const;
  Var mlp(Tape& tape, int64_t layer, const Var& x, const Var& h) const;
  void mark_gradients_ready(Tape& tape, size_t group) const;
  // rematerialize(tape, vars, values) when recompute_elementwise_ is on; else the values are kept.
  void recompute_in_backward(Tape& tape, const std::vector<Var>& vars, RematerializeFn values) const;
  // Under recompute_elementwise: an RMSNorm output `normed` of `input` is not kept for the backward; it comes back in
  // the norm's own backward, or (read_early: something reads it before then) by a forward of its own (hgrn2.cpp).
  void free_norm_output(Tape& tape, const Var& normed, const Var& input, const Var& weight, double eps,
                        bool read_early) const;

  ModelConfig config_;
  Device device_ = Device::CPU;
  DType activation_dtype_ = DType::F32;
  bool recompute_ = false;
  bool recompute_elementwise_ = true;
  bool recompute_mlp_projections_ = false;
  bool recompute_gates_ = true;
  bool recompute_weight_copies_ = false;
  int64_t kept_recurrence_states_ = 0;
  int64_t recompute_gates_layers_ = 0;
  std::function<void(size_t)> gradient_ready_hook_;
  std::vector<std::pair<ParamSpec, Var>> params_;
  Var embeddings_, lower_bounds_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

}  // namespace hgrn
