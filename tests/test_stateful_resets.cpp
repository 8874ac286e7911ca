// test_stateful_resets.cpp: data.stateful with data.reset_state_at_document: the stream sampler marks the document
// starts of each window (the first token's from the token before the window), and a stream read window by window
// with the carried states and those resets equals one forward over the stream with its resets, which a document start
// on a window boundary cuts off from the carried state (every family member, fp64); a short stateful run with resets
// trains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/token_shards.h"
#include "data/token_streams.h"
#include "model_fixtures.h"
#include "models/decoder_lm.h"
#include "scratch_dir.h"
#include "token_shard_fixtures.h"
#include "train/trainer.h"

namespace hgrn {
namespace {

using testing::ScratchDir;

class StatefulResets : public ::testing::TestWithParam<std::string> {};

TEST_P(StatefulResets, WindowsWithCarriedStatesEqualOneForwardOverTheStream) {
  const ModelConfig c = testing::tiny_config(GetParam());
  const int32_t eos = static_cast<int32_t>(c.vocab_size - 1);
  Rng rng(71);
  DecoderLM model(c, rng, DType::F64);
  testing::randomise_lower_bounds(model, rng);
  const ScratchDir dir;
  testing::write_document_shard(dir / "docs", eos, 2 * 150 + 1, 72);  // 2 streams of L = 150
  auto shard = std::make_shared<const TokenShardReader>(dir / "docs");
  for (const int64_t T : {7, 70}) {  // the step-by-step path, and the chunkwise one with a partial chunk
    SCOPED_TRACE("seq_len " + std::to_string(T));
    StreamWindowOptions options{T, 2, 0, 1};
    options.document_eos = eos;
    StreamWindowSampler sampler(shard, options);
    const int64_t K = sampler.windows_per_stream(), D = c.hidden_size;
    Tape untaped;
    untaped.set_enabled(false);
    std::vector<std::vector<double>> whole;  // per stream: hidden states [K·T, D] of one forward with resets
    for (int64_t s = 0; s < 2; ++s) {
      const TokenBatch stream = read_token_spans(*shard, {sampler.layout().start(s)}, K * T, eos);
      whole.push_back(model.forward_hidden(untaped, stream.inputs, nullptr, stream.resets)->value.to_double_vector());
    }
    std::vector<Var> states;
    bool boundary_reset = false;
    for (int64_t k = 0; k < K; ++k) {
      const TokenBatch batch = sampler.next_batch(2);
      ASSERT_TRUE(batch.resets.defined());
      boundary_reset = boundary_reset || (k > 0 && batch.resets.data<int32_t>()[0] == 1);
      const std::vector<double> got =
          model.forward_hidden(untaped, batch.inputs, &states, batch.resets)->value.to_double_vector();
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t i = 0; i < T * D; ++i)
          // fp64: the same function in another grouping of its sums (windows against one long sequence).
          ASSERT_NEAR(got[static_cast<size_t>(s * T * D + i)],
                      whole[static_cast<size_t>(s)][static_cast<size_t>(k * T * D + i)], 1e-10)
              << "stream " << s << " window " << k << " element " << i;
    }
    if (T == 7) EXPECT_TRUE(boundary_reset) << "stream 0's second window starts a document";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StatefulResets, ::testing::ValuesIn(testing::model_variants()),
                         testing::variant_test_name);

TEST(StatefulResets, TrainingRunsWithBoth) {
  const ScratchDir dir;
  testing::write_document_shard(dir / "docs", 40, 2000, 73);
  const Config config = parse_config(R"(
model: {hidden_size: 16, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 41, intermediate_size: 32}
data: {task: tokens, seq_len: 16, stateful: true, reset_state_at_document: true}
training: {device: cpu, micro_batch_size: 2, grad_accum_steps: 2, max_steps: 8, lr: 0.01, warmup_steps: 2,
           eval_interval: 0, eval_batches: 1}
)",
                                     "stateful-resets.yaml",
                                     {"data.train_data=" + (dir / "docs"), "logging.run_dir=" + (dir / "run")});
  std::ostringstream log;
  const TrainingSummary s = train(config, log);
  SCOPED_TRACE(log.str());
  EXPECT_NE(log.str().find("data.stateful"), std::string::npos);
  EXPECT_NE(log.str().find("the state restarted at each document start"), std::string::npos);
  ASSERT_EQ(s.step_losses.size(), 8u);
  for (double loss : s.step_losses) EXPECT_TRUE(std::isfinite(loss));
}

}  // namespace
}  // namespace hgrn
