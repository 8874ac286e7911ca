// test_mqar.cpp: the MQAR generator's sequence structure in both query placements (hgrn's uniform one and Zoology's
// power law), its draw distributions, its determinism and resumability, the fixed training set, and its argument
// checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "data/data_sources.h"
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

// Checks every rule of the format documented in mqar.h on one sequence, for the generator's placement and filler.
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
    auto it = value_of.find(in[t]);
    ASSERT_NE(it, value_of.end()) << "query at " << t << " is not one of the sequence's keys";
    EXPECT_EQ(tg[t], it->second) << "target of the query at " << t;
    EXPECT_TRUE(queried.insert(in[t]).second) << "key " << in[t] << " queried twice";
    if (gen.power_law_placement()) {
      // Zoology's slots: even offsets from the end of the pairs, S = (T - 2P) / 2 of them; no value shown.
      EXPECT_EQ((t - 2 * P) % 2, 0) << "query at " << t << " is not at the start of a slot";
      EXPECT_LT((t - 2 * P) / 2, (T - 2 * P) / 2) << "query at " << t << " is past the last slot";
    } else {
      ASSERT_LT(t + 1, T) << "a query needs its answer in the next position";
      EXPECT_EQ(in[t + 1], it->second) << "the answer follows the query";
      answer_positions.insert(t + 1);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(queried.size()), P) << "every pair is queried once";
  for (int64_t t = 2 * P; t < T; ++t) {
    if (tg[t] != kIgnoreTarget) continue;
    if (answer_positions.count(t)) {
      EXPECT_GE(in[t], key_end) << "an answer position holds a value";
    } else if (gen.random_filler()) {
      EXPECT_GE(in[t], 0) << "position " << t;
      EXPECT_LT(in[t], value_end) << "position " << t;
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

// FNV-1a over the int32 tokens of the first `batches` batches (inputs then targets of each).
uint64_t stream_hash(MqarGenerator& gen, int batches, int64_t batch_size) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&](const Tensor& t) {
    const int32_t* p = t.data<int32_t>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const uint32_t v = static_cast<uint32_t>(p[i]);
      for (int byte = 0; byte < 4; ++byte) hash = (hash ^ ((v >> (8 * byte)) & 0xffu)) * 0x100000001b3ULL;
    }
  };
  for (int k = 0; k < batches; ++k) {
    const TokenBatch b = gen.next_batch(batch_size);
    mix(b.inputs);
    mix(b.targets);
  }
  return hash;
}

// The default layout draws exactly the sequences it drew before query_placement, filler and num_train_sequences
// existed: these hashes were taken from the generator at that time (same seeds, ranks, key counts and batches).
TEST(Mqar, UniformPlacementStreamIsUnchanged) {
  MqarGenerator a(mqar_config(8), 64, 64, 42);
  MqarGenerator b(mqar_config(64), 8192, 512, 1234);
  MqarGenerator c(mqar_config(3, 5), 20, 40, 7, 1, 3);
  MqarGenerator d(mqar_config(4), 32, 16, 5);
  EXPECT_EQ(stream_hash(a, 3, 16), 0xe27aad21fcb67124ULL);
  EXPECT_EQ(stream_hash(b, 2, 32), 0x77abf65fdb3ac160ULL);
  EXPECT_EQ(stream_hash(c, 4, 8), 0x73f952c93c671570ULL);
  EXPECT_EQ(stream_hash(d, 2, 8), 0x09b3af829f93143cULL);
}

MqarConfig zoology_config(int64_t pairs, double power_a = 0.01, const std::string& filler = "zero",
                          int64_t train_sequences = 0) {
  MqarConfig c = mqar_config(pairs);
  c.query_placement = "power_law";
  c.power_a = power_a;
  c.filler = filler;
  c.num_train_sequences = train_sequences;
  return c;
}

TEST(Mqar, PowerLawSequencesFollowZoologysLayout) {
  struct Case {
    int64_t pairs, vocab, seq_len;
    const char* filler;
  };
  // Zoology's shape (T = 64, P = 4, V = 8192), the tightest length (T = 4P: every slot holds a query), an odd
  // length (the last position is outside every slot) and random filler.
  for (const Case& k : {Case{4, 8192, 64, "zero"}, Case{6, 64, 24, "zero"}, Case{3, 40, 19, "zero"},
                        Case{8, 64, 64, "random"}, Case{4, 32, 16, "random"}}) {
    SCOPED_TRACE(testing::Message() << "P " << k.pairs << " V " << k.vocab << " T " << k.seq_len << " " << k.filler);
    MqarGenerator gen(zoology_config(k.pairs, 0.01, k.filler), k.vocab, k.seq_len, 11);
    EXPECT_TRUE(gen.power_law_placement());
    EXPECT_EQ(gen.random_filler(), std::string(k.filler) == "random");
    const TokenBatch b = gen.next_batch(64);
    for (int64_t i = 0; i < 64; ++i) expect_valid_sequence(gen, row(b.inputs, i), row(b.targets, i));
  }
  // Zoology's vocabulary split at an even vocabulary: keys [1, V/2), values [V/2, V).
  MqarGenerator gen(zoology_config(4), 8192, 64, 1);
  EXPECT_EQ(gen.first_value(), 4096);
  EXPECT_EQ(gen.num_values(), 4096);
}

