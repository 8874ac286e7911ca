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

// Appends one JSON object per call to a file (created if missing); flushed every line so a killed run keeps it.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path);
  void append(const std::string& kind, const StepMetrics& m);
  void append_eval(int64_t step, double loss, double accuracy);

 private:
  std::ofstream out_;
  std::string path_;
};

}  // namespace hgrn
