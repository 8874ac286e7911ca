// test_stateful_training.cpp: data.stateful (truncated backpropagation through time): the streams each row reads
// and how ranks split them; a stateful run's windows, read with the carried states, equal one long forward over
// each stream for every family member (fp64); stopped and resumed equals uninterrupted bit for bit; and the
// refusals: MQAR, a shuffled order, a corpus too short, a checkpoint without states or with states of another shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "config/config.h"
#include "data/data_sources.h"
#include "data/token_streams.h"
#include "hgrn_binary.h"
#include "io/checkpoint.h"
#include "model_fixtures.h"
#include "models/decoder_lm.h"
#include "scratch_dir.h"
#include "token_shard_fixtures.h"
#include "train/carried_states.h"
#include "train/trainer.h"

namespace hgrn {
namespace {

using testing::ScratchDir;
using testing::write_random_token_shard;

std::vector<int32_t> shard_tokens(const TokenShardReader& shard) {
  std::vector<int32_t> tokens(static_cast<size_t>(shard.num_tokens()));
  shard.read(0, shard.num_tokens(), tokens.data());
  return tokens;
}

// ---- the streams ----

TEST(StreamWindowSampler, RowsReadTheirStreamWindowByWindowAndStartAgainEachEpoch) {
  const ScratchDir dir;
  write_random_token_shard(dir / "s", 50, 200, 1);
  auto shard = std::make_shared<const TokenShardReader>(dir / "s");
  const std::vector<int32_t> tokens = shard_tokens(*shard);
  // 3 rows per step (a micro-batch of 2, then one of 1), T = 10: L = floor(199 / 3) = 66, K = 6 windows a stream.
  StreamWindowSampler sampler(shard, {10, 3, 0, 1});
  ASSERT_EQ(sampler.layout().length, 66);
  ASSERT_EQ(sampler.windows_per_stream(), 6);
  for (int64_t step = 0; step < 8; ++step) {
    const int64_t window = step % 6;
    EXPECT_EQ(sampler.next_batch_continues_streams(), window != 0) << "step " << step;
    const TokenBatch first = sampler.next_batch(2);
    EXPECT_EQ(sampler.next_batch_continues_streams(), window != 0) << "a step's second micro-batch, step " << step;
    const TokenBatch second = sampler.next_batch(1);
    for (int64_t row = 0; row < 3; ++row) {
      const TokenBatch& batch = row < 2 ? first : second;
      const int64_t r = row < 2 ? row : 0;
      const int64_t start = row * 66 + window * 10;
      for (int64_t t = 0; t < 10; ++t) {
        const std::string where = "step " + std::to_string(step) + " row " + std::to_string(row);
        ASSERT_EQ(batch.inputs.data<int32_t>()[r * 10 + t], tokens[start + t]) << where;
        ASSERT_EQ(batch.targets.data<int32_t>()[r * 10 + t], tokens[start + t + 1]) << where;
      }
    }
  }
  EXPECT_EQ(sampler.cursor(), 24u);
  // A batch may not run past a step's rows.
  sampler.set_cursor(2);
  EXPECT_THROW(sampler.next_batch(2), Error);
}

TEST(StreamWindowSampler, RanksReadDisjointStreamsThatTogetherAreOneProcesssStreams) {
  const ScratchDir dir;
  write_random_token_shard(dir / "s", 50, 400, 2);
  auto shard = std::make_shared<const TokenShardReader>(dir / "s");
  // One process with 4 rows a step, and 2 ranks with 2 rows each: the same 4 streams, rank r taking rows 2r, 2r + 1.
  StreamWindowSampler one(shard, {8, 4, 0, 1}), rank0(shard, {8, 2, 0, 2}), rank1(shard, {8, 2, 1, 2});
  ASSERT_EQ(rank0.layout().length, one.layout().length);
  for (int step = 0; step < 3; ++step) {
    const TokenBatch all = one.next_batch(4), a = rank0.next_batch(2), b = rank1.next_batch(2);
    std::set<std::vector<int32_t>> seen;
    for (int64_t row = 0; row < 4; ++row) {
      const TokenBatch& part = row < 2 ? a : b;
      const int32_t* mine = part.inputs.data<int32_t>() + (row % 2) * 8;
      EXPECT_EQ(std::memcmp(mine, all.inputs.data<int32_t>() + row * 8, 8 * sizeof(int32_t)), 0)
          << "step " << step << ": global row " << row;
      seen.insert(std::vector<int32_t>(mine, mine + 8));
    }
    EXPECT_EQ(seen.size(), 4u) << "the ranks' rows read the same tokens";
  }
  EXPECT_EQ(rank1.stream_of_row(0), 2);
}

// ---- the forward over windows ----

class StatefulWindows : public ::testing::TestWithParam<std::string> {};

// Two micro-batches of 2 rows read 4 streams for K + 1 steps through the trainer's pieces (StreamWindowSampler,
// CarriedStates, forward_hidden with the tape recording and a backward after each micro-batch): each window's hidden
// states equal those of one forward over the stream's first windows, and the step after a stream's last window
// starts it again from a zero state. T = 7 takes the step-by-step path, T = 70 the chunkwise one with a partial
// chunk.
TEST_P(StatefulWindows, EqualOneLongForwardOverTheirConcatenation) {
  const ModelConfig c = testing::tiny_config(GetParam());
  Rng rng(61);
  DecoderLM model(c, rng, DType::F64);
  testing::randomise_lower_bounds(model, rng);
  const ScratchDir dir;
  write_random_token_shard(dir / "s", c.vocab_size, 4 * 215 + 1, 62);  // L = 215 per stream
  auto shard = std::make_shared<const TokenShardReader>(dir / "s");
  for (const int64_t T : {7, 70}) {
    SCOPED_TRACE("seq_len " + std::to_string(T));
    StreamWindowSampler sampler(shard, {T, 4, 0, 1});
    // T = 70: all K = 3 windows, then the first again (a new epoch); T = 7: the first 4 of 30 windows.
    ASSERT_EQ(sampler.windows_per_stream(), 215 / T);
    const int64_t K = T == 70 ? sampler.windows_per_stream() : 4, steps = T == 70 ? K + 1 : K, D = c.hidden_size;
    std::vector<std::vector<double>> whole;  // per stream: hidden states [K·T, D] of one forward
    Tape untaped;
    untaped.set_enabled(false);
    for (int64_t s = 0; s < 4; ++s) {
      const TokenBatch stream = read_token_spans(*shard, {sampler.layout().start(s)}, K * T);
      whole.push_back(model.forward_hidden(untaped, stream.inputs)->value.to_double_vector());
    }
    CarriedStates carried(model, 2, 2);
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t window = step % sampler.windows_per_stream();
      for (int64_t m = 0; m < 2; ++m) {
        Tape tape;
        std::vector<Var>* states = carried.begin(m, sampler.next_batch_continues_streams());
        ASSERT_EQ(states->size(), 3u);
        const std::vector<Var> initial = *states;
        for (const Var& state : initial) ASSERT_FALSE(wants_grad(state)) << "a carried state must be detached";
        const TokenBatch batch = sampler.next_batch(2);
        const Var hidden = model.forward_hidden(tape, batch.inputs, states);
        const std::vector<double> got = hidden->value.to_double_vector();
        tape.backward(hidden, Tensor::full(hidden->value.shape(), 1.0, DType::F64));
        for (const Var& state : initial) EXPECT_FALSE(state->grad.defined()) << "a gradient crossed the window";
        carried.end(m);
        for (int64_t b = 0; b < 2; ++b)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t d = 0; d < D; ++d) {
              const double want = whole[2 * m + b][((window * T) + t) * D + d];
              ASSERT_NEAR(got[(b * T + t) * D + d], want, 1e-10)
                  << "step " << step << ", micro-batch " << m << ", row " << b << ", position " << t;
            }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StatefulWindows, ::testing::ValuesIn(testing::model_variants()),
                         testing::variant_test_name);

// ---- training, checkpoints and resume ----

// S = 4 streams (2 x 2 rows), T = 16: a 341-token shard gives L = 85, so K = 5 windows a stream; 12 steps cross two
// epoch starts (steps 6 and 11), and the step-6 checkpoint lies between them.
std::string stateful_shard(const ScratchDir& dir) {
  const std::string prefix = dir / "tokens";
  if (!std::filesystem::exists(shard_idx_path(prefix))) write_random_token_shard(prefix, 17, 341, 7);
  return prefix;
}

Config stateful_config(const std::string& shard, const std::string& run_dir, const std::string& device = "cpu",
                       const std::string& precision = "fp32", const std::string& model = "hgrn2",
                       std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.end(), {"data.train_data=" + shard, "logging.run_dir=" + run_dir,
                                     "training.device=" + device, "training.precision=" + precision});
  if (model == "hgrn-complex") overrides.insert(overrides.end(), {"model.type=hgrn", "model.complex=true"});
  else overrides.push_back("model.type=" + model);
  // The mixer's width: HGRN2's key width per head, HGRN1's multiple of hidden_size; GLA's and RetNet's heads.
  if (model == "gla" || model == "retnet") overrides.insert(overrides.end(), {"model.expand_ratio=null", "model.num_heads=2"});
  else overrides.push_back("model.expand_ratio=8");
  return parse_config(R"(
model: {hidden_size: 16, num_hidden_layers: 2, vocab_size: 17, intermediate_size: 32}
data: {task: tokens, seq_len: 16, stateful: true}
training: {micro_batch_size: 2, grad_accum_steps: 2, max_steps: 12, lr: 0.003, warmup_steps: 3, eval_interval: 0,
           eval_batches: 1}
checkpoint: {interval: 6, keep_last: 5}
logging: {log_interval: 100}
)",
                      "stateful.yaml", overrides);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

// Straight: 12 steps, checkpoints after 6 and 12. Interrupted: a fresh run directory holding only the step-6
// checkpoint, resumed to step 12. Losses, weights, moments and carried states must be the same bits. (Also run on
// the GPU by test_stateful_training_cuda.cpp.)
void expect_stateful_bitwise_resume(const std::string& device, const std::string& precision,
                                    const std::string& model) {
  const ScratchDir scratch;
  const std::string shard = stateful_shard(scratch);
  const std::string straight_dir = scratch / "straight", resumed_dir = scratch / "resumed";
  std::ostringstream log_a, log_b;
  const TrainingSummary straight = train(stateful_config(shard, straight_dir, device, precision, model), log_a);
  ASSERT_EQ(straight.step_losses.size(), 12u) << log_a.str();
  EXPECT_NE(log_a.str().find("data: 4 contiguous streams of 85 tokens"), std::string::npos) << log_a.str();
  std::filesystem::create_directories(resumed_dir + "/checkpoints");
  std::filesystem::copy_file(straight_dir + "/checkpoints/step_00000006.h5",
                             resumed_dir + "/checkpoints/step_00000006.h5");
  const TrainingSummary resumed = train(stateful_config(shard, resumed_dir, device, precision, model), log_b);
  SCOPED_TRACE(log_b.str());
  ASSERT_EQ(resumed.step_losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed.step_losses[i], straight.step_losses[6 + i]) << "step " << 7 + i;

  const TrainingState mid = load_checkpoint(straight_dir + "/checkpoints/step_00000006.h5");
  const TrainingState a = load_checkpoint(straight_dir + "/checkpoints/step_00000012.h5");
  const TrainingState b = load_checkpoint(resumed_dir + "/checkpoints/step_00000012.h5");
  for (size_t p = 0; p < a.params.size(); ++p) {
    EXPECT_TRUE(same_bits(a.params[p].second, b.params[p].second)) << a.params[p].first;
    EXPECT_TRUE(same_bits(a.adam_v[p], b.adam_v[p])) << a.params[p].first;
  }
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  // Per layer every stream's state [4, ...], fp32; the step-6 states are not zero (they carry the epoch's first
  // window), so a resume that dropped them would not give the straight run's losses.
  ASSERT_EQ(mid.recurrent_states.size(), 2u);
  ASSERT_EQ(a.recurrent_states.size(), 2u);
  ASSERT_EQ(b.recurrent_states.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(mid.recurrent_states[l].size(0), 4);
    EXPECT_EQ(mid.recurrent_states[l].dtype(), DType::F32);
    double norm = 0;
    for (const double x : mid.recurrent_states[l].to_double_vector()) norm += x * x;
    EXPECT_GT(norm, 0) << "layer " << l;
    EXPECT_TRUE(same_bits(a.recurrent_states[l], b.recurrent_states[l])) << "layer " << l;
  }
}

namespace {

class StatefulResume : public ::testing::TestWithParam<std::string> {};

TEST_P(StatefulResume, StoppedAndResumedEqualsUninterruptedBitForBit) {
  expect_stateful_bitwise_resume("cpu", "fp32", GetParam());
}

INSTANTIATE_TEST_SUITE_P(Models, StatefulResume, ::testing::ValuesIn(testing::model_variants()),
                         testing::variant_test_name);

// training_step starts each micro-batch from the states it carried: the same rows from zero states give the same
// first step (every stream starts at zero) and other losses from the second step on.
TEST(StatefulTraining, StepsStartFromTheCarriedStates) {
  const ScratchDir scratch;
  const Config config = stateful_config(stateful_shard(scratch), scratch / "run");
  // The same batches, but every step's rows announced as starting afresh.
  struct StartsAfresh : BatchSource {
    explicit StartsAfresh(BatchSource& rows) : inner(rows) {}
    TokenBatch next_batch(int64_t n) override { return inner.next_batch(n); }
    uint64_t cursor() const override { return inner.cursor(); }
    void set_cursor(uint64_t c) override { inner.set_cursor(c); }
    BatchSource& inner;
  };
  const auto losses = [&](bool carry) {
    TrainingModel setup(config, 5, Device::CPU, DType::F32);
    EXPECT_NE(setup.carried_states, nullptr);
    const std::unique_ptr<BatchSource> rows = make_training_source(config, 1);
    StartsAfresh afresh(*rows);
    std::vector<double> out;
    for (int step = 0; step < 3; ++step)
      out.push_back(training_step(setup, carry ? *rows : afresh, config.training, config.training.lr).loss);
    return out;
  };
  const std::vector<double> carried = losses(true), fresh = losses(false);
  EXPECT_EQ(carried[0], fresh[0]);
  EXPECT_NE(carried[1], fresh[1]);
  EXPECT_NE(carried[2], fresh[2]);
}

TEST(StatefulTraining, ResumeRefusesACheckpointWithoutStatesOrWithStatesOfAnotherShape) {
  const ScratchDir scratch;
  const std::string shard = stateful_shard(scratch);
  Config config = stateful_config(shard, scratch / "run");
  config.training.max_steps = 2;
  config.checkpoint.interval = 0;
  std::ostringstream log;
  train(config, log);
  const TrainingState good = load_checkpoint(scratch / "run/checkpoints/step_00000002.h5");
  ASSERT_EQ(good.recurrent_states.size(), 2u);

  // Each bad checkpoint alone in a run directory of its own, resumed to step 3.
  const auto expect_refused = [&](const std::string& name, TrainingState state, const std::string& expected) {
    SCOPED_TRACE(name);
    const std::string dir = scratch / name;
    save_checkpoint(dir + "/checkpoints", state);
    Config resume = config;
    resume.logging.run_dir = dir;
    resume.training.max_steps = 3;
    std::ostringstream resume_log;
    try {
      train(resume, resume_log);
      FAIL() << "resumed from a checkpoint with " << name;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(expected), std::string::npos) << message;
      EXPECT_NE(message.find(dir + "/checkpoints/step_00000002.h5"), std::string::npos) << message;
    }
  };
  TrainingState without = good;
  without.recurrent_states.clear();
  expect_refused("no-states", without, "holds no carried recurrent states (/recurrent_states)");