TEST(Mqar, UniformPlacementWithRandomFillerFollowsTheFormat) {
  MqarConfig config = mqar_config(8);
  config.filler = "random";
  MqarGenerator gen(config, 64, 64, 42);
  const TokenBatch b = gen.next_batch(32);
  for (int64_t i = 0; i < 32; ++i) expect_valid_sequence(gen, row(b.inputs, i), row(b.targets, i));
}

// The query gaps g = (t - 2P) / 2 of `sequences` sequences, as a list per sequence in pair order.
std::vector<std::vector<int64_t>> query_gaps(MqarGenerator& gen, int64_t sequences) {
  const int64_t P = gen.num_kv_pairs(), T = gen.seq_len();
  const TokenBatch b = gen.next_batch(sequences);
  std::vector<std::vector<int64_t>> gaps;
  for (int64_t i = 0; i < sequences; ++i) {
    const auto in = row(b.inputs, i), tg = row(b.targets, i);
    std::vector<int64_t> by_pair(static_cast<size_t>(P), -1);
    for (int64_t t = 2 * P; t < T; ++t) {
      if (tg[t] == kIgnoreTarget) continue;
      for (int64_t j = 0; j < P; ++j)
        if (in[2 * j] == in[t]) by_pair[static_cast<size_t>(j)] = (t - 2 * P) / 2;
    }
    gaps.push_back(by_pair);
  }
  return gaps;
}

// Zoology's gap probabilities: p(g) proportional to (g + 1)^(a - 1), g = 0 .. S - 1.
std::vector<double> gap_probabilities(double power_a, int64_t slots) {
  std::vector<double> p(static_cast<size_t>(slots));
  double total = 0;
  for (int64_t g = 0; g < slots; ++g) total += p[static_cast<size_t>(g)] = std::pow(g + 1.0, power_a - 1.0);
  for (double& x : p) x /= total;
  return p;
}

// Pearson's statistic of the counts against the probabilities (all cells; each expected count is large here).
double chi_square(const std::vector<double>& counts, const std::vector<double>& probabilities) {
  double n = 0, statistic = 0;
  for (double c : counts) n += c;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = n * probabilities[i];
    statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return statistic;
}

TEST(Mqar, PowerLawGapsFollowZoologysDistribution) {
  // One pair, S = 40 slots: the gap's distribution is p itself. Each law's sample must fit its own p and be far
  // from the others' (the statistic against a wrong law is N times their chi-square divergence: thousands here).
  const std::vector<double> laws = {0.01, 0.5, 1.0};
  const int64_t slots = 40, sequences = 20000;
  for (double drawn : laws) {
    MqarGenerator gen(zoology_config(1, drawn), 64, 2 + 2 * slots, 2024);
    std::vector<double> counts(static_cast<size_t>(slots), 0.0);
    for (const auto& gaps : query_gaps(gen, sequences)) counts[static_cast<size_t>(gaps[0])] += 1;
    for (double expected : laws) {
      const double statistic = chi_square(counts, gap_probabilities(expected, slots));
      SCOPED_TRACE(testing::Message() << "drawn with a = " << drawn << ", tested against a = " << expected);
      if (expected == drawn)
        EXPECT_LT(statistic, 72.05) << "the 0.999 quantile of chi-square with 39 degrees of freedom";
      else
        EXPECT_GT(statistic, 1000.0) << "a wrong law must be rejected";
    }
  }
}

TEST(Mqar, PowerLawGapsAreSuccessiveDrawsInPairOrder) {
  // Two pairs, S = 6 slots: P(g_1 = a, g_2 = b) = p_a p_b / (1 - p_a), numpy's choice(replace=False, p) with the
  // first draw going to the first pair. The same draws given to the pairs the other way round (or exchangeably) have
  // another joint law, which the statistic must reject.
  const int64_t slots = 6, sequences = 40000;
  const std::vector<double> p = gap_probabilities(0.01, slots);
  std::vector<double> in_pair_order, swapped, counts;
  std::map<std::pair<int64_t, int64_t>, size_t> cell;
  for (int64_t a = 0; a < slots; ++a)
    for (int64_t b = 0; b < slots; ++b) {
      if (a == b) continue;
      cell[{a, b}] = counts.size();
      counts.push_back(0);
      in_pair_order.push_back(p[a] * p[b] / (1 - p[a]));
      swapped.push_back(p[a] * p[b] / (1 - p[b]));
    }
  MqarGenerator gen(zoology_config(2), 64, 4 + 2 * slots, 77);
  for (const auto& gaps : query_gaps(gen, sequences)) counts[cell.at({gaps[0], gaps[1]})] += 1;
  EXPECT_LT(chi_square(counts, in_pair_order), 58.30) << "the 0.999 quantile of chi-square with 29 degrees of freedom";
  EXPECT_GT(chi_square(counts, swapped), 1000.0);
}

