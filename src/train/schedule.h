// schedule.h: the learning-rate schedules (TrainingConfig::schedule): a linear warm-up from zero followed by
// cosine, linear, inverse_sqrt, constant or wsd (warmup-stable-decay).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace hgrn {

// The learning rate for update number `step` (0-based). With peak = t.lr, floor = t.min_lr_ratio * t.lr and
// W = t.warmup_steps, N = t.max_steps:
//   step < W          peak * (step + 1) / W  (so the last warm-up update uses the peak)
//   cosine            floor + (peak - floor) * (1 + cos(pi * p)) / 2, p = (step - W) / (N - W), clamped to [0, 1]
//   linear            floor + (peak - floor) * (1 - p)
//   inverse_sqrt      max(floor, peak * sqrt(max(W, 1) / (step + 1)))
//   constant          peak
//   wsd               peak until the decay starts at S = max(W, N - round(decay_fraction * N)), then linearly to
//                     floor at step N: floor + (peak - floor) * (1 - (step - S) / (N - S))
// Steps past N stay at the schedule's end value. Throws hgrn::Error for an unknown schedule name or values out of
// range (negative lr or warm-up, max_steps < 1, min_lr_ratio or decay_fraction outside [0, 1]).
double learning_rate(const TrainingConfig& t, int64_t step);

// The schedule names learning_rate accepts, for messages and config validation.
const std::vector<std::string>& schedule_names();

}  // namespace hgrn
