// test_data_sources.cpp: training and evaluating on token shards end to end: a WikiText-like file prepared with the
// byte tokenizer, `train` on it (data.task: tokens), then evaluation in window and stateful mode; and the messages
// for missing shards and a vocabulary that does not fit the model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "config/config.h"
#include "data/data_sources.h"
#include "data/prepare.h"
#include "io/checkpoint.h"
#include "models/decoder_lm.h"
#include "models/registry.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "scratch_dir.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

// A small corpus in WikiText's layout with a learnable structure: articles that repeat a few sentences.
std::string write_wikitext_like(const std::string& dir) {
  fs::create_directories(dir);
  const std::string path = dir + "/wiki.train.tokens";
  std::ofstream out(path);
  out << " \n";
  for (int a = 0; a < 40; ++a) {
    out << " = Article " << a << " = \n \n";
    for (int l = 0; l < 6; ++l) out << " the cat sat on the mat , and the dog sat on the log . \n";
    out << " \n";
  }
  return path;
}

// The shards every test here reads, prepared once per process into a directory of its own (ctest runs these tests as
// parallel processes) and removed when the process exits.
struct PreparedShards {
  const std::string dir = ::testing::TempDir() + "/hgrn-data-sources-" + std::to_string(getpid());
  PreparedShards() {
    fs::remove_all(dir);
    PrepareOptions options;
    options.corpus = "wikitext";
    options.inputs = {write_wikitext_like(dir)};
    options.output_prefix = dir + "/wiki";
    options.valid_fraction = 0.2;
    options.threads = 1;
    prepare_corpus(options);
  }
  ~PreparedShards() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

std::string prepared_prefix() {
  static const PreparedShards shards;
  return shards.dir + "/wiki";
}

// run_dir: the test's own (a ScratchDir), where train() writes its checkpoints and logs.
Config token_config(const std::string& run_dir) {
  return parse_config(R"(
model: {hidden_size: 32, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 257, intermediate_size: 64}
data: {task: tokens, seq_len: 32}
training: {micro_batch_size: 8, max_steps: 60, lr: 0.01, warmup_steps: 5, eval_interval: 0, eval_batches: 2}
)",
                      "tokens.yaml",
                      {"data.train_data=" + prepared_prefix() + "_train", "data.valid_data=" + prepared_prefix() + "_valid",
                       "logging.run_dir=" + run_dir, "checkpoint.resume=auto"});
}

TEST(DataSources, TrainsAndEvaluatesOnPreparedShards) {
  const testing::ScratchDir scratch;
  Config config = token_config(scratch / "run");
  std::ostringstream log;
  TrainingSummary s = train(config, log);
  SCOPED_TRACE(log.str());
  // Bytes start uniform over 257 ids (5.55 nats); the repetitive text is learnable to well under 2 nats in 60 steps.
  EXPECT_NEAR(s.first_loss, std::log(257.0), 0.3);
  EXPECT_LT(s.final_loss, 2.0);
  EXPECT_LT(s.eval_loss, 2.0);

  TrainingState state = load_checkpoint(config.logging.run_dir + "/checkpoints/step_00000060.h5");
  Rng rng(0);
  DecoderLM model(config.model, rng);
  model.load_parameters(state.params, "checkpoint");
  TokenShardReader valid(prepared_prefix() + "_valid");
  ShardEvalOptions options;
  options.seq_len = 16;
  options.batch_size = 2;
  const EvalResult windows = evaluate_shard(model, valid, options);
  options.stateful = true;
  const EvalResult stateful = evaluate_shard(model, valid, options);
  EXPECT_EQ(windows.targets, (valid.num_tokens() - 1) / 16 * 16);
  EXPECT_EQ(stateful.targets, (valid.num_tokens() - 1) / 2 * 2);
  // Carrying the state gives every token its whole past, so the stateful loss is no worse than window by window
  // (each window starts blind) beyond noise.
  EXPECT_LT(stateful.loss, windows.loss + 0.05);
}

