// trace.h: NVTX ranges, so that an Nsight Systems timeline reads like the model: "layer 3" forward, "layer 3
// backward", "optimizer", "allreduce"... No-ops in a CPU-only build. Ranges cost ~1 µs, so they mark layers and
// phases, not single kernels.
#pragma once
#include <string>

#include "core/autograd.h"

namespace hgrn {

void trace_push(const std::string& name);
void trace_pop();
// HGRN_PROFILE: forget the totals so far (hgrn bench calls it after the warm-up, whose first step also times the
// GEMM algorithms, so that the printed breakdown is of steady steps only).
void trace_profile_reset();
// The innermost open range's name, digits folded ("layer #"), "" outside any; kept only under HGRN_MEMORY_REPORT
// (cuda_memory_report_enabled), whose allocator tags blocks with it.
std::string trace_innermost_range();

// A range for the lifetime of a scope (a training phase).
class TraceRange {
 public:
  explicit TraceRange(const std::string& name) { trace_push(name); }
  ~TraceRange() { trace_pop(); }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;
};

// A range around a layer's forward, plus a matching range "<name> backward" around the same layer's backward: the
// tape runs closures in reverse, so the backward range opens at a marker recorded when the forward scope ends and
// closes at a marker recorded when it began.
class TraceLayer {
 public:
  TraceLayer(Tape& tape, std::string name) : tape_(tape), name_(std::move(name)) {
    trace_push(name_);
    tape_.record([] { trace_pop(); });
  }
  ~TraceLayer() {
    tape_.record([name = name_ + " backward"] { trace_push(name); });
    trace_pop();
  }
  TraceLayer(const TraceLayer&) = delete;
  TraceLayer& operator=(const TraceLayer&) = delete;

 private:
  Tape& tape_;
  std::string name_;
};

}  // namespace hgrn
