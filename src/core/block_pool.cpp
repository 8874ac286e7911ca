// block_pool.cpp: see block_pool.h.
#include "core/block_pool.h"

#include <algorithm>
#include <vector>

namespace hgrn {

BlockPool::BlockPool(Policy policy, std::function<void*(size_t)> source, std::function<void(void*)> sink)
    : policy_(policy), source_(std::move(source)), sink_(std::move(sink)) {}

BlockPool::~BlockPool() {
  // Every block still live or free: walk each segment from its first block, give the segment back, free the nodes.
  std::vector<Block*> firsts;
  for (Block* b : free_blocks_)
    if (!b->prev) firsts.push_back(b);
  for (const auto& [ptr, b] : live_)
    if (!b->prev) firsts.push_back(b);
  for (Block* first : firsts) {
    sink_(first->ptr);
    for (Block* b = first; b;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

BlockPool::Block* BlockPool::new_segment(size_t size) {
  const size_t bytes = round_up(std::max(size, policy_.segment), policy_.segment_granule);
  void* p = source_(bytes);
  if (!p) return nullptr;
  reserved_ += bytes;
  segments_ += 1;
  return new Block{static_cast<char*>(p), bytes, true, nullptr, nullptr};
}

void* BlockPool::allocate(size_t bytes, size_t* held) {
  const size_t size = round_up(std::max<size_t>(bytes, 1), policy_.granule);
  Block key{nullptr, size, true, nullptr, nullptr};
  Block* block;
  auto it = free_blocks_.lower_bound(&key);  // the smallest free block that holds the request (lowest address first)
  if (it != free_blocks_.end()) {
    block = *it;
    free_blocks_.erase(it);
  } else {
    block = new_segment(size);
    if (!block) return nullptr;
  }
  if (block->size - size >= policy_.min_split) {  // the rest becomes a free block right after this one
    Block* rest = new Block{block->ptr + size, block->size - size, true, block, block->next};
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    free_blocks_.insert(rest);
  }
  block->free = false;
  live_[block->ptr] = block;
  *held = block->size;
  return block->ptr;
}

void BlockPool::absorb_next(Block* block) {
  Block* next = block->next;
  block->size += next->size;
  block->next = next->next;
  if (next->next) next->next->prev = block;
  delete next;
}

size_t BlockPool::free(void* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end()) return 0;
  Block* block = it->second;
  live_.erase(it);
  const size_t held = block->size;
  // Merge with free neighbours, so that the segment's free space stays in as few blocks as possible.
  if (block->next && block->next->free) {
    free_blocks_.erase(block->next);
    absorb_next(block);
  }
  if (Block* prev = block->prev; prev && prev->free) {
    free_blocks_.erase(prev);
    absorb_next(prev);
    block = prev;
  }
  block->free = true;
  free_blocks_.insert(block);
  return held;
}

size_t BlockPool::release_free_segments() {
  size_t released = 0;
  for (auto it = free_blocks_.begin(); it != free_blocks_.end();) {
    Block* b = *it;
    if (b->prev || b->next) {  // part of a segment that is still partly in use
      ++it;
      continue;
    }
    it = free_blocks_.erase(it);
    sink_(b->ptr);
    reserved_ -= b->size;
    segments_ -= 1;
    released += b->size;
    delete b;
  }
  return released;
}

}  // namespace hgrn
