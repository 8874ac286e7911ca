// test_window_sampler.cpp: the window sampler over a shard whose token t has id t, so every window's position can
// be read off its ids: window contents, the per-epoch permutation (every window once), data-parallel ranks (disjoint
// and covering), exact resume through set_cursor, epoch boundaries, seeds, and argument validation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "scratch_dir.h"
#include "data/token_shards.h"
#include "data/window_sampler.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

using testing::ScratchDir;

// A shard of `tokens` tokens with ids 0, 1, ..., split into documents of up to 7 tokens (the sampler must not care
// where documents end), written to `prefix`.
std::shared_ptr<const TokenShardReader> counting_shard(const std::string& prefix, int64_t tokens) {
  {
    TokenShardWriter writer(prefix, 1 << 20);
    for (int64_t start = 0; start < tokens; start += 7) {
      std::vector<int32_t> document;
      for (int64_t t = start; t < std::min(tokens, start + 7); ++t) document.push_back(static_cast<int32_t>(t));
      writer.append_document(document);
    }
    writer.finish();
  }
  return std::make_shared<const TokenShardReader>(prefix);
}

WindowSamplerOptions options(int64_t seq_len, uint64_t seed = 1, bool shuffle = true, int64_t rank = 0,
                             int64_t world_size = 1) {
  WindowSamplerOptions o;
  o.seq_len = seq_len;
  o.seed = seed;
  o.shuffle = shuffle;
  o.rank = rank;
  o.world_size = world_size;
  return o;
}

std::vector<int32_t> ids(const Tensor& tensor) {
  const int32_t* data = tensor.data<int32_t>();
  return std::vector<int32_t>(data, data + tensor.numel());
}

// The window each row of a batch holds, checking on the way that it is a whole, correctly shifted window.
std::vector<int64_t> windows_of(const TokenBatch& batch, int64_t seq_len, int64_t tokens) {
  std::vector<int64_t> windows;
  const std::vector<int32_t> inputs = ids(batch.inputs), targets = ids(batch.targets);
  for (size_t row = 0; row * seq_len < inputs.size(); ++row) {
    const int64_t start = inputs[row * seq_len];
    EXPECT_EQ(start % seq_len, 0);
    EXPECT_LE(start + seq_len + 1, tokens);
    for (int64_t i = 0; i < seq_len; ++i) {
      EXPECT_EQ(inputs[row * seq_len + i], start + i);
      EXPECT_EQ(targets[row * seq_len + i], start + i + 1);
    }
    windows.push_back(start / seq_len);
  }
  return windows;
}

TEST(WindowSampler, SequentialWindowsHoldTheRightTokens) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(23))), 23);
  WindowSampler sampler(shard, options(4, 1, /*shuffle=*/false));
  EXPECT_EQ(sampler.num_windows(), 5);  // floor((23 - 1) / 4)
  const TokenBatch batch = sampler.next_batch(5);
  ASSERT_EQ(batch.inputs.shape(), (Shape{5, 4}));
  ASSERT_EQ(batch.targets.shape(), (Shape{5, 4}));
  EXPECT_EQ(batch.inputs.dtype(), DType::I32);
  std::vector<int32_t> expected_inputs, expected_targets;
  for (int32_t w = 0; w < 5; ++w)
    for (int32_t i = 0; i < 4; ++i) {
      expected_inputs.push_back(4 * w + i);
      expected_targets.push_back(4 * w + i + 1);
    }
  EXPECT_EQ(ids(batch.inputs), expected_inputs);
  EXPECT_EQ(ids(batch.targets), expected_targets);
  // The next epoch starts again at window 0.
  EXPECT_EQ(ids(sampler.next_batch(1).inputs), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(WindowSampler, ExactFitUsesEveryToken) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(9))), 9);  // 2 windows of 4 + 1 overlap = 9 tokens
  WindowSampler sampler(shard, options(4, 1, false));
  ASSERT_EQ(sampler.num_windows(), 2);
  EXPECT_EQ(ids(sampler.next_batch(2).targets), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(WindowSampler, FeistelPermutationIsABijectionForManySizes) {
  for (uint64_t size : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 9u, 31u, 64u, 100u, 1000u, 4097u}) {
    for (uint64_t key : {0ull, 1ull, 0xdeadbeefcafef00dull}) {
      FeistelPermutation permutation(size, key);
      std::vector<uint64_t> image;
      for (uint64_t i = 0; i < size; ++i) image.push_back(permutation(i));
      std::sort(image.begin(), image.end());
      std::vector<uint64_t> all(size);
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(image, all) << "size " << size << " key " << key;
    }
  }
  EXPECT_THROW(FeistelPermutation(10, 1)(10), Error);
}

