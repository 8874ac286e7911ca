// progress.cpp: formatting of progress lines and JSON metrics records.
#include "train/progress.h"

#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "core/format.h"

namespace hgrn {

std::string format_progress_line(const StepMetrics& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %6lld/%lld | loss %.4f | acc %.3f | grad norm %.3f | lr %.2e | %.0f tok/s | elapsed %s | ETA %s",
                static_cast<long long>(m.step), static_cast<long long>(m.max_steps), m.loss, m.accuracy,
                m.grad_norm, m.lr, m.tokens_per_s, format_duration(m.elapsed_s).c_str(),
                format_duration(m.eta_s).c_str());
  std::string line = buf;
  if (m.mfu >= 0) {
    std::snprintf(buf, sizeof buf, " | MFU %.1f%% | peak mem %.2f GiB", 100.0 * m.mfu, m.peak_memory_gib);
    line += buf;
  }
  return line;
}

MetricsFile::MetricsFile(const std::string& path) : out_(path, std::ios::app), path_(path) {
  HGRN_CHECK(out_.good(), "cannot open the metrics file '", path, "' for writing: check that its directory exists and is writable");
}

void MetricsFile::append(const std::string& kind, const StepMetrics& m) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "{\"kind\": \"%s\", \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g, \"grad_norm\": %.6g, "
                "\"lr\": %.6g, \"tokens_per_s\": %.6g, \"tokens_seen\": %lld, \"elapsed_s\": %.3f, \"mfu\": %.4g, "
                "\"peak_memory_gib\": %.4g}",
                kind.c_str(), static_cast<long long>(m.step), m.loss, m.accuracy, m.grad_norm, m.lr, m.tokens_per_s,
                static_cast<long long>(m.tokens_seen), m.elapsed_s, m.mfu, m.peak_memory_gib);
  out_ << buf << '\n';
  out_.flush();
  HGRN_CHECK(out_.good(), "writing the metrics file '", path_, "' failed (disk full?)");
}

void MetricsFile::append_eval(int64_t step, double loss, double accuracy) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "{\"kind\": \"eval\", \"step\": %lld, \"loss\": %.6g, \"accuracy\": %.6g}",
                static_cast<long long>(step), loss, accuracy);
  out_ << buf << '\n';
  out_.flush();
  HGRN_CHECK(out_.good(), "writing the metrics file '", path_, "' failed (disk full?)");
}

}  // namespace hgrn