  TrainingState fewer_layers = good;
  fewer_layers.recurrent_states.pop_back();
  expect_refused("one-layer", fewer_layers, "holds the carried states of 1 layers, this model has 2");

  TrainingState more_streams = good;
  const Shape shape = good.recurrent_states[1].shape();
  Shape wider = shape;
  wider[0] = 5;
  more_streams.recurrent_states[1] = Tensor::zeros(wider, DType::F32);
  expect_refused("five-streams", more_streams, "the carried state of layer 1 is fp32 [5,");

  TrainingState other_shape = good;
  Shape narrower = shape;
  narrower.back() -= 1;
  other_shape.recurrent_states[0] = Tensor::zeros(narrower, DType::F32);
  expect_refused("narrower", other_shape, "the carried state of layer 0 is fp32 ");

  TrainingState other_dtype = good;
  other_dtype.recurrent_states[0] = good.recurrent_states[0].to(DType::F64);
  expect_refused("fp64", other_dtype, "the carried state of layer 0 is fp64");
}

// ---- refusals in the config and the data ----

std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "bad.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(StatefulTraining, ConfigRefusesMqarAndAShuffledOrderAndTurnsTheDefaultShuffleOff) {
  const std::string model = "model: {expand_ratio: 8}\n";
  std::string message = config_error(model + "data: {task: mqar, stateful: true}\n");
  EXPECT_NE(message.find("data.stateful"), std::string::npos) << message;
  EXPECT_NE(message.find("MQAR"), std::string::npos) << message;
  message = config_error(model + "data: {task: tokens, train_data: x, stateful: true, shuffle: true}\n");
  EXPECT_NE(message.find("data.shuffle: expected false with data.stateful = true"), std::string::npos) << message;
  const Config resolved = parse_config(model + "data: {task: tokens, train_data: x, stateful: true}\n", "ok.yaml");
  EXPECT_TRUE(resolved.data.stateful);
  EXPECT_FALSE(resolved.data.shuffle);
  // The resolved config reads back as itself (checkpoints store it).
  EXPECT_EQ(parse_config(config_to_yaml(resolved), "again.yaml"), resolved);
  EXPECT_FALSE(parse_config(model + "data: {task: tokens, train_data: x}\n", "default.yaml").data.stateful);
}

TEST(StatefulTraining, ACorpusTooShortForTwoWindowsOfEveryStreamIsRefused) {
  const ScratchDir scratch;
  const std::string prefix = scratch / "short";
  write_random_token_shard(prefix, 17, 128, 3);  // 4 streams of 31 tokens: one 16-token window each
  const Config config = stateful_config(prefix, scratch / "run");
  try {
    make_training_source(config, 1);
    FAIL() << "a shard too short for the streams must be refused";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : {"data.stateful: data.train_data = " + prefix + " has 128 tokens",
                                    std::string("4 streams (training.micro_batch_size x training.grad_accum_steps x 1 "
                                                "rank(s))"),
                                    std::string("data.seq_len = 16"), std::string("at least 2 x 4 x 16 + 1 = 129")})
      EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

// `hgrn bench --stateful` times steps with carried states on any config (here the MQAR default, on the CPU).
TEST(StatefulTraining, BenchTimesStatefulSteps) {
  const ScratchDir dir;
  const std::string json_path = dir / "bench.json";
  const auto r = testing::run_hgrn({"bench", "--config", std::string(HGRN_SOURCE_DIR) + "/configs/mqar-tiny.yaml",
                                    "--set", "training.device=cpu", "--stateful", "--warmup", "1", "--steps", "2",
                                    "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("recurrent states carried from step to step (data.stateful)"), std::string::npos) << r.out;
  std::ifstream f(json_path);
  EXPECT_TRUE(nlohmann::json::parse(f).at("stateful").get<bool>());
}

}  // namespace
}  // namespace hgrn
