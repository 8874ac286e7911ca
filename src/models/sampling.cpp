// sampling.cpp: the next-token choice, in transformers' order (RepetitionPenaltyLogitsProcessor, then the
// temperature, top-k and top-p warpers).
#include "models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace hgrn {

void check_sampling_options(const SamplingOptions& o) {
  HGRN_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
             "--temperature: expected a number >= 0 (0: greedy), got ", o.temperature);
  HGRN_CHECK(o.top_k >= 0, "--top-k: expected a count >= 0 (0: no cut), got ", o.top_k);
  HGRN_CHECK(o.top_p > 0 && o.top_p <= 1, "--top-p: expected a probability in (0, 1], got ", o.top_p);
  HGRN_CHECK(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0,
             "--repetition-penalty: expected a number > 0 (1: none), got ", o.repetition_penalty);
}

std::vector<double> penalized_logits(std::span<const double> logits, std::span<const int32_t> history,
                                     double repetition_penalty) {
  std::vector<double> out(logits.begin(), logits.end());
  if (repetition_penalty == 1.0) return out;
  std::vector<bool> seen(out.size(), false);
  for (const int32_t id : history) {
    if (id < 0 || static_cast<size_t>(id) >= out.size() || seen[id]) continue;
    seen[id] = true;
    out[id] = out[id] > 0 ? out[id] / repetition_penalty : out[id] * repetition_penalty;
  }
  return out;
}

std::vector<double> next_token_distribution(std::span<const double> logits, std::span<const int32_t> history,
                                            const SamplingOptions& options) {
  HGRN_CHECK(options.temperature > 0, "next_token_distribution: temperature 0 is greedy, not a distribution");
  std::vector<double> scores = penalized_logits(logits, history, options.repetition_penalty);
  const double top = *std::max_element(scores.begin(), scores.end());
  std::vector<double> p(scores.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::exp((scores[i] - top) / options.temperature);
  // Ids from the most likely down (the lower id first among equals): both cuts keep a prefix of this order.
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] > scores[b]; });
  size_t kept = order.size();
  if (options.top_k > 0 && static_cast<size_t>(options.top_k) < kept) {
    kept = static_cast<size_t>(options.top_k);
    while (kept < order.size() && scores[order[kept]] == scores[order[kept - 1]]) ++kept;  // ties with the k-th
  }
  double total = 0;
  for (size_t i = 0; i < kept; ++i) total += p[order[i]];
  if (options.top_p < 1.0) {
    double cumulative = 0;
    size_t nucleus = 0;
    while (nucleus < kept && cumulative < options.top_p * total) cumulative += p[order[nucleus++]];
    kept = std::max<size_t>(nucleus, 1);
    total = cumulative;
  }
  std::vector<double> distribution(p.size(), 0.0);
  for (size_t i = 0; i < kept; ++i) distribution[order[i]] = p[order[i]] / total;
  return distribution;
}

int32_t sample_next_token(std::span<const double> logits, std::span<const int32_t> history,
                          const SamplingOptions& options, Rng& rng) {
  HGRN_CHECK(!logits.empty(), "sample_next_token: no logits");
  if (options.temperature == 0) {
    const std::vector<double> scores = penalized_logits(logits, history, options.repetition_penalty);
    return static_cast<int32_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
  }
  const std::vector<double> distribution = next_token_distribution(logits, history, options);
  const double u = rng.uniform();
  double cumulative = 0;
  int32_t last_kept = 0;
  for (size_t i = 0; i < distribution.size(); ++i) {
    if (distribution[i] == 0) continue;
    cumulative += distribution[i];
    last_kept = static_cast<int32_t>(i);
    if (u < cumulative) return last_kept;
  }
  return last_kept;  // u within rounding of 1
}

}  // namespace hgrn
