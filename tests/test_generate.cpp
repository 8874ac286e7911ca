// test_generate.cpp: generation: prefill plus decode steps against the full forward for every member, greedy and
// seeded decoding repeating, the sampling rules on hand-made distributions, and `hgrn generate` end to end with its
// refusals of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/allocator.h"
#include "data/tokenizer.h"
#include "hgrn_binary.h"
#include "io/checkpoint.h"
#include "io/hf_export.h"
#include "model_fixtures.h"
#include "models/generation.h"
#include "models/sampling.h"
#include "scratch_dir.h"

namespace hgrn {
namespace {

using testing::model_variants;
using testing::randomise_lower_bounds;
using testing::tiny_config;
using testing::token_ids;

class GenerationOfEveryModelType : public ::testing::TestWithParam<std::string> {};

// Logits [B, V] against the full forward's [B, T, V] at `position`.
void expect_logits_at(const Tensor& step_logits, const std::vector<double>& full, int64_t length, int64_t position,
                      double tolerance) {
  const int64_t batch = step_logits.size(0), vocab = step_logits.size(1);
  const std::vector<double> got = step_logits.to_double_vector();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < vocab; ++j)
      ASSERT_NEAR(got[b * vocab + j], full[(b * length + position) * vocab + j], tolerance)
          << "batch " << b << " position " << position << " logit " << j;
}

TEST_P(GenerationOfEveryModelType, PrefillAndDecodeStepsGiveTheFullForwardsLogits) {
  // fp64, so the only difference is the order of the arithmetic: the prompt's forward (chunkwise past 64 tokens)
  // against the step-by-step recurrence. 1e-10 on logits of order 1..10.
  constexpr double kTolerance = 1e-10;
  ModelConfig c = tiny_config(GetParam());
  Rng rng(61), rng_ids(62);
  DecoderLM model(c, rng, DType::F64);
  randomise_lower_bounds(model, rng);
  const int64_t new_tokens = 6;
  for (int64_t prompt_length : {1, 5, 70}) {  // a lone token, the step-by-step prefill, the chunkwise one
    SCOPED_TRACE(prompt_length);
    const int64_t length = prompt_length + new_tokens;
    const Tensor ids = token_ids(rng_ids, 2, length, c.vocab_size);
    Tape tape;
    tape.set_enabled(false);
    const std::vector<double> full = model.forward(tape, ids)->value.to_double_vector();
    std::vector<RecurrentState> states;
    expect_logits_at(prefill(model, id_columns(ids, 0, prompt_length), states), full, length, prompt_length - 1,
                     kTolerance);
    ASSERT_EQ(states.size(), static_cast<size_t>(c.num_hidden_layers));
    for (int64_t t = prompt_length; t < length; ++t) {
      const Tensor logits = model.decode_step(id_columns(ids, t, 1).reshape({2}), states);
      expect_logits_at(logits, full, length, t, kTolerance);
    }
  }
}

TEST_P(GenerationOfEveryModelType, DecodingFromNothingIsTheForwardOfEachPrefix) {
  // Every state starts undefined (zero): the first step is the forward of a one-token sequence.
  ModelConfig c = tiny_config(GetParam());
  Rng rng(63), rng_ids(64);
  DecoderLM model(c, rng, DType::F64);
  const Tensor ids = token_ids(rng_ids, 3, 4, c.vocab_size);
  Tape tape;
  tape.set_enabled(false);
  const std::vector<double> full = model.forward(tape, ids)->value.to_double_vector();
  std::vector<RecurrentState> states;
  for (int64_t t = 0; t < 4; ++t)
    expect_logits_at(model.decode_step(id_columns(ids, t, 1).reshape({3}), states), full, 4, t, 1e-10);
}

TEST_P(GenerationOfEveryModelType, GreedyDecodingTakesTheArgmaxOfTheForwardAndRepeats) {
  ModelConfig c = tiny_config(GetParam());
  Rng rng(65);
  DecoderLM model(c, rng, DType::F64);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  GenerationOptions options;
  options.max_new_tokens = 12;
  options.sampling.temperature = 0;
  const GenerationResult first = generate(model, prompt, options);
  ASSERT_EQ(first.sequences.size(), 1u);
  const std::vector<int32_t>& generated = first.sequences[0].ids;
  ASSERT_EQ(generated.size(), 12u);  // no EOS given: always the full count
  EXPECT_EQ(generate(model, prompt, options).sequences[0].ids, generated);
  // Each new token is the argmax of the full forward's logits at the position before it.
  std::vector<int32_t> text = prompt;
  text.insert(text.end(), generated.begin(), generated.end());
  const int64_t length = static_cast<int64_t>(text.size()), vocab = c.vocab_size;
  Tape tape;
  tape.set_enabled(false);
  const std::vector<double> logits =
      model.forward(tape, Tensor::from_vector(text, {1, length}))->value.to_double_vector();
  for (size_t i = 0; i < generated.size(); ++i) {
    const int64_t position = static_cast<int64_t>(prompt.size() + i) - 1;
    const auto row = logits.begin() + position * vocab;
    EXPECT_EQ(generated[i], std::max_element(row, row + vocab) - row) << "new token " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GenerationOfEveryModelType, ::testing::ValuesIn(model_variants()),
                         testing::variant_test_name);

TEST(Generation, SeededSamplingRepeatsAndEachSequenceKeepsItsOwnStream) {
  ModelConfig c = tiny_config("hgrn2");
  Rng rng(66);
  DecoderLM model(c, rng, DType::F64);
  GenerationOptions options;
  options.max_new_tokens = 20;
  options.seed = 7;
  options.batch = 3;
  const GenerationResult a = generate(model, {2, 7}, options);
  const GenerationResult b = generate(model, {2, 7}, options);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(a.sequences[s].ids, b.sequences[s].ids) << "sequence " << s;
  EXPECT_NE(a.sequences[0].ids, a.sequences[1].ids);  // 20 draws over 11 ids: equal only by a near-impossible chance
  options.batch = 1;
  EXPECT_EQ(generate(model, {2, 7}, options).sequences[0].ids, a.sequences[0].ids);  // batch-independent
  options.seed = 8;
  EXPECT_NE(generate(model, {2, 7}, options).sequences[0].ids, a.sequences[0].ids);
}

TEST(Generation, StopsAfterTheEosWithoutIncludingIt) {
  ModelConfig c = tiny_config("hgrn");
  Rng rng(67);
  DecoderLM model(c, rng, DType::F64);
  GenerationOptions options;
  options.max_new_tokens = 8;
  options.sampling.temperature = 0;
  const std::vector<int32_t> greedy = generate(model, {1, 2, 3}, options).sequences[0].ids;
  options.eos_id = greedy[3];  // the greedy text's fourth token: generation ends at its first occurrence
  const GeneratedSequence stopped = generate(model, {1, 2, 3}, options).sequences[0];
  EXPECT_TRUE(stopped.stopped_at_eos);
  const auto first = std::find(greedy.begin(), greedy.end(), *options.eos_id);
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(greedy.begin(), first));
}

TEST(Generation, RefusesAnEmptyPromptAndIdsOutsideTheVocabulary) {
  ModelConfig c = tiny_config("hgrn2");
  Rng rng(68);
  DecoderLM model(c, rng, DType::F64);
  GenerationOptions options;
  EXPECT_THROW(generate(model, {}, options), Error);
  try {
    generate(model, {1, 11, 2}, options);
    FAIL() << "id 11 is outside a vocabulary of 11";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("prompt token 1 is id 11"), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate(model, {-1}, options), Error);
  options.vocab_limit = 12;  // a tokenizer larger than the model
  EXPECT_THROW(generate(model, {1}, options), Error);
}

TEST(Generation, SamplesOnlyBelowTheTokenizersVocabulary) {
  ModelConfig c = tiny_config("hgrn2");
  Rng rng(69);
  DecoderLM model(c, rng, DType::F64);
  GenerationOptions options;
  options.max_new_tokens = 50;
  options.vocab_limit = 3;
  const GenerationResult r = generate(model, {1}, options);
  ASSERT_EQ(r.sequences[0].ids.size(), 50u);
  for (const int32_t id : r.sequences[0].ids) EXPECT_LT(id, 3);
}

// ---- sampling rules on hand-made distributions ----

std::vector<double> log_of(const std::vector<double>& p) {
  std::vector<double> out;
  for (const double x : p) out.push_back(std::log(x));
  return out;
}

void expect_distribution(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "id " << i;
}

TEST(Sampling, TemperatureScalesTheLogits) {
  const std::vector<double> logits = {1.0, 2.0, 4.0};
  SamplingOptions o;
  o.temperature = 2.0;
  const double z = std::exp(0.5) + std::exp(1.0) + std::exp(2.0);
  expect_distribution(next_token_distribution(logits, {}, o),
                      {std::exp(0.5) / z, std::exp(1.0) / z, std::exp(2.0) / z});
}

TEST(Sampling, TopKKeepsTheKMostLikelyAndTheirTies) {
  const std::vector<double> logits = log_of({0.1, 0.4, 0.2, 0.25, 0.05});
  SamplingOptions o;
  o.top_k = 2;
  expect_distribution(next_token_distribution(logits, {}, o), {0, 0.4 / 0.65, 0, 0.25 / 0.65, 0});
  o.top_k = 1;
  const std::vector<double> tied = {1.0, 3.0, 3.0, 2.0};
  expect_distribution(next_token_distribution(tied, {}, o), {0, 0.5, 0.5, 0});  // a tie at the cut
  o.top_k = 9;  // more than the vocabulary: no cut
  expect_distribution(next_token_distribution(logits, {}, o), {0.1, 0.4, 0.2, 0.25, 0.05});
}

TEST(Sampling, TopPKeepsTheFewestTokensReachingP) {
  const std::vector<double> logits = log_of({0.15, 0.5, 0.05, 0.3});
  SamplingOptions o;
  o.top_p = 0.7;  // 0.5 alone falls short, 0.5 + 0.3 reaches it
  expect_distribution(next_token_distribution(logits, {}, o), {0, 0.625, 0, 0.375});
  o.top_p = 0.5;  // the most likely token alone reaches it
  expect_distribution(next_token_distribution(logits, {}, o), {0, 1, 0, 0});
  o.top_p = 0.01;  // at least one token is always kept
  expect_distribution(next_token_distribution(logits, {}, o), {0, 1, 0, 0});
  o.top_p = 0.9;
  o.top_k = 2;  // top-p applies to what top-k kept, renormalised: 0.5/0.8 alone falls short of 0.9
  expect_distribution(next_token_distribution(logits, {}, o), {0, 0.625, 0, 0.375});
}

TEST(Sampling, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  const std::vector<double> logits = {2.0, -1.0, 0.5, 3.0};
  const std::vector<double> penalized = penalized_logits(logits, std::vector<int32_t>{0, 1, 1}, 2.0);
  EXPECT_EQ(penalized, (std::vector<double>{1.0, -2.0, 0.5, 3.0}));  // each id once, however often it occurred
  SamplingOptions greedy;
  greedy.temperature = 0;
  Rng rng(1);
  const std::vector<double> close = {2.0, 1.5};
  EXPECT_EQ(sample_next_token(close, {}, greedy, rng), 0);
  greedy.repetition_penalty = 2.0;
  EXPECT_EQ(sample_next_token(close, std::vector<int32_t>{0}, greedy, rng), 1);  // 2.0 / 2 < 1.5
}

TEST(Sampling, DrawsFollowTheDistribution) {
  const std::vector<double> logits = log_of({0.2, 0.5, 0.3});
  SamplingOptions o;
  Rng rng(70);
  std::vector<int> counts(3, 0);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[sample_next_token(logits, {}, o, rng)];
  // Binomial standard deviations are at most 0.0025: 0.012 is about 5 of them.
  EXPECT_NEAR(counts[0] / double(draws), 0.2, 0.012);
  EXPECT_NEAR(counts[1] / double(draws), 0.5, 0.012);
  EXPECT_NEAR(counts[2] / double(draws), 0.3, 0.012);
}

TEST(Sampling, RefusesOptionsOutOfRange) {
  const auto refused = [](auto set) {
    SamplingOptions o;
    set(o);
    EXPECT_THROW(check_sampling_options(o), Error);
  };
  refused([](SamplingOptions& o) { o.temperature = -0.1; });
  refused([](SamplingOptions& o) { o.top_k = -1; });
  refused([](SamplingOptions& o) { o.top_p = 0; });
  refused([](SamplingOptions& o) { o.top_p = 1.5; });
  refused([](SamplingOptions& o) { o.repetition_penalty = 0; });
  EXPECT_NO_THROW(check_sampling_options(SamplingOptions{}));
}

// ---- hgrn generate ----

using testing::run_hgrn;
using testing::ScratchDir;

// An HGRN2 checkpoint of an MQAR run (which records no tokenizer) with the given vocabulary.
std::string write_checkpoint(const std::string& dir, int64_t vocab_size) {
  Config config;
  config.model.hidden_size = 16;
  config.model.num_hidden_layers = 2;
  config.model.expand_ratio = 4;
  config.model.vocab_size = vocab_size;
  config.model.intermediate_size = 24;
  Rng rng(71);
  DecoderLM model(config.model, rng);
  TrainingState state;
  for (const auto& [spec, var] : model.parameters()) {
    state.params.emplace_back(spec.name, var->value.clone());
    state.adam_m.push_back(Tensor::zeros(spec.shape, DType::F32));
    state.adam_v.push_back(Tensor::zeros(spec.shape, DType::F32));
  }
  state.config_yaml = config_to_yaml(config);
  state.model_signature = "generate test";
  state.hgrn_version = HGRN_VERSION;
  state.git_commit = HGRN_GIT_COMMIT;
  return save_checkpoint(dir, state);
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override { checkpoint_ = write_checkpoint(dir_ / "checkpoints", 264); }
  ScratchDir dir_;
  std::string checkpoint_;
};

TEST_F(GenerateCli, GreedyTextRepeatsAndTheJsonRecordsIt) {
  const std::string json_path = dir_ / "out.json";
  const std::vector<std::string> args = {"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte", "--prompt",
                                         "Hello", "--temperature", "0", "-n", "16", "--json", json_path};
  const testing::CommandResult first = run_hgrn(args);
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(first.out.rfind("Hello", 0), 0u) << first.out;  // the prompt, then its continuation
  EXPECT_NE(first.err.find("tokens/s"), std::string::npos) << first.err;
  const testing::CommandResult second = run_hgrn(args);
  EXPECT_EQ(second.out, first.out);
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), (std::vector<int32_t>{'H', 'e', 'l', 'l', 'o'}));
  const std::vector<int32_t> ids = j["samples"][0]["ids"];
  EXPECT_LE(ids.size(), 16u);
  EXPECT_EQ(ids.size() == 16u, !j["samples"][0]["stopped_at_eos"].get<bool>());
  EXPECT_EQ(first.out, "Hello" + make_byte_tokenizer()->decode(ids) + "\n");
}

