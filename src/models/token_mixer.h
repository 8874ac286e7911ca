// token_mixer.h: what a family member plugs into the shared decoder (models/decoder_lm.h): its token mixer, the
// layer's sequence-mixing half, and the memory-policy helpers every mixer uses the same way.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/autograd.h"
#include "ops/recompute.h"

namespace hgrn {

// One layer's call of a token mixer.
struct MixerCall {
  int64_t layer = 0;                    // ℓ
  int64_t num_layers = 0;               // L
  const std::vector<Var>* weights;      // the layer's mixer parameters, in ModelFamily::mixer_param_specs order
  const ModelMemoryConfig* memory;      // what the backward recomputes
  Var x;                                // attn_norm(h), the mixer's input [B, T, D]
  Var gamma;                            // the lower bounds' γ [L, gate width] (undefined without lower bounds)
  Var h;                                // the residual stream: the mixer returns h + Mixer(x)
  Var* state = nullptr;                 // optional carried state: in, the initial one (undefined: zero); out, final
  Tensor resets;                        // optional int32 [B, T] on x's device: nonzero where the recurrent state
                                        // restarts before that position (a document start; ops/sequence_resets.h),
                                        // the carried state included; undefined: none
};

// One layer's recurrent state while decoding: the fixed-size memory of everything the layer has read, however long
// the text. Its tensor is the layer's carried state as forward gives it (HGRN2, GLA and RetNet [B, H, K, V], HGRN1
// [B, E], the complex HGRU [B, 2, d]), on the model's device; undefined means the zero state (nothing read yet).
struct RecurrentState {
  Tensor tensor;
  // The tensor as a Var for the ops' initial_state (null for the zero state).
  Var as_initial_state() const { return tensor.defined() ? make_var(tensor) : nullptr; }
};

// One decoding step's call of a layer's mixer: one new token per sequence, no gradients.
struct MixerStep {
  int64_t layer = 0;                         // ℓ
  int64_t num_layers = 0;                    // L
  const std::vector<Var>* weights = nullptr;  // as MixerCall::weights
  Var x;                                     // attn_norm(h) of the new tokens [B, 1, D]
  Var gamma;                                 // as MixerCall::gamma
  Var h;                                     // the residual stream [B, 1, D]
};

// What a layer's fused decoding step (below) is made with, once per generation (models/fused_decoder.h).
struct FusedStepSetup {
  int64_t layer = 0;                          // ℓ
  int64_t num_layers = 0;                     // L
  int64_t batch = 0;                          // sequences decoded side by side
  const std::vector<Var>* weights = nullptr;  // as MixerCall::weights
  Tensor gamma;                               // γ [L, gate width] (lower_bound_transform), undefined without bounds
  // The step's input is attn_norm(h) of the new tokens, which run(h) makes itself as its first product reads it
  // (ops/linear.h: normed_linear_product_into, with input_norm's weight and norm_eps). x [batch, D] is the buffer for
  // it where that product cannot make it, rstd [batch] the norm's statistics'; x's dtype is the decoding dtype (the
  // GEMMs' operands: bf16 or fp32 on the GPU, the model's dtype on the CPU), its device the model's.
  Tensor x;
  Tensor input_norm;
  double norm_eps = 0;
  Tensor rstd;
};

// A layer's mixer step on the fused decoding path: made once with every buffer it uses, so that run() allocates
// nothing, reads the weights as they were when it was made, and queues device work only (on the GPU the whole token
// step is captured in a CUDA graph and replayed).
class FusedMixerStep {
 public:
  virtual ~FusedMixerStep() = default;
  // h [batch, D] (the decoding dtype) += Mixer(x) for the tokens whose attn_norm(h) is in the setup's x, advancing
  // the state in place.
  virtual void run(Tensor& h) = 0;
  // The layer's recurrent state, laid out as RecurrentState::tensor (fp32 on the GPU, the model's dtype on the CPU);
  // zeros when made.
  virtual Tensor& state() = 0;
};

class TokenMixer {
 public:
  virtual ~TokenMixer() = default;
  // Records the layer's mixer on the tape and returns h + Mixer(x) (the residual add made by its last GEMM).
  virtual Var forward(Tape& tape, const MixerCall& call) const = 0;
  // The recurrent form for decoding, on a disabled tape: reads `state` (the state after the tokens before),
  // replaces it with the state after the new token, and returns h + Mixer(x) [B, 1, D]. Given the state forward
  // leaves after a prefix, a step gives the output forward would give at the next position.
  virtual Var step(Tape& tape, const MixerStep& call, RecurrentState& state) const = 0;
  // The fused form of step for the fused decoding path (models/fused_decoder.h): the same function on buffers made
  // once, with the layer's recurrence, gates and the elementwise work around them in as few kernels as the maths
  // allows. A mixer without one says why in fused_step_refusal (the model then decodes op by op).
  virtual std::string fused_step_refusal() const { return "this token mixer has no fused decoding step"; }
  virtual std::unique_ptr<FusedMixerStep> make_fused_step(const FusedStepSetup& setup) const;
};

// As fla: a mixer's chunk form only under attn_mode chunk and for sequences longer than 64 tokens, the step-by-step
// form otherwise (also in training). Both compute the same function; the choice is about speed.
bool uses_chunk_form(const ModelConfig& config, int64_t seq_len);
// Whether layer `layer` of `num_layers` recomputes its gates in the backward (recompute_elementwise, with
// recompute_gates or among the last recompute_gates_layers) instead of keeping them.
bool recomputes_gates(const ModelMemoryConfig& memory, int64_t layer, int64_t num_layers);
// The policy layer `layer` runs under: the model's, with recompute_elementwise off in the first
// keep_elementwise_layers layers. The decoder hands each layer its own (MixerCall::memory); the memory estimate
// counts each layer by it.
ModelMemoryConfig layer_memory(const ModelMemoryConfig& memory, int64_t layer);
// rematerialize(tape, vars, values) when memory.recompute_elementwise is on; else the values are kept.
void recompute_in_backward(Tape& tape, const ModelMemoryConfig& memory, const std::vector<Var>& vars,
                           RematerializeFn values);
// Under recompute_elementwise: an RMSNorm output `normed` of `input` is not kept for the backward; it comes back in
// the norm's own backward, or (read_early: something reads it before then) by a forward of its own.
void free_norm_output(Tape& tape, const ModelMemoryConfig& memory, const Var& normed, const Var& input,
                      const Var& weight, double eps, bool read_early);

}  // namespace hgrn