TEST(WindowSampler, OneEpochVisitsEveryWindowOnce) {
  ScratchDir scratch;
  for (int64_t tokens : {2, 3, 12, 101, 1001}) {
    auto shard = counting_shard((scratch / ("counting_" + std::to_string(tokens))), tokens);
    for (int64_t seq_len : {1, 3}) {
      if (tokens < seq_len + 1) continue;
      WindowSampler sampler(shard, options(seq_len, 42));
      const int64_t windows = sampler.num_windows();
      ASSERT_EQ(windows, (tokens - 1) / seq_len);
      std::vector<int64_t> seen = windows_of(sampler.next_batch(windows), seq_len, tokens);
      const std::vector<int64_t> order = seen;
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(windows));
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(seen, all) << tokens << " tokens, seq_len " << seq_len;
      if (windows >= 100) EXPECT_NE(order, all) << "the shuffled order is the identity";
    }
  }
}

TEST(WindowSampler, RanksAreDisjointAndCoverEachEpoch) {
  ScratchDir scratch;
  for (int64_t world_size : {1, 2, 3, 4}) {
    for (int64_t tokens : {13, 41}) {  // 12 windows (divisible by 1..4), 40 windows (not by 3)
      auto shard = counting_shard((scratch / ("counting_" + std::to_string(tokens))), tokens);
      const int64_t windows = tokens - 1;
      std::vector<int64_t> seen;
      for (int64_t rank = 0; rank < world_size; ++rank) {
        WindowSampler sampler(shard, options(1, 9, true, rank, world_size));
        // This rank's share of epoch 0: its global positions rank, rank + world_size, ... below W.
        const int64_t share = (windows - rank + world_size - 1) / world_size;
        const std::vector<int64_t> mine = windows_of(sampler.next_batch(share), 1, tokens);
        seen.insert(seen.end(), mine.begin(), mine.end());
        EXPECT_EQ(sampler.epoch(), 1u) << "rank " << rank;
      }
      std::sort(seen.begin(), seen.end());
      std::vector<int64_t> all(static_cast<size_t>(windows));
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(seen, all) << "world " << world_size << ", " << windows << " windows";
    }
  }
}

TEST(WindowSampler, RanksInterleaveTheSingleProcessStream) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(101))), 101);
  WindowSampler single(shard, options(2, 5));
  const std::vector<int64_t> stream = windows_of(single.next_batch(120), 2, 101);
  for (int64_t rank = 0; rank < 3; ++rank) {
    WindowSampler sampler(shard, options(2, 5, true, rank, 3));
    const std::vector<int64_t> mine = windows_of(sampler.next_batch(40), 2, 101);
    for (size_t c = 0; c < mine.size(); ++c) EXPECT_EQ(mine[c], stream[c * 3 + rank]);
  }
}

TEST(WindowSampler, SetCursorResumesTheExactNextBatch) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(1001))), 1001);
  WindowSampler original(shard, options(8, 3, true, 1, 2));
  original.next_batch(7);
  original.next_batch(50);  // crosses into epoch 1 (W = 125, this rank's share is 62 or 63 per epoch)
  original.next_batch(13);
  EXPECT_EQ(original.cursor(), 70u);
  WindowSampler resumed(shard, options(8, 3, true, 1, 2));
  resumed.set_cursor(original.cursor());
  for (int64_t batch : {5, 64, 1}) {
    const TokenBatch a = original.next_batch(batch), b = resumed.next_batch(batch);
    EXPECT_EQ(ids(a.inputs), ids(b.inputs));
    EXPECT_EQ(ids(a.targets), ids(b.targets));
  }
  EXPECT_EQ(original.cursor(), resumed.cursor());
}

TEST(WindowSampler, BatchesDependOnlyOnTheCursor) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(101))), 101);
  WindowSampler whole(shard, options(3, 11)), pieces(shard, options(3, 11));
  const std::vector<int32_t> all = ids(whole.next_batch(40).inputs);
  std::vector<int32_t> joined;
  for (int64_t batch : {1, 17, 22}) {
    const std::vector<int32_t> part = ids(pieces.next_batch(batch).inputs);
    joined.insert(joined.end(), part.begin(), part.end());
  }
  EXPECT_EQ(joined, all);
}