TEST(Mqar, RandomFillerIsUniformOverTheVocabularyAndLeavesTheRestAlone) {
  // The filler draws come after the layout's, so the keys, values, queries and targets are those of filler 0.
  for (const std::string placement : {"uniform", "power_law"}) {
    SCOPED_TRACE(placement);
    MqarConfig zero = mqar_config(2), random = mqar_config(2);
    zero.query_placement = random.query_placement = placement;
    random.filler = "random";
    const int64_t V = 20, T = 64, sequences = 2000;
    MqarGenerator plain(zero, V, T, 5), noisy(random, V, T, 5);
    const TokenBatch x = plain.next_batch(sequences), y = noisy.next_batch(sequences);
    EXPECT_EQ(x.targets.to_double_vector(), y.targets.to_double_vector());
    std::vector<double> counts(static_cast<size_t>(V), 0.0);
    for (int64_t i = 0; i < sequences; ++i) {
      const auto a = row(x.inputs, i), b = row(y.inputs, i);
      for (int64_t t = 0; t < T; ++t) {
        if (a[t] != kMqarFillerToken) {
          EXPECT_EQ(b[t], a[t]) << "sequence " << i << " position " << t;
        } else {
          counts[static_cast<size_t>(b[t])] += 1;
        }
      }
    }
    EXPECT_LT(chi_square(counts, std::vector<double>(static_cast<size_t>(V), 1.0 / V)), 43.82)
        << "the 0.999 quantile of chi-square with 19 degrees of freedom";
  }
}

// Determinism and resumability, for every layout: the same seed and cursor give the same sequences however the
// earlier ones were batched, and another seed gives others.
TEST(Mqar, EveryLayoutIsDeterministicAndResumable) {
  std::vector<MqarConfig> layouts = {zoology_config(6), zoology_config(6, 0.3, "random"), mqar_config(6)};
  layouts.back().filler = "random";
  layouts.push_back(zoology_config(6, 0.01, "zero", 7));
  for (const MqarConfig& config : layouts) {
    SCOPED_TRACE(mqar_layout_summary(config));
    MqarGenerator whole(config, 50, 40, 1234);
    const TokenBatch all = whole.next_batch(15);
    MqarGenerator same(config, 50, 40, 1234);
    EXPECT_EQ(same.next_batch(15).inputs.to_double_vector(), all.inputs.to_double_vector());
    MqarGenerator other(config, 50, 40, 1235);
    EXPECT_NE(other.next_batch(15).inputs.to_double_vector(), all.inputs.to_double_vector());
    MqarGenerator pieces(config, 50, 40, 1234);
    int64_t row_index = 0;
    for (int64_t size : {2, 6, 3}) {
      const TokenBatch part = pieces.next_batch(size);
      for (int64_t i = 0; i < size; ++i, ++row_index) {
        EXPECT_EQ(row(part.inputs, i), row(all.inputs, row_index));
        EXPECT_EQ(row(part.targets, i), row(all.targets, row_index));
      }
    }
    MqarGenerator resumed(config, 50, 40, 1234);
    resumed.set_cursor(11);
    const TokenBatch rest = resumed.next_batch(4);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(row(rest.inputs, i), row(all.inputs, 11 + i)) << "row " << 11 + i;
  }
}

std::vector<int32_t> sequence_row(const TokenBatch& b, int64_t i) {
  std::vector<int32_t> r = row(b.inputs, i);
  const std::vector<int32_t> t = row(b.targets, i);
  r.insert(r.end(), t.begin(), t.end());
  return r;
}

