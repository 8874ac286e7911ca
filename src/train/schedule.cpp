// schedule.cpp: the learning-rate schedules of schedule.h.
#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace hgrn {

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"cosine", "linear", "inverse_sqrt", "constant", "wsd"};
  return names;
}

namespace {

std::string joined_schedule_names() {
  std::string s;
  for (const std::string& name : schedule_names()) s += (s.empty() ? "" : " | ") + name;
  return s;
}

// Fraction of the way from `begin` to `end` that `step` is, clamped to [0, 1]; an empty span counts as done.
double progress(int64_t step, int64_t begin, int64_t end) {
  if (end <= begin) return 1.0;
  return std::clamp(static_cast<double>(step - begin) / static_cast<double>(end - begin), 0.0, 1.0);
}

}  // namespace

double learning_rate(const TrainingConfig& t, int64_t step) {
  const auto& names = schedule_names();
  HGRN_CHECK(std::find(names.begin(), names.end(), t.schedule) != names.end(), "unknown learning-rate schedule '",
             t.schedule, "' (expected ", joined_schedule_names(), ")");
  HGRN_CHECK(std::isfinite(t.lr) && t.lr >= 0.0, "training.lr must be finite and non-negative, got ", t.lr);
  HGRN_CHECK(t.min_lr_ratio >= 0.0 && t.min_lr_ratio <= 1.0, "training.min_lr_ratio must be in [0, 1], got ",
             t.min_lr_ratio);
  HGRN_CHECK(t.warmup_steps >= 0, "training.warmup_steps must be non-negative, got ", t.warmup_steps);
  HGRN_CHECK(t.max_steps >= 1, "training.max_steps must be at least 1, got ", t.max_steps);
  HGRN_CHECK(step >= 0, "learning_rate: negative step ", step);

  const double peak = t.lr;
  const double floor = t.min_lr_ratio * t.lr;
  const int64_t warmup = t.warmup_steps;
  if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);

  if (t.schedule == "constant") return peak;
  if (t.schedule == "cosine") {
    const double p = progress(step, warmup, t.max_steps);
    return floor + (peak - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
  }
  if (t.schedule == "linear") return floor + (peak - floor) * (1.0 - progress(step, warmup, t.max_steps));
  if (t.schedule == "inverse_sqrt") {
    // max(W, 1): without warm-up the decay starts from the peak at step 0 instead of collapsing to zero.
    const double scale = static_cast<double>(std::max<int64_t>(warmup, 1));
    return std::max(floor, peak * std::sqrt(scale / static_cast<double>(step + 1)));
  }
  // wsd
  HGRN_CHECK(t.decay_fraction >= 0.0 && t.decay_fraction <= 1.0, "training.decay_fraction must be in [0, 1], got ",
             t.decay_fraction);
  const int64_t decay_steps = std::llround(t.decay_fraction * static_cast<double>(t.max_steps));
  // The decay never starts inside the warm-up: if the two would overlap, it is squeezed into what remains.
  const int64_t decay_start = std::max(warmup, t.max_steps - decay_steps);
  if (step < decay_start) return peak;
  return floor + (peak - floor) * (1.0 - progress(step, decay_start, t.max_steps));
}

}  // namespace hgrn