TEST(WindowSampler, CursorCrossesEpochBoundariesSeamlessly) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(51))), 51);  // 50 windows of 1
  WindowSampler sampler(shard, options(1, 21));
  EXPECT_EQ(sampler.epoch(), 0u);
  std::vector<int64_t> windows = windows_of(sampler.next_batch(30), 1, 51);
  EXPECT_EQ(sampler.epoch(), 0u);
  const std::vector<int64_t> more = windows_of(sampler.next_batch(40), 1, 51);  // 20 of epoch 0, 20 of epoch 1
  windows.insert(windows.end(), more.begin(), more.end());
  EXPECT_EQ(sampler.cursor(), 70u);
  EXPECT_EQ(sampler.epoch(), 1u);
  std::vector<int64_t> epoch0(windows.begin(), windows.begin() + 50);
  const std::vector<int64_t> epoch1_start(windows.begin() + 50, windows.end());
  for (size_t i = 0; i < windows.size(); ++i) EXPECT_EQ(windows[i], sampler.window_at(i));
  // Epoch 1 is a different permutation: its first 20 windows differ from epoch 0's first 20.
  EXPECT_NE(epoch1_start, std::vector<int64_t>(epoch0.begin(), epoch0.begin() + 20));
  std::sort(epoch0.begin(), epoch0.end());
  for (int64_t w = 0; w < 50; ++w) EXPECT_EQ(epoch0[static_cast<size_t>(w)], w);
  // And a full epoch 1 is again every window once.
  std::vector<int64_t> epoch1;
  for (uint64_t c = 50; c < 100; ++c) epoch1.push_back(sampler.window_at(c));
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch1, epoch0);
}

TEST(WindowSampler, SameSeedSameOrderDifferentSeedDifferentOrder) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(1001))), 1001);
  WindowSampler a(shard, options(4, 100)), b(shard, options(4, 100)), c(shard, options(4, 101));
  const std::vector<int32_t> first = ids(a.next_batch(64).inputs);
  EXPECT_EQ(first, ids(b.next_batch(64).inputs));
  EXPECT_NE(first, ids(c.next_batch(64).inputs));
}

TEST(WindowSampler, DocumentStartsBecomeResetFlags) {
  // Documents 10, 11 .. with an EOS (id 0) after each, of lengths 3, 1, 5, 2, 4 (EOS included: 4, 2, 6, 3, 5): the
  // stream 10 11 12 0 | 13 0 | 14 15 16 17 18 0 | 19 20 0 | 21 22 23 24 0. A document starts at token 0 and after
  // every EOS; flag t of a window marks input t, with the token before the window read from the shard.
  ScratchDir scratch;
  const std::string prefix = scratch / "documents";
  std::vector<int32_t> stream;
  {
    TokenShardWriter writer(prefix, 64);
    int32_t next = 10;
    for (int length : {3, 1, 5, 2, 4}) {
      std::vector<int32_t> document;
      for (int i = 0; i < length; ++i) document.push_back(next++);
      document.push_back(0);
      stream.insert(stream.end(), document.begin(), document.end());
      writer.append_document(document);
    }
    writer.finish();
  }
  const auto shard = std::make_shared<const TokenShardReader>(prefix);
  WindowSamplerOptions o = options(4, 1, /*shuffle=*/false);
  o.document_eos = 0;
  WindowSampler sampler(shard, o);
  const TokenBatch batch = sampler.next_batch(sampler.num_windows());
  ASSERT_TRUE(batch.resets.defined());
  ASSERT_EQ(batch.resets.shape(), batch.inputs.shape());
  const std::vector<int32_t> flags = ids(batch.resets);
  for (size_t i = 0; i < flags.size(); ++i) {
    const bool starts = i == 0 || stream[i - 1] == 0;  // window w's input t is stream token 4w + t = i
    EXPECT_EQ(flags[i], starts ? 1 : 0) << "token " << i;
  }
  // Windows 1 and 3 start right after an EOS (tokens 4 and 12): the flag of their first input comes from the shard.
  ASSERT_EQ(flags.size(), 16u);  // floor((20 − 1) / 4) = 4 windows
  EXPECT_EQ(flags[4], 1);
  EXPECT_EQ(flags[12], 1);
  EXPECT_EQ(flags[8], 0);  // window 2 starts mid-document
  // Without document_eos there are no flags.
  EXPECT_FALSE(WindowSampler(shard, options(4)).next_batch(2).resets.defined());
}

TEST(WindowSampler, RejectsBadArgumentsNamingTheShard) {
  ScratchDir scratch;
  auto shard = counting_shard((scratch / ("counting_" + std::to_string(12))), 12);
  auto message_of = [&](const WindowSamplerOptions& o) {
    try {
      WindowSampler sampler(shard, o);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::vector<WindowSamplerOptions> bad_options = {options(0), options(12), options(4, 1, true, 2, 2),
                                                         options(4, 1, true, -1)};
  for (const WindowSamplerOptions& bad : bad_options) {
    const std::string message = message_of(bad);
    EXPECT_NE(message.find(shard->prefix()), std::string::npos) << message;
  }
  EXPECT_NE(message_of(options(12)).find("fewer than one window"), std::string::npos);
  EXPECT_EQ(message_of(options(11)), "no error");  // 12 tokens: exactly one window of 11 + 1
  WindowSampler sampler(shard, options(2));
  EXPECT_THROW(sampler.next_batch(0), Error);
}

}  // namespace
}  // namespace hgrn
