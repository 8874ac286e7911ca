// test_mqar.cpp: the MQAR generator's sequence structure, its determinism and resumability, and its argument
// checks.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data/mqar.h"

namespace hgrn {
namespace {

MqarConfig mqar_config(int64_t pairs, int64_t keys = 0) {
  MqarConfig c;
  c.num_kv_pairs = pairs;
  c.num_keys = keys;
  return c;
}

std::vector<int32_t> row(const Tensor& t, int64_t b) {
  const int64_t T = t.size(1);
  const int32_t* p = t.data<int32_t>() + b * T;
  return std::vector<int32_t>(p, p + T);
}

// Checks every rule of the format documented in mqar.h on one sequence.
void expect_valid_sequence(const MqarGenerator& gen, const std::vector<int32_t>& in, const std::vector<int32_t>& tg) {
  const int64_t P = gen.num_kv_pairs(), T = gen.seq_len();
  const int32_t key_begin = 1, key_end = static_cast<int32_t>(1 + gen.num_keys());
  const int32_t value_end = static_cast<int32_t>(gen.vocab_size());
  std::map<int32_t, int32_t> value_of;
  std::set<int32_t> values;
  for (int64_t j = 0; j < P; ++j) {
    const int32_t key = in[2 * j], value = in[2 * j + 1];
    EXPECT_GE(key, key_begin);
    EXPECT_LT(key, key_end);
    EXPECT_GE(value, key_end);
    EXPECT_LT(value, value_end);
    EXPECT_TRUE(value_of.emplace(key, value).second) << "key " << key << " repeated";
    EXPECT_TRUE(values.insert(value).second) << "value " << value << " repeated";
    EXPECT_EQ(tg[2 * j], kIgnoreTarget);
    EXPECT_EQ(tg[2 * j + 1], kIgnoreTarget);
  }
  std::set<int32_t> queried;
  std::set<int64_t> answer_positions;
  for (int64_t t = 2 * P; t < T; ++t) {
    if (tg[t] == kIgnoreTarget) continue;
    ASSERT_LT(t + 1, T) << "a query needs its answer in the next position";
    auto it = value_of.find(in[t]);
    ASSERT_NE(it, value_of.end()) << "query at " << t << " is not one of the sequence's keys";
    EXPECT_EQ(tg[t], it->second) << "target of the query at " << t;
    EXPECT_EQ(in[t + 1], it->second) << "the answer follows the query";
    EXPECT_TRUE(queried.insert(in[t]).second) << "key " << in[t] << " queried twice";
    answer_positions.insert(t + 1);
  }
  EXPECT_EQ(static_cast<int64_t>(queried.size()), P) << "every pair is queried once";
  for (int64_t t = 2 * P; t < T; ++t) {
    if (tg[t] != kIgnoreTarget) continue;
    if (answer_positions.count(t)) {
      EXPECT_GE(in[t], key_end) << "an answer position holds a value";
    } else {
      EXPECT_EQ(in[t], kMqarFillerToken) << "position " << t << " should be filler";
    }
  }
}

TEST(Mqar, SequencesFollowTheFormat) {
  MqarGenerator gen(mqar_config(8), 64, 64, 42);
  EXPECT_EQ(gen.num_keys(), 31);  // (64 - 1) / 2
  EXPECT_EQ(gen.num_values(), 32);
  TokenBatch batch = gen.next_batch(16);
  EXPECT_EQ(batch.inputs.shape(), (Shape{16, 64}));
  EXPECT_EQ(batch.targets.shape(), (Shape{16, 64}));
  EXPECT_EQ(batch.inputs.dtype(), DType::I32);
  EXPECT_EQ(batch.targets.dtype(), DType::I32);
  EXPECT_EQ(gen.cursor(), 16u);
  int64_t targets_taken = 0;
  for (int64_t b = 0; b < 16; ++b) {
    expect_valid_sequence(gen, row(batch.inputs, b), row(batch.targets, b));
    for (int32_t y : row(batch.targets, b)) targets_taken += y != kIgnoreTarget;
  }
  EXPECT_EQ(targets_taken, 16 * 8);
}

TEST(Mqar, TightestLengthAndExplicitKeyCount) {
  // seq_len == 4P leaves no filler: the query slots tile the second half exactly.
  MqarGenerator tight(mqar_config(4), 32, 16, 7);
  TokenBatch b = tight.next_batch(8);
  for (int64_t i = 0; i < 8; ++i) expect_valid_sequence(tight, row(b.inputs, i), row(b.targets, i));

  MqarGenerator explicit_keys(mqar_config(3, 5), 20, 40, 7);
  EXPECT_EQ(explicit_keys.num_keys(), 5);
  EXPECT_EQ(explicit_keys.num_values(), 14);
  EXPECT_EQ(explicit_keys.first_value(), 6);
  EXPECT_DOUBLE_EQ(explicit_keys.chance_accuracy(), 1.0 / 14.0);
  b = explicit_keys.next_batch(32);
  for (int64_t i = 0; i < 32; ++i) expect_valid_sequence(explicit_keys, row(b.inputs, i), row(b.targets, i));
}

TEST(Mqar, ChanceAccuracyIsOneOverValueCount) {
  MqarGenerator gen(mqar_config(8), 256, 128, 1);
  EXPECT_EQ(gen.num_keys(), 127);
  EXPECT_EQ(gen.num_values(), 128);
  EXPECT_DOUBLE_EQ(gen.chance_accuracy(), 1.0 / 128.0);
}

TEST(Mqar, DrawsCoverKeysValuesAndQueryPositions) {
  // A coarse check that the draws are spread out, not stuck: every key and value id turns up, and queries
  // land on many different positions.
  MqarGenerator gen(mqar_config(4), 21, 48, 3);
  TokenBatch b = gen.next_batch(400);
  std::set<int32_t> keys, values;
  std::set<int64_t> query_positions;
  for (int64_t i = 0; i < 400; ++i) {
    auto in = row(b.inputs, i), tg = row(b.targets, i);
    for (int64_t j = 0; j < 4; ++j) {
      keys.insert(in[2 * j]);
      values.insert(in[2 * j + 1]);
    }
    for (int64_t t = 0; t < 48; ++t)
      if (tg[t] != kIgnoreTarget) query_positions.insert(t);
  }
  EXPECT_EQ(keys.size(), 10u);
  EXPECT_EQ(values.size(), 10u);
  EXPECT_EQ(query_positions.size(), static_cast<size_t>(48 - 8 - 1));  // every position in [2P, T - 1)
}

TEST(Mqar, SameSeedGivesSameBatches) {
  MqarGenerator a(mqar_config(8), 64, 64, 99), b(mqar_config(8), 64, 64, 99);
  for (int k = 0; k < 3; ++k) {
    TokenBatch x = a.next_batch(5), y = b.next_batch(5);
    EXPECT_EQ(x.inputs.to_double_vector(), y.inputs.to_double_vector());
    EXPECT_EQ(x.targets.to_double_vector(), y.targets.to_double_vector());
  }
}

TEST(Mqar, DifferentSeedsGiveDifferentBatches) {
  MqarGenerator a(mqar_config(8), 64, 64, 1), b(mqar_config(8), 64, 64, 2);
  EXPECT_NE(a.next_batch(4).inputs.to_double_vector(), b.next_batch(4).inputs.to_double_vector());
  // And consecutive batches of one stream differ too.
  EXPECT_NE(a.next_batch(4).inputs.to_double_vector(), a.next_batch(4).inputs.to_double_vector());
}

TEST(Mqar, ResumeFromCursorReproducesTheStream) {
  MqarGenerator straight(mqar_config(6), 50, 40, 1234);
  std::vector<TokenBatch> expected;
  for (int k = 0; k < 3; ++k) expected.push_back(straight.next_batch(4));

  MqarGenerator before(mqar_config(6), 50, 40, 1234);
  before.next_batch(4);
  const uint64_t saved = before.cursor();
  EXPECT_EQ(saved, 4u);

  MqarGenerator resumed(mqar_config(6), 50, 40, 1234);
  resumed.set_cursor(saved);
  for (int k = 1; k < 3; ++k) {
    TokenBatch got = resumed.next_batch(4);
    EXPECT_EQ(got.inputs.to_double_vector(), expected[k].inputs.to_double_vector()) << "batch " << k;
    EXPECT_EQ(got.targets.to_double_vector(), expected[k].targets.to_double_vector()) << "batch " << k;
  }
  EXPECT_EQ(resumed.cursor(), 12u);
}

TEST(Mqar, BatchContentsDoNotDependOnBatchSizeHistory) {
  MqarGenerator whole(mqar_config(5), 40, 32, 8);
  TokenBatch all = whole.next_batch(9);
  MqarGenerator pieces(mqar_config(5), 40, 32, 8);
  int64_t row_index = 0;
  for (int64_t size : {2, 4, 3}) {
    TokenBatch part = pieces.next_batch(size);
    for (int64_t i = 0; i < size; ++i, ++row_index) {
      EXPECT_EQ(row(part.inputs, i), row(all.inputs, row_index));
      EXPECT_EQ(row(part.targets, i), row(all.targets, row_index));
    }
  }
}

TEST(Mqar, RejectsBadConfigurations) {
  EXPECT_THROW(MqarGenerator(mqar_config(0), 64, 64, 0), Error);       // no pairs
  EXPECT_THROW(MqarGenerator(mqar_config(-2), 64, 64, 0), Error);
  EXPECT_THROW(MqarGenerator(mqar_config(8), 64, 31, 0), Error);       // seq_len < 4P
  EXPECT_NO_THROW(MqarGenerator(mqar_config(8), 64, 32, 0));           // seq_len == 4P is enough
  EXPECT_THROW(MqarGenerator(mqar_config(1), 2, 8, 0), Error);         // no room for keys and values
  EXPECT_THROW(MqarGenerator(mqar_config(2, 63), 64, 64, 0), Error);   // keys leave no values
  EXPECT_THROW(MqarGenerator(mqar_config(4, 3), 64, 64, 0), Error);    // fewer keys than pairs
  EXPECT_NO_THROW(MqarGenerator(mqar_config(4, 59), 64, 64, 0));       // 64 - 1 - 59 = 4 values: just enough
  EXPECT_THROW(MqarGenerator(mqar_config(4, 60), 64, 64, 0), Error);   // 3 values for 4 distinct answers
  EXPECT_THROW(MqarGenerator(mqar_config(2, -1), 64, 64, 0), Error);
  MqarGenerator gen(mqar_config(2), 16, 16, 0);
  EXPECT_THROW(gen.next_batch(0), Error);
  try {
    MqarGenerator(mqar_config(8), 64, 20, 0);
    FAIL() << "a too-short sequence must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hgrn