TEST_F(GenerateCli, AnHfDirectoryGeneratesWhatItsCheckpointDoes) {
  const TrainingState state = load_checkpoint(checkpoint_);
  const Config config = cli::config_of_checkpoint(state, checkpoint_);
  export_hf(config.model, state.params, dir_ / "hf", DType::F32);
  const std::vector<std::string> rest = {"--prompt", "ab", "--seed", "3", "--top-k", "20", "-n", "12"};
  std::vector<std::string> from_checkpoint = {"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte"};
  std::vector<std::string> from_hf = {"generate", "--hf", dir_ / "hf", "--tokenizer", "byte"};
  from_checkpoint.insert(from_checkpoint.end(), rest.begin(), rest.end());
  from_hf.insert(from_hf.end(), rest.begin(), rest.end());
  const testing::CommandResult a = run_hgrn(from_checkpoint), b = run_hgrn(from_hf);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  // Without a tokenizer.json in the directory and no --tokenizer, it says what to pass.
  const testing::CommandResult none = run_hgrn({"generate", "--hf", dir_ / "hf", "--prompt", "ab"});
  EXPECT_EQ(none.status, 2);
  EXPECT_NE(none.err.find("--tokenizer"), std::string::npos) << none.err;
}

// On the CPU, --decode fused runs the fused steps eagerly in the model's dtype: the op-by-op path's text, greedy and
// sampled. (With a GPU the command runs there: FusedDecodingCuda.* compares the paths on it.)
TEST_F(GenerateCli, FusedDecodingOnTheCpuGivesTheOpByOpText) {
  if (cuda_available()) GTEST_SKIP() << "hgrn generate runs on the GPU here; FusedDecodingCuda.* covers it";
  for (const std::vector<std::string> sampling : {std::vector<std::string>{"--temperature", "0"},
                                                  std::vector<std::string>{"--seed", "4", "--top-k", "30"}}) {
    std::vector<std::string> args = {"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte", "--prompt",
                                     "Hello", "-n", "12", "--batch", "2"};
    args.insert(args.end(), sampling.begin(), sampling.end());
    std::vector<std::string> ops = args, fused = args;
    ops.insert(ops.end(), {"--decode", "ops"});
    fused.insert(fused.end(), {"--decode", "fused"});
    const testing::CommandResult a = run_hgrn(ops), b = run_hgrn(fused);
    ASSERT_EQ(a.status, 0) << a.err;
    ASSERT_EQ(b.status, 0) << b.err;
    EXPECT_EQ(a.out, b.out);
    EXPECT_NE(a.err.find("decoding: op by op"), std::string::npos) << a.err;
    EXPECT_NE(b.err.find("decoding: fused steps"), std::string::npos) << b.err;
  }
  // bf16 needs the GPU.
  const testing::CommandResult bf16 = run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte",
                                                "--prompt", "x", "--precision", "bf16"});
  EXPECT_EQ(bf16.status, 2);
  EXPECT_NE(bf16.err.find("--precision bf16 needs the GPU"), std::string::npos) << bf16.err;
}

