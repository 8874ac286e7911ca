// block_pool.h: the bookkeeping of the CUDA caching allocator (kernels/allocator.cu), free of CUDA so that the CPU
// tests exercise it. Segments come from a source (cudaMalloc there) and are cut into blocks: a request takes the
// smallest free block that holds it and splits off the rest when the rest is worth keeping, and a freed block merges
// with its free neighbours in the segment. A cached block therefore never holds much more than its request (the
// allocator's earlier free list handed out whole blocks up to twice the request: 3.2 GiB of its 38.6 GiB peak at
// hgrn2-1b was that slack) while the steady state still asks the driver for nothing.
#pragma once
#include <cstddef>
#include <functional>
#include <set>
#include <unordered_map>

namespace hgrn {

class BlockPool {
 public:
  struct Policy {
    size_t granule;        // requests round up to a multiple of this (the blocks' alignment)
    size_t segment;        // a new segment holds max(request, this), rounded up to a multiple of segment_granule
    size_t segment_granule;
    size_t min_split;      // a block splits only when at least this much would be left over
  };
  // source(bytes) returns a new segment or null when the device is out of memory; sink(ptr) gives one back.
  BlockPool(Policy policy, std::function<void*(size_t)> source, std::function<void(void*)> sink);
  ~BlockPool();  // gives every segment back to the sink
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A block of at least `bytes`, or null when the source has none to give (the caller may release_free_segments
  // and ask again). *held is the block's size, which the allocator counts as in use.
  void* allocate(size_t bytes, size_t* held);
  // Returns a block from allocate; gives the held size (0 for a pointer this pool never gave out).
  size_t free(void* ptr);
  // Gives every wholly free segment back to the sink; returns the bytes given back.
  size_t release_free_segments();

  size_t reserved_bytes() const { return reserved_; }
  size_t segment_count() const { return segments_; }
  size_t free_block_count() const { return free_blocks_.size(); }

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool free;
    Block* prev;  // neighbours in the same segment, by address
    Block* next;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  size_t round_up(size_t bytes, size_t unit) const { return (bytes + unit - 1) / unit * unit; }
  Block* new_segment(size_t size);
  // `block` takes over its next neighbour in the segment (already out of free_blocks_), which is deleted.
  void absorb_next(Block* block);

  Policy policy_;
  std::function<void*(size_t)> source_;
  std::function<void(void*)> sink_;
  std::set<Block*, BySizeThenAddress> free_blocks_;
  std::unordered_map<void*, Block*> live_;
  size_t reserved_ = 0, segments_ = 0;
};

}  // namespace hgrn
