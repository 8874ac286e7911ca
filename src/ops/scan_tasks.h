// scan_tasks.h: how the CPU elementwise scans (gated_scan.cpp, complex_gated_scan.cpp) split a [B, T, C] call over
// OpenMP threads: one task per (batch, block of 64 channels), each scanned over the whole time axis by the same
// sequential code whatever thread runs it, so the result is the same bits for any thread count.
#pragma once
#include <algorithm>
#include <cstdint>

#include "ops/cpu_parallel.h"
#include "ops/gated_scan.h"

namespace hgrn::scan_tasks {

constexpr int64_t kChannelBlock = 64;
constexpr int64_t kDefaultChunk = 64;  // the chunk form's length when the caller passes 0

struct Dims {
  int64_t batch, time, channels;
  int64_t blocks_per_sequence() const { return (channels + kChannelBlock - 1) / kChannelBlock; }
  int64_t tasks() const { return batch * blocks_per_sequence(); }
};

// Block: the scan's own view of one task, built from {b, c0, width, time, channels}.
template <typename Block>
struct Plan {
  Dims dims;
  ScanMode mode;
  int64_t chunk;
  Block block(int64_t task) const {
    const int64_t b = task / dims.blocks_per_sequence(), c0 = (task % dims.blocks_per_sequence()) * kChannelBlock;
    return {b, c0, std::min(kChannelBlock, dims.channels - c0), dims.time, dims.channels};
  }
  // Below kMinParallelElements a call stays on one thread (the finite-difference tests make thousands of tiny ones).
  bool parallel() const { return dims.tasks() > 1 && dims.batch * dims.time * dims.channels >= kMinParallelElements; }
};

}  // namespace hgrn::scan_tasks