TEST_F(GenerateCli, BadInputIsAClearErrorWithStatusTwo) {
  const auto expect_refused = [](const testing::CommandResult& r, const std::string& says) {
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  };
  // The checkpoint's run trained on MQAR: no tokenizer recorded.
  expect_refused(run_hgrn({"generate", "--checkpoint", checkpoint_, "--prompt", "x"}), "records no tokenizer");
  expect_refused(run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte", "--prompt", ""}),
                 "the prompt is empty");
  std::ofstream(dir_ / "empty.txt").flush();
  expect_refused(
      run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte", "--prompt-file", dir_ / "empty.txt"}),
      "the prompt is empty");
  // The byte tokenizer's 257 ids do not fit a vocabulary of 200.
  const std::string small = write_checkpoint(dir_ / "small", 200);
  expect_refused(run_hgrn({"generate", "--checkpoint", small, "--tokenizer", "byte", "--prompt", "x"}),
                 "more than the model's vocabulary of 200");
  expect_refused(run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", dir_ / "missing.json",
                           "--prompt", "x"}),
                 "missing.json");
  expect_refused(run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte", "--prompt", "x",
                           "--top-p", "1.5"}),
                 "--top-p");
  expect_refused(run_hgrn({"generate", "--tokenizer", "byte", "--prompt", "x"}), "--checkpoint");
  expect_refused(run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte"}), "--prompt");
  expect_refused(run_hgrn({"generate", "--checkpoint", checkpoint_, "--tokenizer", "byte", "--prompt", "x",
                           "--decode", "graph"}),
                 "--decode");
}

}  // namespace
}  // namespace hgrn
