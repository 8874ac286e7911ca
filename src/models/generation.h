// generation.h: text continuation with any CausalLM: the prompt runs through the chunkwise forward once (prefill),
// which leaves every layer's recurrent state; then one token at a time in the recurrent form (CausalLM::decode_step),
// so each new token costs the same time and memory however long the text already is.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "models/fused_decoder.h"
#include "models/sampling.h"

namespace hgrn {

// How the tokens after the prompt are decoded: op by op (CausalLM::decode_step), or on the fused path
// (models/fused_decoder.h: fused per-layer steps on buffers made once, a CUDA graph on the GPU), which falls back to
// op by op for a model that has none (the complex HGRU).
enum class DecodePath { Ops, Fused };

struct GenerationOptions {
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  uint64_t seed = 0;                 // sequence b draws from Rng(seed).fork(b): its tokens do not depend on the batch
  int64_t batch = 1;                 // continuations of the one prompt, decoded side by side
  std::optional<int32_t> eos_id;     // a sequence stops after sampling it (it is not part of the output)
  int64_t vocab_limit = 0;           // only ids below this are sampled (the tokenizer's vocabulary); 0: the model's
  DecodePath decode = DecodePath::Ops;
  DType fused_dtype = DType::BF16;   // the fused path's GEMM operands and activations (the model's dtype on the CPU)
  bool fused_graph = true;           // the fused path on the GPU: replay a CUDA graph of the token step
};

struct GeneratedSequence {
  std::vector<int32_t> ids;   // the new tokens, without the EOS
  bool stopped_at_eos = false;
};

struct GenerationResult {
  std::vector<GeneratedSequence> sequences;  // one per batch row
  int64_t prefill_tokens = 0;                // prompt tokens per sequence
  double prefill_seconds = 0;                // the prompt's forward, up to the first new token's logits
  int64_t decode_steps = 0;                  // tokens decoded per sequence (the first new token needs none)
  double decode_seconds = 0;
  bool fused = false;                        // decoded on the fused path
  bool graph = false;                        // ... replaying a CUDA graph
  double setup_seconds = 0;                  // making the fused path (its buffers, weight copies and graph)
  std::string fallback_reason;               // the fused path was asked for but the model has none: why

  // Tokens decoded per second over all sequences, and seconds per step (0 without steps).
  double decode_tokens_per_second() const {
    return decode_steps > 0 ? static_cast<double>(decode_steps * std::ssize(sequences)) / decode_seconds : 0.0;
  }
  double seconds_per_step() const { return decode_steps > 0 ? decode_seconds / static_cast<double>(decode_steps) : 0.0; }
};

// Columns [begin, begin + count) of int32 ids [B, T] (on the CPU), as a new contiguous tensor.
Tensor id_columns(const Tensor& ids, int64_t begin, int64_t count);

// Checks the prompt against the model (not empty; every id in [0, vocab_size)): throws hgrn::Error saying what is
// wrong.
void check_prompt(const std::vector<int32_t>& prompt, int64_t vocab_size);

// The layers' recurrent states after `prompt_ids` (int32 [B, T], T >= 1) and the logits [B, vocab] at its last
// position: the first T − 1 tokens through the model's forward (the chunkwise path where it is long), the last
// through decode_step.
Tensor prefill(const CausalLM& model, const Tensor& prompt_ids, std::vector<RecurrentState>& states);
// The same on the fused path: the forward's states go into `decoder` (made for prompt_ids' batch), whose step on the
// last token leaves the logits in decoder.logits().
void prefill(FusedDecoder& decoder, const CausalLM& model, const Tensor& prompt_ids);

// Continues `prompt` in options.batch sequences. on_tokens (optional) is called after each step with the token
// each sequence took (-1 for a sequence already stopped), for streaming.
GenerationResult generate(const CausalLM& model, const std::vector<int32_t>& prompt, const GenerationOptions& options,
                          const std::function<void(const std::vector<int32_t>& tokens)>& on_tokens = nullptr);

}  // namespace hgrn
