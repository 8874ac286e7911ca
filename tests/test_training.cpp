// test_training.cpp: gradient accumulation over micro-batches equals one large batch, and a short training run
// on the built-in MQAR task whose loss falls by a stated margin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>


#include "config/config.h"
#include "io/checkpoint.h"
#include "io/hf_export.h"
#include "data/mqar.h"
#include "models/decoder_lm.h"
#include "models/registry.h"
#include "scratch_dir.h"
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
  DecoderLM model(c, rng, DType::F64);
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
  const testing::ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  // The default config's task, shrunk so that recall is learned in seconds: 2 pairs over 8 keys and 8 values.
  Config config = parse_config(R"(
model: {hidden_size: 64, num_hidden_layers: 2, expand_ratio: 16, vocab_size: 17}
data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}
training: {micro_batch_size: 32, max_steps: 150, lr: 0.003, warmup_steps: 20, weight_decay: 0.0,
           eval_interval: 0, eval_batches: 4, seed: 5, device: cpu}
logging: {log_interval: 50}
)",
                               "short-run.yaml", {"logging.run_dir=" + run_dir});
  std::ostringstream log;
  TrainingSummary s = train(config, log);
  SCOPED_TRACE(log.str());
  EXPECT_EQ(s.steps, 150);
  // Stated margins. The loss starts near ln(17) = 2.83; knowing only the value alphabet gives ln(8) = 2.08 and
  // accuracy 1/8. Seeds 5 to 8 all reach a loss of 0.66-0.76 and held-out accuracy 0.68-0.70, so: the loss
  // must fall below 1.0 (recall, not just the alphabet) and accuracy must exceed 4x chance. A wrong gradient in
  // any op leaves the loss near 2.1 or above.
  EXPECT_NEAR(s.first_loss, std::log(17.0), 0.3);
  EXPECT_LT(s.final_loss, 1.0);
  EXPECT_LT(s.eval_loss, 1.0);
  EXPECT_GT(s.eval_accuracy, 4 * s.chance_accuracy);
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/metrics.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/config.yaml"));
  EXPECT_TRUE(std::filesystem::exists(run_dir + "/checkpoints/step_00000150.h5"));
  // Every metrics line is a JSON object; values a CPU run does not have (MFU, GPU memory) are absent, not -1.
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  int train_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    ASSERT_TRUE(record.is_object()) << line;
    EXPECT_FALSE(record.contains("mfu")) << line;
    EXPECT_FALSE(record.contains("peak_memory_gib")) << line;
    if (record.at("kind") != "train") continue;
    ++train_lines;
    EXPECT_GT(record.at("tokens_per_s").get<double>(), 0) << line;
  }
  EXPECT_EQ(train_lines, 150 / 50 + 1);  // step 1, then every log_interval
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

Config resume_config(const std::string& run_dir, const std::string& device = "cpu",
                     const std::string& precision = "fp32") {
  return parse_config(R"(
model: {hidden_size: 16, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 41, intermediate_size: 32}
data: {task: mqar, seq_len: 32, mqar: {num_kv_pairs: 4}}
training: {micro_batch_size: 4, grad_accum_steps: 2, max_steps: 12, lr: 0.003, warmup_steps: 3, eval_interval: 0, eval_batches: 1}
checkpoint: {interval: 6, keep_last: 5}
logging: {log_interval: 100}
)",
                      "resume.yaml",
                      {"logging.run_dir=" + run_dir, "training.device=" + device, "training.precision=" + precision});
}

}  // namespace

// Straight: 12 steps, checkpoints after 6 and 12. Interrupted: a fresh run directory holding only the step-6
// checkpoint, resumed (checkpoint.resume: auto) to step 12. Losses and final weights must be the same bits.
// (Also run on the GPU by test_training_cuda.cpp.)
void expect_bitwise_resume(const std::string& device, const std::string& precision) {
  const testing::ScratchDir scratch;
  const std::string straight_dir = scratch / "straight", resumed_dir = scratch / "resumed";
  std::ostringstream log_a, log_b;
  TrainingSummary straight = train(resume_config(straight_dir, device, precision), log_a);
  ASSERT_EQ(straight.step_losses.size(), 12u);
  std::filesystem::create_directories(resumed_dir + "/checkpoints");
  std::filesystem::copy_file(straight_dir + "/checkpoints/step_00000006.h5",
                             resumed_dir + "/checkpoints/step_00000006.h5");
  TrainingSummary resumed = train(resume_config(resumed_dir, device, precision), log_b);
  SCOPED_TRACE(log_b.str());
  ASSERT_EQ(resumed.step_losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.step_losses[i], straight.step_losses[6 + i]) << "step " << 7 + i;
  EXPECT_EQ(resumed.tokens_seen, straight.tokens_seen);

  TrainingState a = load_checkpoint(straight_dir + "/checkpoints/step_00000012.h5");
  TrainingState b = load_checkpoint(resumed_dir + "/checkpoints/step_00000012.h5");
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t p = 0; p < a.params.size(); ++p) {
    const Tensor &wa = a.params[p].second, &wb = b.params[p].second;
    EXPECT_EQ(std::memcmp(wa.raw_data(), wb.raw_data(), wa.nbytes()), 0) << a.params[p].first;
    EXPECT_EQ(std::memcmp(a.adam_v[p].raw_data(), b.adam_v[p].raw_data(), wa.nbytes()), 0) << a.params[p].first;
  }
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.adam_step, 12);
}

