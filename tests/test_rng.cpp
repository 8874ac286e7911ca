// test_rng.cpp: Philox4x32-10 against the Random123 known-answer vectors, state save/restore, sub-streams, the
// distributions drawn from it, and fill_normal (the parallel weight initialisation) against the sequential draws.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include <omp.h>

#include "core/random_fill.h"
#include "core/rng.h"

namespace hgrn {
namespace {

using Block = std::array<uint32_t, 4>;

TEST(Philox, KnownAnswerVectors) {
  // From the Random123 distribution's kat_vectors (philox4x32 10 rounds).
  EXPECT_EQ(philox4x32_10({0u, 0u, 0u, 0u}, {0u, 0u}), (Block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (Block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (Block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, BlocksAreThePhiloxOfSeedAndCounter) {
  const uint64_t seed = 0x0123456789abcdefull;
  Rng rng(seed);
  for (uint64_t n = 0; n < 3; ++n)
    EXPECT_EQ(rng.next_block(), philox4x32_10({static_cast<uint32_t>(n), 0u, 0u, 0u},
                                              {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}));
  EXPECT_EQ(rng.state().counter, 3u);
}

TEST(Rng, SetStateRestoresTheStream) {
  Rng rng(77);
  for (int i = 0; i < 5; ++i) rng.normal();
  const RngState saved = rng.state();
  std::vector<double> first;
  for (int i = 0; i < 10; ++i) first.push_back(i % 2 ? rng.normal() : rng.uniform());
  const uint64_t after_first = rng.next_u64();

  rng.set_state(saved);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(i % 2 ? rng.normal() : rng.uniform(), first[i]) << i;
  EXPECT_EQ(rng.next_u64(), after_first);

  Rng restored(saved);  // constructing from a state is the same as set_state
  EXPECT_EQ(restored.uniform(), first[0]);
  EXPECT_EQ(restored.state(), (RngState{77, saved.counter + 1}));
}

TEST(Rng, SameSeedSameStreamDifferentSeedDifferentStream) {
  Rng a(5), b(5), c(6);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  Rng a2(5);
  int equal = 0;
  for (int i = 0; i < 8; ++i) equal += a2.next_u64() == c.next_u64();
  EXPECT_EQ(equal, 0);
}

TEST(Rng, ForkedStreamsAreReproducibleAndDistinct) {
  Rng parent(2024);
  const RngState before = parent.state();
  Rng f1 = parent.fork(1), f1_again = parent.fork(1), f2 = parent.fork(2);
  EXPECT_EQ(parent.state(), before) << "forking does not advance the parent";
  EXPECT_EQ(f1.state(), f1_again.state());
  EXPECT_EQ(f1.state().counter, 0u);
  EXPECT_NE(f1.state().seed, f2.state().seed);
  EXPECT_NE(f1.next_u64(), f2.next_u64());
  EXPECT_NE(Rng(1).fork(1).state().seed, Rng(2).fork(1).state().seed);
}

TEST(Rng, NormalHasUnitMomentsAndUniformStaysInRange) {
  Rng rng(31337);
  const int n = 100000;
  double sum = 0.0, sum_sq = 0.0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal();
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / n, variance = sum_sq / n - mean * mean;
  // Standard errors: 1/sqrt(n) = 0.0032 for the mean, sqrt(2/n) = 0.0045 for the variance; bounds are ~6 sigma.
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(variance, 1.0, 0.03);

  double uniform_sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    uniform_sum += u;
  }
  EXPECT_NEAR(uniform_sum / n, 0.5, 0.006);  // standard error 0.0009
}

TEST(Rng, BelowStaysInRangeAndHitsEveryValue) {
  Rng rng(8);
  EXPECT_EQ(rng.below(0), 0u);
  EXPECT_EQ(rng.below(1), 0u);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 7000; ++i) {
    const uint64_t x = rng.below(7);
    ASSERT_LT(x, 7u);
    ++counts[x];
  }
  for (int c : counts) {
    EXPECT_GT(c, 800);  // expected 1000 each; sd ~29
    EXPECT_LT(c, 1200);
  }
  const uint64_t big = (1ull << 63) + 12345;  // a bound where the rejection step matters
  for (int i = 0; i < 1000; ++i) ASSERT_LT(rng.below(big), big);
}

// fill_normal must give the values (after the dtype's rounding) and leave the generator where a loop of
// scale · rng.normal() over the elements does, whatever the thread count: sizes below, at and across its 65536-element
// tasks, fp32 and fp64, 1 and 3 threads (ctest runs tests with one OpenMP thread, so the count is set here).
TEST(RandomFill, FillNormalEqualsTheSequentialDrawsOnAnyThreadCount) {
  const int saved_threads = omp_get_max_threads();
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{65536}, int64_t{3 * 65536 + 17}}) {
    for (const DType dtype : {DType::F32, DType::F64}) {
      for (const int threads : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " " << dtype_name(dtype) << " threads " << threads);
        Rng sequential(Rng(77).fork(5).state());
        sequential.next_block();  // start off counter 0
        Rng parallel(sequential.state());
        Tensor expected = Tensor::empty({n}, dtype), got = Tensor::empty({n}, dtype);
        for (int64_t i = 0; i < n; ++i) expected.set_item(i, 0.02 * sequential.normal());
        omp_set_num_threads(threads);
        fill_normal(got, 0.02, parallel);
        omp_set_num_threads(saved_threads);
        EXPECT_EQ(parallel.state(), sequential.state());
        int64_t mismatches = 0;
        for (int64_t i = 0; i < n; ++i) mismatches += expected.item(i) != got.item(i);
        EXPECT_EQ(mismatches, 0);
        EXPECT_NE(got.item(n - 1), 0.0);  // filled to the end
      }
    }
  }
}

}  // namespace
}  // namespace hgrn
