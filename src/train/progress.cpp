// progress.cpp: formatting of progress lines and JSON metrics records.
#include "train/progress.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/check.h"
#include "core/format.h"
#include "io/atomic_write.h"

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

// A number as JSON: %.<digits>g, or null where it is not finite (JSON has no NaN or Infinity).
static std::string json_number(double value, int digits = 6) {
  if (!std::isfinite(value)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, value);
  return buf;
}

void MetricsFile::append(const std::string& kind, const StepMetrics& m) {
  char head[128];
  std::snprintf(head, sizeof head, "{\"kind\": \"%s\", \"step\": %lld", kind.c_str(), static_cast<long long>(m.step));
  std::string line = head;
  line += ", \"loss\": " + json_number(m.loss) + ", \"accuracy\": " + json_number(m.accuracy) +
          ", \"grad_norm\": " + json_number(m.grad_norm) + ", \"lr\": " + json_number(m.lr) +
          ", \"tokens_per_s\": " + json_number(m.tokens_per_s) +
          ", \"tokens_seen\": " + std::to_string(m.tokens_seen) + ", \"elapsed_s\": " + json_number(m.elapsed_s, 7);
  // Values a CPU run does not have are left out rather than written as a sentinel.
  if (m.mfu >= 0) line += ", \"mfu\": " + json_number(m.mfu, 4);
  if (m.peak_memory_gib >= 0) line += ", \"peak_memory_gib\": " + json_number(m.peak_memory_gib, 4);
  out_ << line << "}\n";
  out_.flush();
  HGRN_CHECK(out_.good(), "writing the metrics file '", path_, "' failed (disk full?)");
}

void MetricsFile::append_eval(int64_t step, double loss, double accuracy) {
  out_ << "{\"kind\": \"eval\", \"step\": " << step << ", \"loss\": " << json_number(loss)
       << ", \"accuracy\": " << json_number(accuracy) << "}\n";
  out_.flush();
  HGRN_CHECK(out_.good(), "writing the metrics file '", path_, "' failed (disk full?)");
}

void MetricsFile::append_resume(int64_t step, const std::string& checkpoint) {
  out_ << "{\"kind\": \"resume\", \"step\": " << step << ", \"checkpoint\": " << nlohmann::json(checkpoint).dump()
       << "}\n";
  out_.flush();
  HGRN_CHECK(out_.good(), "writing the metrics file '", path_, "' failed (disk full?)");
}

void MetricsFile::append_nonfinite(int64_t step, double loss, double grad_norm, int64_t in_a_row) {
  out_ << "{\"kind\": \"nonfinite\", \"step\": " << step << ", \"loss\": " << json_number(loss)
       << ", \"grad_norm\": " << json_number(grad_norm) << ", \"in_a_row\": " << in_a_row << "}\n";
  out_.flush();
  HGRN_CHECK(out_.good(), "writing the metrics file '", path_, "' failed (disk full?)");
}

int64_t drop_metrics_after(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return 0;
  std::ifstream in(path, std::ios::binary);
  HGRN_CHECK(in, "cannot read the metrics file '", path, "'");
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(in, line)) {
    // A line without its newline is one a killed run was writing; a record without a step is kept as it is.
    const bool whole = !in.eof();
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool later = record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
                       record["step"].get<int64_t>() > step;
    if (!whole || record.is_discarded() || later) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
  }
  if (dropped > 0) write_file_atomically(path, kept);
  return dropped;
}

}  // namespace hgrn