namespace {

TEST(Training, ResumeFromCheckpointContinuesBitwiseIdentically) { expect_bitwise_resume("cpu", "fp32"); }

TEST(Training, ResumeNeverRefusesToOverwriteCheckpoints) {
  const testing::ScratchDir scratch;
  const std::string dir = scratch / "run";
  std::ostringstream log;
  Config config = resume_config(dir);
  config.training.max_steps = 6;
  train(config, log);
  config.checkpoint.resume = "never";
  try {
    train(config, log);
    FAIL() << "a second run with resume: never over existing checkpoints must refuse";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("would overwrite"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step_00000006.h5"));
}

TEST(Training, ResumeRefusesACheckpointOfAnotherModelShape) {
  const testing::ScratchDir scratch;
  const std::string dir = scratch / "run";
  std::ostringstream log;
  Config config = resume_config(dir);
  config.training.max_steps = 6;
  train(config, log);
  config.model.hidden_size = 24;
  config.training.max_steps = 8;
  try {
    train(config, log);
    FAIL() << "resuming a checkpoint of another model shape must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("D=16"), std::string::npos) << e.what();
  }
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A resume may extend max_steps without a word; a changed learning rate is refused (ConfigError naming the key and
// both values) unless allowed, and then kept as config.resume-6.yaml while config.yaml stays the original.
TEST(Training, ResumeWithAChangedConfigIsRefusedUnlessAllowedAndKeepsTheHistory) {
  const testing::ScratchDir scratch;
  const std::string dir = scratch / "run";
  std::ostringstream log;
  Config config = resume_config(dir);
  config.training.max_steps = 6;
  train(config, log);
  const std::string original = file_text(dir + "/config.yaml");
  ASSERT_NE(original.find("max_steps: 6"), std::string::npos) << original;

  Config changed = config;
  changed.training.max_steps = 8;
  changed.training.lr = 0.001;
  try {
    train(changed, log);
    FAIL() << "a resume with another learning rate must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("training.lr 0.003 -> 0.001"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("max_steps"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/checkpoints/step_00000008.h5"));
  EXPECT_EQ(file_text(dir + "/config.yaml"), original);

  std::ostringstream allowed_log;
  const TrainingSummary s = train(changed, allowed_log, TrainOptions{/*allow_config_change=*/true});
  EXPECT_EQ(s.steps, 8);
  EXPECT_NE(allowed_log.str().find("config change on resume: training.lr: 0.003 -> 0.001"), std::string::npos)
      << allowed_log.str();
  EXPECT_EQ(file_text(dir + "/config.yaml"), original);
  const std::string history = file_text(dir + "/config.resume-6.yaml");
  EXPECT_NE(history.find("#   training.lr: 0.003 -> 0.001"), std::string::npos) << history;
  EXPECT_NE(history.find("  lr: 0.001"), std::string::npos) << history;

  // Only a longer run: allowed as it is.
  Config longer = changed;
  longer.training.max_steps = 10;
  EXPECT_EQ(train(longer, log).steps, 10);
}

// A run killed after its last checkpoint (simulated: the steps after it logged, the checkpoint of step 12 missing,
// a last line cut short) and resumed leaves each step once in metrics.jsonl, with a record of where it resumed.
TEST(Training, ResumedRunLeavesNoDuplicateStepsInTheMetrics) {
  const testing::ScratchDir scratch;
  const std::string dir = scratch / "run";
  std::ostringstream log;
  Config config = resume_config(dir);
  config.logging.log_interval = 1;
  config.checkpoint.keep_last = 5;
  train(config, log);
  std::filesystem::remove(dir + "/checkpoints/step_00000012.h5");
  std::ofstream(dir + "/metrics.jsonl", std::ios::app) << "{\"kind\": \"train\", \"step\": 13, \"lo";
  train(config, log);
  std::vector<int64_t> train_steps;
  int resumes = 0;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("kind") == "train") train_steps.push_back(record.at("step").get<int64_t>());
    if (record.at("kind") == "resume") {
      ++resumes;
      EXPECT_EQ(record.at("step"), 6) << line;
    }
  }
  ASSERT_EQ(train_steps.size(), 12u);
  for (size_t i = 0; i < train_steps.size(); ++i) EXPECT_EQ(train_steps[i], static_cast<int64_t>(i) + 1);
  EXPECT_EQ(resumes, 1);
}

// lr 1e300 makes the first update overflow the weights: every later step is non-finite, is skipped and recorded,
// and after training.max_nonfinite_steps in a row the run stops with a clear message (not an internal check).
TEST(Training, NonFiniteStepsAreSkippedCountedAndStopTheRun) {
  const testing::ScratchDir scratch;
  const std::string dir = scratch / "run";
  std::ostringstream log;
  Config config = resume_config(dir);
  config.training.lr = 1e300;
  config.training.warmup_steps = 0;
  config.training.max_nonfinite_steps = 3;
  try {
    train(config, log);
    FAIL() << "a diverged run must stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training diverged: 3 steps in a row"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("training.lr"), std::string::npos) << e.what();
  }
  int nonfinite = 0;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (nlohmann::json::parse(line).at("kind") == "nonfinite") ++nonfinite;
  EXPECT_EQ(nonfinite, 3) << log.str();
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

TEST(Training, InitFromAnHfDirectoryStartsFromThoseWeights) {
  // A run that learned the task, exported like `hgrn export --format hf`, starts a new run: that run's first loss is
  // the trained model's, not a fresh initialisation's.
  const testing::ScratchDir scratch;
  const std::string base = scratch.str();
  const std::string task = R"(
model: {hidden_size: 64, num_hidden_layers: 2, expand_ratio: 16, vocab_size: 17}
data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}
training: {micro_batch_size: 32, max_steps: 150, lr: 0.003, warmup_steps: 20, weight_decay: 0.0, eval_interval: 0}
)";
  std::ostringstream log;
  TrainingSummary trained = train(parse_config(task, "init.yaml", {"logging.run_dir=" + base + "/a"}), log);
  ASSERT_LT(trained.final_loss, 1.0) << log.str();
  const TrainingState state = load_checkpoint(base + "/a/checkpoints/step_00000150.h5");
  const Config config = parse_config(task, "init.yaml");
  export_hf(config.model, state.params, base + "/hf", DType::F32);