// data.shuffle: false reads the training windows in shard order (window w = tokens [w·T, w·T + T + 1), the stream
// wrapping round after the last window), which tools/peer_parity.py reproduces to feed the peer the same batches;
// the default visits them in a shuffled order.
TEST(DataSources, UnshuffledTrainingWindowsComeInShardOrder) {
  const testing::ScratchDir scratch;
  Config config = token_config(scratch / "run");
  const int64_t T = config.data.seq_len;
  TokenShardReader shard(prepared_prefix() + "_train");
  std::vector<int32_t> tokens(static_cast<size_t>(shard.num_tokens()));
  shard.read(0, shard.num_tokens(), tokens.data());
  const int64_t windows = (shard.num_tokens() - 1) / T;
  ASSERT_GE(windows, 3);

  config.data.shuffle = false;
  auto ordered = make_training_source(config, 11);
  const TokenBatch first = ordered->next_batch(windows - 1);  // every window but the last
  const TokenBatch wrap = ordered->next_batch(2);             // the last window, then the first again
  auto expect_window = [&](const TokenBatch& batch, int64_t row, int64_t w) {
    for (int64_t t = 0; t < T; ++t) {
      ASSERT_EQ(static_cast<int32_t>(batch.inputs.item(row * T + t)), tokens[w * T + t]) << "window " << w << ", t " << t;
      ASSERT_EQ(static_cast<int32_t>(batch.targets.item(row * T + t)), tokens[w * T + t + 1]) << "window " << w << ", t " << t;
    }
  };
  for (int64_t w = 0; w < windows - 1; ++w) expect_window(first, w, w);
  expect_window(wrap, 0, windows - 1);
  expect_window(wrap, 1, 0);

  config.data.shuffle = true;
  const TokenBatch shuffled = make_training_source(config, 11)->next_batch(windows - 1);
  int64_t in_place = 0;
  for (int64_t w = 0; w < windows - 1; ++w) in_place += static_cast<int32_t>(shuffled.inputs.item(w * T)) == tokens[w * T];
  EXPECT_LT(in_place, windows - 1) << "the default order must not be the shard's";
}

