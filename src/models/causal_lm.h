// causal_lm.h: the one interface through which training, evaluation, benchmarks, data parallelism, checkpoints,
// export and the command line see a model, whatever its family member (models/registry.h makes one from a config).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/autograd.h"
#include "models/params.h"
#include "models/token_mixer.h"

namespace hgrn {

class FusedDecoder;
struct FusedDecoderOptions;

class CausalLM {
 public:
  virtual ~CausalLM() = default;

  // input_ids: int32 or int64 [B, T]. Returns logits [B, T, vocab_size].
  // recurrent_states (optional) carries each layer's recurrent state across calls, which is how an RNN reads
  // unlimited context: on input, a layer's entry (if defined) is its initial state; on return, every entry holds
  // that layer's final state. Null: every sequence starts from the zero state.
  // resets (optional): int32 [B, T], nonzero where every layer's recurrent state restarts from zero before that
  // position (the first token of a document in a packed sequence; a carried state reaches nothing from the first
  // reset on). Undefined: none.
  virtual Var forward(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states = nullptr,
                      const Tensor& resets = Tensor()) const = 0;
  // forward without the LM head: the final normed hidden states [B, T, D], which forward multiplies by lm_head().
  // Training feeds them to linear_cross_entropy, which never holds the whole batch's logits.
  virtual Var forward_hidden(Tape& tape, const Tensor& input_ids, std::vector<Var>* recurrent_states = nullptr,
                             const Tensor& resets = Tensor()) const = 0;
  virtual const Var& lm_head() const = 0;  // [vocab, D]; the embedding matrix when tied
  // Decoding (models/generation.h), in the recurrent form and without gradients: token_ids, int32 or int64 [B], is
  // the next token of each sequence and `states` the layers' states after the tokens before (resized to one per
  // layer; undefined entries are zero states, as for a first token). Advances every state by the token and returns
  // its logits [B, vocab_size]: the logits forward gives at that position.
  virtual Tensor decode_step(const Tensor& token_ids, std::vector<RecurrentState>& states) const = 0;
  // The fused decoding path (models/fused_decoder.h): decode_step's function on buffers made once, with fused
  // per-layer steps and, on the GPU, a CUDA graph; it reads the weights as they are when made. Throws hgrn::Error
  // where fused_decoding_refusal() is not empty.
  virtual std::unique_ptr<FusedDecoder> make_fused_decoder(const FusedDecoderOptions& options) const = 0;
  // Why this model has no fused decoding path (empty: it has one), e.g. a token mixer without a fused step.
  virtual std::string fused_decoding_refusal() const = 0;

  // Moves every parameter to `device` (fp32 master weights stay fp32) and sets the dtype activations are computed
  // in: fp32, or bf16 on the GPU (mixed precision: GEMMs on bf16 copies of the weights, fp32 gradients).
  virtual void to_device(Device device, DType activation_dtype) = 0;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;
  // What the backward recomputes instead of keeping (config.model.memory at construction): the same bits either way.
  virtual void set_memory(const ModelMemoryConfig& memory) = 0;

  // Data parallelism overlaps the gradient reduction with the backward pass. The parameters fall into groups, in the
  // order their gradients become final during a backward; every parameter is in exactly one group. With a hook set,
  // the backward calls hook(group) as soon as every gradient of that group is complete (on the GPU: all kernels
  // writing them are queued).
  virtual std::vector<std::vector<Var>> gradient_ready_groups() const = 0;
  virtual void set_gradient_ready_hook(std::function<void(size_t group)> hook) = 0;
  // With a hook set, every forward calls hook(group) before it first reads that group's parameters (from the last
  // group to the first), so that data parallelism can let the weights' all-gather run on into the forward.
  virtual void set_parameters_needed_hook(std::function<void(size_t group)> hook) = 0;

  virtual const ModelConfig& config() const = 0;
  // In model_param_specs order, with their fla names and groups.
  virtual const std::vector<std::pair<ParamSpec, Var>>& parameters() const = 0;
  virtual const Var& parameter(const std::string& name) const = 0;  // throws if the model has no such tensor
  // Copies named tensors (a checkpoint's or an imported model's) into the parameters: the names and shapes must be
  // exactly the model's, in any order; `source` names where they came from in messages.
  virtual void load_parameters(const std::vector<std::pair<std::string, Tensor>>& tensors,
                               const std::string& source) = 0;
};

}  // namespace hgrn
