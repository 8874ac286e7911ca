// test_block_pool.cpp: the caching allocator's bookkeeping (core/block_pool.h) on host memory: best fit, splitting
// (a block holds its rounded request, not a whole cached block), merging freed neighbours, reuse without new
// segments, giving wholly free segments back, a source out of memory, and a random alloc/free run whose live blocks
// never overlap and whose segments end as one free block each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "core/block_pool.h"

namespace hgrn {
namespace {

constexpr size_t kMiB = 1u << 20;

// A segment source over malloc with a capacity (0: unlimited), counting what it hands out.
struct Source {
  size_t capacity = 0, outstanding = 0, calls = 0;
  std::map<void*, size_t> segments;
  void* take(size_t bytes) {
    if (capacity && outstanding + bytes > capacity) return nullptr;
    void* p = std::aligned_alloc(512, bytes);
    segments[p] = bytes;
    outstanding += bytes;
    calls += 1;
    return p;
  }
  void give(void* p) {
    outstanding -= segments.at(p);
    segments.erase(p);
    std::free(p);
  }
};

// The large-request policy of kernels/allocator.cu: 512-byte blocks, segments of the request's size rounded to
// 2 MiB, splits that leave at least 1 MiB.
BlockPool large_pool(Source& s) {
  return BlockPool({512, 0, 2 * kMiB, kMiB}, [&s](size_t n) { return s.take(n); }, [&s](void* p) { s.give(p); });
}

TEST(BlockPool, ABlockHoldsItsRoundedRequestAndTheRestIsSplitOff) {
  Source src;
  BlockPool pool = large_pool(src);
  size_t held = 0;
  void* big = pool.allocate(100 * kMiB, &held);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(held, 100 * kMiB);
  pool.free(big);
  // A 30 MiB request takes the front of the cached 100 MiB block; 70 MiB stay free for the next ones.
  void* a = pool.allocate(30 * kMiB + 1, &held);
  EXPECT_EQ(a, big);
  EXPECT_EQ(held, 30 * kMiB + 512);
  void* b = pool.allocate(40 * kMiB, &held);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(big) + 30 * kMiB + 512);
  EXPECT_EQ(held, 40 * kMiB);
  EXPECT_EQ(src.calls, 1u) << "both came out of the first segment";
  EXPECT_EQ(pool.reserved_bytes(), 100 * kMiB);
}

TEST(BlockPool, ALeftoverBelowTheSplitMinimumStaysWithTheBlock) {
  Source src;
  BlockPool pool = large_pool(src);
  size_t held = 0;
  void* p = pool.allocate(10 * kMiB, &held);
  pool.free(p);
  EXPECT_EQ(pool.allocate(10 * kMiB - 4096, &held), p);
  EXPECT_EQ(held, 10 * kMiB) << "4 KiB left over is under the 1 MiB split minimum";
}

TEST(BlockPool, FreedNeighboursMergeSoThatTheWholeSegmentServesAgain) {
  Source src;
  BlockPool pool = large_pool(src);
  size_t held = 0;
  void* whole = pool.allocate(64 * kMiB, &held);
  pool.free(whole);
  std::vector<void*> parts;
  for (int i = 0; i < 4; ++i) parts.push_back(pool.allocate(16 * kMiB, &held));
  EXPECT_EQ(src.calls, 1u);
  for (int i : {1, 3, 0, 2}) pool.free(parts[i]);  // merges with a next, a prev and both
  EXPECT_EQ(pool.free_block_count(), 1u);
  EXPECT_EQ(pool.allocate(64 * kMiB, &held), whole);
  EXPECT_EQ(src.calls, 1u) << "the merged segment served the whole request";
}

TEST(BlockPool, TheSmallestFittingBlockIsTaken) {
  Source src;
  BlockPool pool = large_pool(src);
  size_t held = 0;
  void* a = pool.allocate(50 * kMiB, &held);
  void* b = pool.allocate(8 * kMiB, &held);
  void* c = pool.allocate(20 * kMiB, &held);
  pool.free(a);
  pool.free(b);
  pool.free(c);
  EXPECT_EQ(pool.allocate(7 * kMiB, &held), b);
  EXPECT_EQ(pool.allocate(19 * kMiB, &held), c);
}

TEST(BlockPool, WhollyFreeSegmentsGoBackAndPartlyUsedOnesStay) {
  Source src;
  BlockPool pool = large_pool(src);
  size_t held = 0;
  void* a = pool.allocate(4 * kMiB, &held);
  void* b = pool.allocate(6 * kMiB, &held);
  pool.free(a);
  EXPECT_EQ(pool.segment_count(), 2u);
  EXPECT_EQ(pool.release_free_segments(), 4 * kMiB);
  EXPECT_EQ(pool.segment_count(), 1u);
  EXPECT_EQ(pool.reserved_bytes(), 6 * kMiB);
  EXPECT_EQ(src.outstanding, 6 * kMiB);
  void* c = pool.allocate(2 * kMiB, &held);  // a new segment: b's is fully used
  pool.free(b);
  EXPECT_EQ(pool.release_free_segments(), 6 * kMiB);
  EXPECT_EQ(src.outstanding, 2 * kMiB);
  pool.free(c);
  EXPECT_EQ(pool.free(c), 0u) << "a pointer freed twice (or never given out) is not the pool's";
}

TEST(BlockPool, AnExhaustedSourceGivesNullUntilSegmentsAreReleased) {
  Source src;
  src.capacity = 10 * kMiB;
  BlockPool pool = large_pool(src);
  size_t held = 0;
  void* a = pool.allocate(6 * kMiB, &held);
  ASSERT_NE(a, nullptr);
  pool.free(a);
  // 8 MiB does not fit the cached 6 MiB block, and the source has only 4 MiB left.
  EXPECT_EQ(pool.allocate(8 * kMiB, &held), nullptr);
  pool.release_free_segments();
  EXPECT_NE(pool.allocate(8 * kMiB, &held), nullptr);
}

TEST(BlockPool, RandomAllocationsNeverOverlapAndEndAsOneFreeBlockPerSegment) {
  Source src;
  BlockPool small({512, 2 * kMiB, 2 * kMiB, 512}, [&](size_t n) { return src.take(n); },
                  [&](void* p) { src.give(p); });
  std::mt19937_64 rng(42);
  std::map<char*, size_t> live;  // start -> held
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      const size_t bytes = 1 + rng() % (256 * 1024);
      size_t held = 0;
      char* p = static_cast<char*>(small.allocate(bytes, &held));
      ASSERT_NE(p, nullptr);
      ASSERT_GE(held, bytes);
      ASSERT_LT(held, bytes + 1024) << "at most the 512-byte rounding plus a leftover under 512";
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
      auto next = live.lower_bound(p);
      if (next != live.end()) ASSERT_LE(p + held, next->first) << "overlaps the next live block";
      if (next != live.begin()) ASSERT_LE(std::prev(next)->first + std::prev(next)->second, p) << "overlaps";
      live[p] = held;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_EQ(small.free(it->first), it->second);
      live.erase(it);
    }
  }
  size_t in_use = 0;
  for (const auto& [p, held] : live) in_use += held;
  EXPECT_LE(in_use, small.reserved_bytes());
  for (const auto& [p, held] : live) small.free(p);
  EXPECT_EQ(small.free_block_count(), small.segment_count());
  const size_t reserved = small.reserved_bytes();
  EXPECT_EQ(small.release_free_segments(), reserved);
  EXPECT_EQ(src.outstanding, 0u);
  EXPECT_EQ(small.reserved_bytes(), 0u);
}

}  // namespace
}  // namespace hgrn