// data.reset_state_at_document: training batches carry reset flags after every EOS of the shard's tokenizer, a short
// run learns as well, and `hgrn eval`'s stateful mode with resets scores every document as if read alone from the
// zero state.
TEST(DataSources, DocumentResetsTrainAndEvaluate) {
  const testing::ScratchDir scratch;
  Config config = token_config(scratch / "run");
  config.data.reset_state_at_document = true;
  const int32_t eos = document_eos_id("data.train_data", config.data.train_data);
  EXPECT_EQ(eos, 256);  // the byte tokenizer's
  const TokenBatch batch = make_training_source(config, 3)->next_batch(4);
  ASSERT_TRUE(batch.resets.defined());
  int64_t starts = 0;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t t = 1; t < config.data.seq_len; ++t) {
      const int64_t i = b * config.data.seq_len + t;
      EXPECT_EQ(batch.resets.data<int32_t>()[i], batch.inputs.data<int32_t>()[i - 1] == eos ? 1 : 0) << i;
      starts += batch.resets.data<int32_t>()[i];
    }
  EXPECT_GT(starts, 0) << "the batch should cross a document boundary";

  config.training.max_steps = 25;
  std::ostringstream log;
  const TrainingSummary s = train(config, log);
  SCOPED_TRACE(log.str());
  EXPECT_NE(log.str().find("the state restarted at each document start"), std::string::npos);
  // Bytes start uniform over 257 ids (5.55 nats); 25 steps on the repetitive text take the loss below 3.
  EXPECT_LT(s.final_loss, 3.0);
  EXPECT_LT(s.eval_loss, 3.0);

  // Stateful evaluation of one stream with resets = each document scored alone from the zero state, its EOS predicting
  // the next document's first token (the shard's last token is no target).
  // In fp64, so that the comparison is far tighter than what leaking states would change.
  TrainingState state = load_checkpoint(config.logging.run_dir + "/checkpoints/step_00000025.h5");
  Rng rng(0);
  DecoderLM model(config.model, rng, DType::F64);
  model.load_parameters(state.params, "checkpoint");
  TokenShardReader valid(prepared_prefix() + "_valid");
  ShardEvalOptions options;
  options.seq_len = 16;
  options.batch_size = 1;
  options.stateful = true;
  options.document_eos = eos;
  const EvalResult with_resets = evaluate_shard(model, valid, options);
  const int64_t N = valid.num_tokens();
  std::vector<int32_t> tokens(static_cast<size_t>(N));
  valid.read(0, N, tokens.data());
  Tape no_grad;
  no_grad.set_enabled(false);
  double nll = 0;
  int64_t scored = 0;
  for (int64_t begin = 0; begin < N - 1;) {
    int64_t end = begin;
    while (end < N - 1 && (end == begin || tokens[static_cast<size_t>(end - 1)] != eos)) ++end;
    Tensor ids = Tensor::empty({1, end - begin}, DType::I32), targets = Tensor::empty({end - begin}, DType::I32);
    for (int64_t t = begin; t < end; ++t) {
      ids.data<int32_t>()[t - begin] = tokens[static_cast<size_t>(t)];
      targets.data<int32_t>()[t - begin] = tokens[static_cast<size_t>(t + 1)];
    }
    const CrossEntropyResult r = cross_entropy(
        no_grad, reshape(no_grad, model.forward(no_grad, ids), {end - begin, config.model.vocab_size}), targets);
    nll += r.loss->value.item() * static_cast<double>(r.num_targets);
    scored += r.num_targets;
    begin = end;
  }
  EXPECT_EQ(with_resets.targets, scored);
  // fp64: the same sums in another grouping (windows of 16 against whole documents); leaking states change the loss
  // by ~1e-4 here (checked below).
  EXPECT_NEAR(with_resets.loss, nll / static_cast<double>(scored), 1e-9);
  options.document_eos.reset();
  EXPECT_GT(std::abs(evaluate_shard(model, valid, options).loss - with_resets.loss), 1e-6)
      << "without resets the documents read each other's states";
}

TEST(DataSources, DocumentResetsNeedTheShardsEosId) {
  const testing::ScratchDir scratch;
  Config config = token_config(scratch / "run");
  config.data.reset_state_at_document = true;
  // A copy of the shard without its sidecar (PREFIX.json): the EOS id is unknown.
  const std::string bare = scratch / "bare";
  fs::copy_file(prepared_prefix() + "_train.bin", bare + ".bin");
  fs::copy_file(prepared_prefix() + "_train.idx", bare + ".idx");
  config.data.train_data = bare;
  try {
    make_training_source(config, 1);
    FAIL() << "resets without a known EOS id must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data.reset_state_at_document"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.train_data = " + bare), std::string::npos) << msg;
    EXPECT_NE(msg.find("bare.json"), std::string::npos) << msg;
  }
}

TEST(DataSources, MissingShardsNameTheFileAndTheFix) {
  const testing::ScratchDir scratch;
  Config config = token_config(scratch / "run");
  config.data.train_data = scratch / "nowhere/wiki_train";
  try {
    make_training_source(config, 1);
    FAIL() << "missing shards must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data.train_data"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nowhere/wiki_train.bin does not exist"), std::string::npos) << msg;
    EXPECT_NE(msg.find("hgrn prepare"), std::string::npos) << msg;
  }
}

TEST(DataSources, VocabularyLargerThanTheModelIsRefused) {
  const testing::ScratchDir scratch;
  Config config = token_config(scratch / "run");
  config.model.vocab_size = 200;  // the byte tokenizer has 257 ids
  try {
    make_training_source(config, 1);
    FAIL() << "a shard with more ids than the model's vocabulary must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set model.vocab_size to at least 257"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hgrn
