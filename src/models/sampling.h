// sampling.h: how generation picks the next token from a row of logits, with transformers' generate() semantics:
// the repetition penalty, then the temperature, then top-k, then top-p (nucleus); temperature 0 is greedy.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.h"

namespace hgrn {

struct SamplingOptions {
  double temperature = 1.0;         // 0: greedy (the most likely token after the penalty)
  int64_t top_k = 0;                // keep the k most likely tokens (ties with the k-th kept too); 0: all
  double top_p = 1.0;               // keep the fewest most likely tokens whose probability reaches p; 1: all
  double repetition_penalty = 1.0;  // a token already in the history: logit / r if positive, logit · r if not
};

// Throws hgrn::Error naming the option that is out of range (temperature >= 0, top_k >= 0, 0 < top_p <= 1,
// repetition_penalty > 0).
void check_sampling_options(const SamplingOptions& options);

// The logits after the repetition penalty for every distinct id in `history`.
std::vector<double> penalized_logits(std::span<const double> logits, std::span<const int32_t> history,
                                     double repetition_penalty);

// The distribution the next token is drawn from (temperature > 0): softmax(penalized logits / temperature), cut to
// top-k and then to top-p, and renormalised. Zero outside what is kept.
std::vector<double> next_token_distribution(std::span<const double> logits, std::span<const int32_t> history,
                                            const SamplingOptions& options);

// The next token: the argmax of the penalized logits (the lowest id among equals) for temperature 0, else a draw
// from next_token_distribution using one uniform number of `rng`.
int32_t sample_next_token(std::span<const double> logits, std::span<const int32_t> history,
                          const SamplingOptions& options, Rng& rng);

}  // namespace hgrn
