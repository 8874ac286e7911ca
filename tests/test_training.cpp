// test_training.cpp: gradient accumulation over micro-batches equals one large batch, and a short training run
// on the built-in MQAR task whose loss falls by a stated margin.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "config/config.h"
#include "data/mqar.h"
#include "model/hgrn2.h"
#include "train/lm_loss.h"
#include "train/trainer.h"

namespace hgrn {
namespace {

// Returns the mean gradient of the first micro-batches of the generator, taken as `micro_batches` micro-batches
// of `micro_batch_size` each (each micro-batch loss seeded with 1/micro_batches, as the trainer does).
std::vector<std::vector<double>> accumulated_gradients(int64_t micro_batch_size, int64_t micro_batches) {
  ModelConfig c;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.expand_ratio = 8;
  c.vocab_size = 32;
  c.intermediate_size = 24;
  Rng rng(3);
  Hgrn2Model model(c, rng, DType::F64);
  MqarConfig task;
  task.num_kv_pairs = 3;
  MqarGenerator data(task, c.vocab_size, 16, 99);
  for (int64_t m = 0; m < micro_batches; ++m) {
    Tape tape;
    CrossEntropyResult r = language_model_loss(model, tape, data.next_batch(micro_batch_size));
    tape.backward(r.loss, Tensor::full({}, 1.0 / static_cast<double>(micro_batches), DType::F64));
  }
  std::vector<std::vector<double>> grads;
  for (const auto& [spec, var] : model.parameters()) grads.push_back(var->grad.to_double_vector());
  return grads;
}

TEST(Training, GradientAccumulationEqualsOneLargeBatch) {
  // MQAR gives every sequence the same number of targets, so the mean of micro-batch means is the batch mean.
  auto large = accumulated_gradients(8, 1);
  auto accumulated = accumulated_gradients(2, 4);
  ASSERT_EQ(large.size(), accumulated.size());
  for (size_t p = 0; p < large.size(); ++p)
    for (size_t i = 0; i < large[p].size(); ++i)
      EXPECT_NEAR(large[p][i], accumulated[p][i], 1e-12 * std::max(1.0, std::abs(large[p][i])))
          << "parameter " << p << " element " << i;
}

TEST(Training, ShortMqarRunLearns) {
  const std::string run_dir = ::testing::TempDir() + "/hgrn-short-run";
  std::filesystem::remove_all(run_dir);
  Config config = parse_config(R"(
model: {hidden_size: 32, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 64, intermediate_size: 64}
data: {task: mqar, seq_len: 32, mqar: {num_kv_pairs: 4}}
training: {micro_batch_size: 16, max_steps: 120, lr: 0.01, warmup_steps: 10, eval_interval: 0, eval_batches: 2, seed: 5}
logging: {log_interval: 40}
)",
                               "short-run.yaml", {"logging.run_dir=" + run_dir});
  std::ostringstream log;
  TrainingSummary s = train(config, log);
  SCOPED_TRACE(log.str());
  EXPECT_EQ(s.steps, 120);
  // From ln(64) ~ 4.16 at the start, 120 steps must take off at least 1.0 nat (stated margin): the model learns
  // the value alphabet at least; a broken gradient anywhere leaves the loss near its start.
  EXPECT_LT(s.final_loss, s.first_loss - 1.0);
  EXPECT_LT(s.eval_loss, s.first_loss - 1.0);
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/config.yaml"));
}

}  // namespace
}  // namespace hgrn
