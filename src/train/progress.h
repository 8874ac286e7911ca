// progress.h: what training reports: the human progress line and the machine-readable JSON-lines metrics file.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace hgrn {

struct StepMetrics {
  int64_t step = 0;          // optimiser steps done (1-based after the first update)
  int64_t max_steps = 0;
  double loss = 0;           // mean loss over the step's targets
  double accuracy = 0;       // fraction of targets predicted exactly (argmax)
  double grad_norm = 0;      // before clipping
  double lr = 0;
  double tokens_per_s = 0;   // over the last logging interval
  double elapsed_s = 0;
  double eta_s = 0;
  int64_t tokens_seen = 0;
  double mfu = -1;             // model FLOP utilisation against the measured GPU peak (< 0: not on a GPU)
  double peak_memory_gib = -1; // GPU memory high-water mark of hgrn's tensors (< 0: not on a GPU)
};

std::string format_progress_line(const StepMetrics& m);

// Rewrites the metrics file at `path` (atomically; nothing when it does not exist) without the records of steps after
// `step` and without a last line cut short, and returns how many lines went. A run resumed from the checkpoint of
// `step` recomputes exactly those steps, so their records are dropped, not kept: they are written again.
int64_t drop_metrics_after(const std::string& path, int64_t step);

// Appends one JSON object per call to a file (created if missing); flushed every line so a killed run keeps it.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path);
  void append(const std::string& kind, const StepMetrics& m);
  void append_eval(int64_t step, double loss, double accuracy);
  // {"kind": "resume", "step", "checkpoint"}: where a resumed run continues.
  void append_resume(int64_t step, const std::string& checkpoint);
  // {"kind": "nonfinite", "step", "loss", "grad_norm", "in_a_row"}: a step skipped for a NaN/inf loss or norm.
  void append_nonfinite(int64_t step, double loss, double grad_norm, int64_t in_a_row);

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace hgrn
