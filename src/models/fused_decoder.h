// fused_decoder.h: the fast decoding path. Everything a token step touches is allocated once (the activations, the
// logits, every layer's recurrent state, which is updated in place), the GEMMs read the weights' compute copies made
// once (bf16 on the GPU, shared with the model's own forward), each layer's mixer runs its fused step (the recurrence
// and its gates in one kernel that reads and writes the state once: TokenMixer::make_fused_step), and on the GPU the
// whole token step, embedding to logits and the greedy choice, is captured once in a CUDA graph and replayed, so the
// host is off the critical path. The same steps run eagerly on the CPU (no graph there), which is how they are
// tested against CausalLM::decode_step without a GPU.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/autograd.h"
#include "models/token_mixer.h"

namespace hgrn {

class CudaGraph;
class HostReadback;

struct FusedDecoderOptions {
  int64_t batch = 1;  // sequences decoded side by side
  // The GEMMs' operands and the activations: bf16 (the weights' bf16 copies) or fp32 on the GPU; on the CPU the
  // model's own dtype (fp32 or fp64).
  DType dtype = DType::BF16;
  // GPU: capture the token step in a CUDA graph and replay it; false launches the same kernels one by one.
  bool graph = true;
  // greedy_tokens() chooses among ids below this (the tokenizer's vocabulary); 0: the model's whole vocabulary.
  int64_t vocab_limit = 0;
};

// The decoder's parameters that the fused path reads (DecoderLM hands them over).
struct FusedDecoderWeights {
  Var embeddings, lower_bounds, final_norm, lm_head;  // lower_bounds: null without lower bounds
  struct Layer {
    Var attn_norm, mlp_norm, gate_proj, up_proj, down_proj;
    const std::vector<Var>* mixer = nullptr;  // the token mixer's parameters (ModelFamily::mixer_param_specs order)
  };
  std::vector<Layer> layers;
};

class FusedDecoder {
 public:
  // Reads the weights as they are now: make a new decoder after changing them. Throws hgrn::Error where the token
  // mixer has no fused step (TokenMixer::fused_step_refusal), or the options do not fit the device.
  FusedDecoder(const ModelConfig& config, const FusedDecoderWeights& weights, const TokenMixer& mixer, Device device,
               const FusedDecoderOptions& options);
  ~FusedDecoder();
  FusedDecoder(const FusedDecoder&) = delete;
  FusedDecoder& operator=(const FusedDecoder&) = delete;

  int64_t batch() const { return batch_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool uses_graph() const;

  // Every layer's state from `states` (one per layer, as prefill or CausalLM::forward leave them; an undefined one is
  // the zero state), copied into the decoder's own buffers.
  void set_states(const std::vector<RecurrentState>& states);
  // Copies of the layers' states now, in the layout and dtype of CausalLM::decode_step's (fp32 on the GPU).
  std::vector<RecurrentState> states() const;

  // One token per sequence, int32 [batch] on the host, each in [0, vocab): advances every layer's state and leaves
  // the logits of the next position in logits() and their greedy choice in greedy_tokens(). Queued on the GPU;
  // reading either waits for it.
  void step(const Tensor& token_ids);
  // [batch, vocab]: fp32 on the GPU, the model's dtype on the CPU; on the model's device, overwritten by the next
  // step.
  const Tensor& logits() const { return logits_; }
  // Per sequence, the lowest id below vocab_limit of the largest logit (row_argmax, on the device), on the host.
  std::vector<int32_t> greedy_tokens() const;

  // Greedy decoding ahead of the host: queues a step fed with the decoder's own choices (those greedy_tokens() would
  // return now: the last step's, on the device) and then a copy of its choices to the host, and returns a ticket for
  // queued_greedy_tokens. The GPU runs queued steps back to back while the host reads the earlier ones' choices.
  int64_t queue_greedy_step();
  // The choices of a queued greedy step, once it is done; readable until kQueuedGreedySteps more steps are queued.
  std::vector<int32_t> queued_greedy_tokens(int64_t ticket);
  static constexpr int kQueuedGreedySteps = 3;

 private:
  struct Layer {
    Tensor attn_norm, mlp_norm, down;
    std::vector<Tensor> gate_up;  // gate_proj's and up_proj's compute tensors
    std::unique_ptr<FusedMixerStep> mixer;
  };
  // Queues the token step for the tokens in ids_ (what the graph captures).
  void enqueue_step();

  int64_t batch_, vocab_, vocab_limit_, mlp_width_;
  double norm_eps_;
  Device device_;
  DType dtype_;
  Tensor embeddings_, gamma_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  // ids_: the step's input tokens, then its greedy choices (row_argmax writes them over the input).
  Tensor ids_, h_, x_, rstd_, gate_up_, hidden_, logits_;
  std::unique_ptr<CudaGraph> graph_;
  std::unique_ptr<HostReadback> readback_;  // the GPU's queued choices
  std::vector<int32_t> queued_choices_;     // the CPU's: kQueuedGreedySteps rows of batch ids
  int64_t queued_tickets_ = 0;
};

}  // namespace hgrn