  TrainingSummary fresh = train(parse_config(task, "init.yaml", {"logging.run_dir=" + base + "/b", "training.max_steps=1", "training.warmup_steps=0"}), log);
  TrainingSummary continued = train(parse_config(task, "init.yaml",
                                                 {"logging.run_dir=" + base + "/c", "training.max_steps=1", "training.warmup_steps=0",
                                                  "checkpoint.init_from=" + base + "/hf"}),
                                    log);
  EXPECT_GT(fresh.first_loss, 2.5) << log.str();
  EXPECT_LT(continued.first_loss, 1.2) << log.str();

  // A directory of another shape is refused with both shapes named.
  try {
    train(parse_config(task, "init.yaml",
                       {"logging.run_dir=" + base + "/d", "model.hidden_size=32", "model.expand_ratio=8",
                        "checkpoint.init_from=" + base + "/hf"}),
          log);
    FAIL() << "a model of another shape must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("D=64"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("D=32"), std::string::npos) << e.what();
  }
}

// GLA and RetNet train on the CPU: the short MQAR run's task and margins (the loss below 1.0 and held-out accuracy
// above 4x chance: recall learned), then the run's export (`hgrn export --format hf`, fla's form) starts a new run
// through checkpoint.init_from with the trained model's loss.
class LinearAttentionTraining : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearAttentionTraining, ShortMqarRunLearnsAndItsExportStartsANewRun) {
  const testing::ScratchDir scratch;
  const std::string base = scratch.str();
  const std::string task = "model: {type: " + GetParam() + R"(, hidden_size: 64, num_hidden_layers: 2, num_heads: 4,
        vocab_size: 17}
data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}
training: {micro_batch_size: 32, max_steps: 150, lr: 0.003, warmup_steps: 20, weight_decay: 0.0,
           eval_interval: 0, eval_batches: 4, seed: 5, device: cpu}
logging: {log_interval: 50}
)";
  std::ostringstream log;
  const TrainingSummary trained = train(parse_config(task, "short-run.yaml", {"logging.run_dir=" + base + "/a"}), log);
  SCOPED_TRACE(log.str());
  EXPECT_NEAR(trained.first_loss, std::log(17.0), 0.3);
  EXPECT_LT(trained.final_loss, 1.0);
  EXPECT_LT(trained.eval_loss, 1.0);
  EXPECT_GT(trained.eval_accuracy, 4 * trained.chance_accuracy);

  const TrainingState state = load_checkpoint(base + "/a/checkpoints/step_00000150.h5");
  export_hf(parse_config(task, "short-run.yaml").model, state.params, base + "/hf", DType::F32);
  const TrainingSummary continued =
      train(parse_config(task, "short-run.yaml",
                         {"logging.run_dir=" + base + "/b", "training.max_steps=1", "training.warmup_steps=0",
                          "checkpoint.init_from=" + base + "/hf"}),
            log);
  EXPECT_LT(continued.first_loss, 1.2);
}

INSTANTIATE_TEST_SUITE_P(Members, LinearAttentionTraining, ::testing::Values("gla", "retnet"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace hgrn