TEST(Mqar, FixedSetEpochsAreShuffledPassesOverTheFirstSequences) {
  // A set of N = 10: every epoch holds sequences 0 .. 9 of the fresh stream once each, in its own order.
  const int64_t N = 10;
  for (const MqarConfig& fresh : {mqar_config(4), zoology_config(4)}) {
    SCOPED_TRACE(fresh.query_placement);
    MqarConfig fixed_config = fresh;
    fixed_config.num_train_sequences = N;
    MqarGenerator first(fresh, 40, 32, 3), fixed(fixed_config, 40, 32, 3);
    EXPECT_EQ(fixed.num_train_sequences(), N);
    const TokenBatch set = first.next_batch(N);
    std::vector<std::vector<int32_t>> set_rows;
    for (int64_t i = 0; i < N; ++i) set_rows.push_back(sequence_row(set, i));
    std::vector<std::vector<int32_t>> drawn;
    for (int k = 0; k < 5; ++k) {  // batches of 7 straddle the epochs
      const TokenBatch b = fixed.next_batch(7);
      for (int64_t i = 0; i < 7; ++i) drawn.push_back(sequence_row(b, i));
    }
    const TokenBatch big = fixed.next_batch(25);  // one batch over more than two epochs: draws 35 .. 59
    for (int64_t i = 0; i < 25; ++i) drawn.push_back(sequence_row(big, i));
    std::vector<std::vector<size_t>> orders;
    for (int64_t epoch = 0; epoch < 6; ++epoch) {
      std::vector<size_t> order;
      for (int64_t i = 0; i < N; ++i) {
        const auto& r = drawn[static_cast<size_t>(epoch * N + i)];
        const auto it = std::find(set_rows.begin(), set_rows.end(), r);
        ASSERT_NE(it, set_rows.end()) << "epoch " << epoch << " draw " << i << " is not one of the set";
        order.push_back(static_cast<size_t>(it - set_rows.begin()));
      }
      EXPECT_EQ(std::set<size_t>(order.begin(), order.end()).size(), static_cast<size_t>(N))
          << "epoch " << epoch << " repeats a sequence";
      orders.push_back(order);
    }
    EXPECT_EQ(std::set<std::vector<size_t>>(orders.begin(), orders.end()).size(), orders.size())
        << "each epoch has its own order";
    // Resuming mid-epoch reproduces the stream.
    MqarGenerator resumed(fixed_config, 40, 32, 3);
    resumed.set_cursor(23);
    const TokenBatch rest = resumed.next_batch(9);
    for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(sequence_row(rest, i), drawn[static_cast<size_t>(23 + i)]);
  }
}

TEST(Mqar, FixedSetIsSharedOutAmongRanks) {
  // Two ranks of batch 3 draw, step by step, the six draws one process of batch 6 does.
  const MqarConfig config = zoology_config(2, 0.01, "zero", 8);
  MqarGenerator one(config, 30, 16, 9), rank0(config, 30, 16, 9, 0, 2), rank1(config, 30, 16, 9, 1, 2);
  for (int step = 0; step < 4; ++step) {
    const TokenBatch all = one.next_batch(6), a = rank0.next_batch(3), b = rank1.next_batch(3);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_EQ(sequence_row(a, i), sequence_row(all, 2 * i)) << "step " << step;
      EXPECT_EQ(sequence_row(b, i), sequence_row(all, 2 * i + 1)) << "step " << step;
    }
  }
}

TEST(Mqar, HeldOutStreamIgnoresTheFixedSet) {
  // Evaluation reads fresh sequences of its own seed: the training set's size does not change them.
  Config config;
  config.model.vocab_size = 64;
  config.data.seq_len = 32;
  config.data.mqar = zoology_config(4);
  const TokenBatch fresh = make_evaluation_source(config, 17)->next_batch(12);
  config.data.mqar.num_train_sequences = 3;
  const TokenBatch held_out = make_evaluation_source(config, 17)->next_batch(12);
  EXPECT_EQ(held_out.inputs.to_double_vector(), fresh.inputs.to_double_vector());
  EXPECT_EQ(held_out.targets.to_double_vector(), fresh.targets.to_double_vector());
  EXPECT_NE(make_training_source(config, 17)->next_batch(12).inputs.to_double_vector(),
            fresh.inputs.to_double_vector());
}

TEST(Mqar, RejectsBadLayoutSettings) {
  MqarConfig c = mqar_config(2);
  c.query_placement = "powerlaw";
  EXPECT_THROW(MqarGenerator(c, 16, 16, 0), Error);
  for (double a : {0.0, -0.5, 1.5, std::nan("")}) {
    EXPECT_THROW(MqarGenerator(zoology_config(2, a), 16, 16, 0), Error) << a;
  }
  EXPECT_NO_THROW(MqarGenerator(zoology_config(2, 1.0), 16, 16, 0));
  c = mqar_config(2);
  c.filler = "noise";
  EXPECT_THROW(MqarGenerator(c, 16, 16, 0), Error);
  c = mqar_config(2);
  c.num_train_sequences = -1;
  EXPECT_THROW(MqarGenerator(c, 16, 16, 0), Error);
  c.num_train_sequences = kMqarMaxTrainSequences + 1;
  EXPECT_THROW(MqarGenerator(c, 16, 16, 0), Error);
}

}  // namespace
}  // namespace hgrn
