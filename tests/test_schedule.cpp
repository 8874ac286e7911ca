// test_schedule.cpp: every learning-rate schedule at the warm-up start and end, the middle and the end of
// training, monotonicity of the decaying part, the floor, and rejection of bad names and values.
#include <gtest/gtest.h>

#include <cmath>

#include "train/schedule.h"

namespace hgrn {
namespace {

// Peak 1, floor 0.1, 10 warm-up steps, 110 steps in all: the post-warm-up span is 100 steps.
TrainingConfig schedule_config(const std::string& name) {
  TrainingConfig t;
  t.schedule = name;
  t.lr = 1.0;
  t.min_lr_ratio = 0.1;
  t.warmup_steps = 10;
  t.max_steps = 110;
  t.decay_fraction = 0.2;
  return t;
}

void expect_non_increasing(const TrainingConfig& t, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s)
    EXPECT_LE(learning_rate(t, s + 1), learning_rate(t, s) + 1e-15) << t.schedule << " at step " << s;
}

TEST(Schedule, WarmupIsLinearFromZeroForEverySchedule) {
  for (const std::string& name : schedule_names()) {
    const TrainingConfig t = schedule_config(name);
    EXPECT_DOUBLE_EQ(learning_rate(t, 0), 0.1) << name;  // 1 / 10: the first update already moves
    EXPECT_DOUBLE_EQ(learning_rate(t, 4), 0.5) << name;
    EXPECT_DOUBLE_EQ(learning_rate(t, 9), 1.0) << name;  // the last warm-up update uses the peak
    for (int64_t s = 0; s < 9; ++s) EXPECT_LT(learning_rate(t, s), learning_rate(t, s + 1)) << name;
  }
}

TEST(Schedule, Cosine) {
  const TrainingConfig t = schedule_config("cosine");
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1.0);
  EXPECT_NEAR(learning_rate(t, 60), 0.55, 1e-12);  // halfway: floor + (peak - floor) / 2
  EXPECT_NEAR(learning_rate(t, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_GT(learning_rate(t, 109), 0.1);
  EXPECT_NEAR(learning_rate(t, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(t, 500), 0.1, 1e-12);  // past the end: stays at the floor
  expect_non_increasing(t, 9, 200);
}

TEST(Schedule, Linear) {
  const TrainingConfig t = schedule_config("linear");
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1.0);
  EXPECT_NEAR(learning_rate(t, 35), 0.1 + 0.9 * 0.75, 1e-12);
  EXPECT_NEAR(learning_rate(t, 60), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(t, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(t, 1000), 0.1, 1e-12);
  expect_non_increasing(t, 9, 200);
}

TEST(Schedule, InverseSqrt) {
  const TrainingConfig t = schedule_config("inverse_sqrt");
  EXPECT_NEAR(learning_rate(t, 10), std::sqrt(10.0 / 11.0), 1e-12);
  EXPECT_NEAR(learning_rate(t, 39), 0.5, 1e-12);   // sqrt(10 / 40)
  EXPECT_NEAR(learning_rate(t, 249), 0.2, 1e-12);  // sqrt(10 / 250)
  EXPECT_NEAR(learning_rate(t, 999), 0.1, 1e-12);  // sqrt(10 / 1000) meets the floor...
  EXPECT_NEAR(learning_rate(t, 100000), 0.1, 1e-12);  // ...and it never goes below
  expect_non_increasing(t, 9, 2000);

  TrainingConfig no_warmup = t;
  no_warmup.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(no_warmup, 0), 1.0);
  EXPECT_NEAR(learning_rate(no_warmup, 3), 0.5, 1e-12);
}

TEST(Schedule, Constant) {
  const TrainingConfig t = schedule_config("constant");
  for (int64_t s : {10, 60, 109, 110, 5000}) EXPECT_DOUBLE_EQ(learning_rate(t, s), 1.0) << s;
}

TEST(Schedule, WarmupStableDecay) {
  const TrainingConfig t = schedule_config("wsd");
  // decay_fraction 0.2 of 110 steps: the last 22 steps decay, from step 88.
  EXPECT_DOUBLE_EQ(learning_rate(t, 10), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(t, 60), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(t, 87), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(t, 88), 1.0);
  EXPECT_NEAR(learning_rate(t, 99), 1.0 - 0.9 * 11.0 / 22.0, 1e-12);
  EXPECT_LT(learning_rate(t, 89), 1.0);
  EXPECT_NEAR(learning_rate(t, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(t, 400), 0.1, 1e-12);
  expect_non_increasing(t, 9, 200);

  TrainingConfig no_decay = t;
  no_decay.decay_fraction = 0.0;
  EXPECT_DOUBLE_EQ(learning_rate(no_decay, 109), 1.0);
  TrainingConfig all_decay = t;
  all_decay.decay_fraction = 1.0;  // the decay cannot start inside the warm-up: it takes all that is left
  EXPECT_DOUBLE_EQ(learning_rate(all_decay, 10), 1.0);
  EXPECT_NEAR(learning_rate(all_decay, 60), 0.55, 1e-12);
}

TEST(Schedule, FloorFollowsMinLrRatioAndPeak) {
  TrainingConfig t = schedule_config("cosine");
  t.lr = 3e-3;
  t.min_lr_ratio = 0.0;
  EXPECT_NEAR(learning_rate(t, 9), 3e-3, 1e-18);
  EXPECT_NEAR(learning_rate(t, 110), 0.0, 1e-18);
  t.schedule = "linear";
  t.min_lr_ratio = 1.0;  // floor == peak: flat after warm-up
  EXPECT_DOUBLE_EQ(learning_rate(t, 60), 3e-3);
  for (const std::string& name : schedule_names()) {
    TrainingConfig c = schedule_config(name);
    for (int64_t s = 10; s < 300; ++s) EXPECT_GE(learning_rate(c, s), 0.1 - 1e-12) << name << " at " << s;
  }
}

TEST(Schedule, NoWarmupStartsAtPeak) {
  for (const std::string& name : schedule_names()) {
    TrainingConfig t = schedule_config(name);
    t.warmup_steps = 0;
    EXPECT_DOUBLE_EQ(learning_rate(t, 0), 1.0) << name;
  }
}

TEST(Schedule, RejectsUnknownNamesAndBadValues) {
  EXPECT_THROW(learning_rate(schedule_config("cosine_with_restarts"), 0), Error);
  EXPECT_THROW(learning_rate(schedule_config(""), 0), Error);
  try {
    learning_rate(schedule_config("Cosine"), 0);
    FAIL() << "an unknown schedule must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Cosine"), std::string::npos);
  }
  TrainingConfig t = schedule_config("cosine");
  EXPECT_THROW(learning_rate(t, -1), Error);
  TrainingConfig bad = t;
  bad.lr = -1.0;
  EXPECT_THROW(learning_rate(bad, 0), Error);
  bad = t;
  bad.min_lr_ratio = 1.5;
  EXPECT_THROW(learning_rate(bad, 0), Error);
  bad = t;
  bad.warmup_steps = -3;
  EXPECT_THROW(learning_rate(bad, 0), Error);
  bad = t;
  bad.max_steps = 0;
  EXPECT_THROW(learning_rate(bad, 0), Error);
  bad = schedule_config("wsd");
  bad.decay_fraction = 1.5;
  EXPECT_THROW(learning_rate(bad, 50), Error);
}

}  // namespace
}  // namespace hgrn
