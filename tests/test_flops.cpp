// test_flops.cpp: the cost model behind `hgrn info`: parameter totals from the specs, FLOPs counted by hand for a
// small model and the 6·N rule of thumb for a large one (the memory estimate: test_memory_estimate.cpp).
#include <gtest/gtest.h>

#include "models/cost.h"
#include "models/params.h"

namespace hgrn {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.hidden_size = 64;
  m.num_hidden_layers = 2;
  m.expand_ratio = 16;
  m.vocab_size = 128;
  return m;
}

TEST(InfoCost, ChunkSizeFollowsFlaTiling) {
  EXPECT_EQ(gla_chunk_size(1), 16);
  EXPECT_EQ(gla_chunk_size(20), 32);
  EXPECT_EQ(gla_chunk_size(64), 64);
  EXPECT_EQ(gla_chunk_size(2048), 64);
}

TEST(InfoCost, ParameterGroupsSumToTheSpecs) {
  const ModelConfig m = small_model();
  const ModelCost cost = model_cost(m, 64);
  int64_t from_specs = 0;
  for (const ParamSpec& spec : model_param_specs(m)) from_specs += shape_numel(spec.shape);
  int64_t from_groups = 0;
  for (const auto& [group, count] : cost.params_by_group) from_groups += count;
  EXPECT_EQ(cost.params_total, from_specs);
  EXPECT_EQ(from_groups, from_specs);
  ASSERT_EQ(cost.params_by_group.size(), 6u);
  EXPECT_EQ(cost.params_by_group.front().first, "embedding");
  EXPECT_EQ(cost.params_by_group.front().second, 128 * 64);
}

TEST(InfoCost, ForwardFlopsCountedByHand) {
  const ModelConfig m = small_model();  // D 64, H 4, K = V = 16, I 256, vocab 128, 2 layers
  const ModelCost cost = model_cost(m, 64);
  const double projections = 2 * (4.0 * 64 * 64 + 3.0 * 64 * 256);  // per layer: q f i o, gate up down
  const double recurrence = 2.0 * 4 * 16 * 16 * 2 + 2.0 * 64 * 4 * (16 + 16);
  const double lm_head = 2.0 * 128 * 64;
  EXPECT_DOUBLE_EQ(cost.flops_per_token_fwd, 2 * (projections + recurrence) + lm_head);
  EXPECT_DOUBLE_EQ(cost.flops_per_token_train, 3 * cost.flops_per_token_fwd);

  // Tying the embeddings removes the lm_head parameters but not its matmul.
  ModelConfig tied = m;
  tied.tie_word_embeddings = true;
  const ModelCost tied_cost = model_cost(tied, 64);
  EXPECT_EQ(tied_cost.params_total, cost.params_total - 128 * 64);
  EXPECT_DOUBLE_EQ(tied_cost.flops_per_token_fwd, cost.flops_per_token_fwd);
}

TEST(InfoCost, RecurrenceFlopsCountedByHand) {
  // 4·H·K·V (state update and inter-chunk output) + 2·C·H·(K + V) (scores and A·V over whole C×C blocks).
  EXPECT_DOUBLE_EQ(gla_recurrence_flops_per_token(2, 16, 8, 64), 4.0 * 2 * 16 * 8 + 2.0 * 64 * 2 * 24);
  EXPECT_DOUBLE_EQ(gla_recurrence_flops_per_token(8, 128, 128, 64), 524288.0 + 262144.0);
}

TEST(InfoCost, LargeModelIsCloseToSixN) {
  ModelConfig m;
  m.hidden_size = 1024;
  m.num_hidden_layers = 26;
  m.expand_ratio = 128;
  m.vocab_size = 50304;
  const ModelCost cost = model_cost(m, 2048);
  const double non_embedding = static_cast<double>(cost.params_total - 50304 * 1024);
  // 6·N over the matmul parameters, plus a recurrence share of a few percent.
  EXPECT_GT(cost.flops_per_token_train, 6 * non_embedding);
  EXPECT_LT(cost.flops_per_token_train, 1.1 * 6 * non_embedding);
}

}  // namespace
}  // namespace hgrn
