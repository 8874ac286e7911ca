// status_line.cpp: see status_line.h.
#include "core/status_line.h"

namespace hgrn {

StatusLine::StatusLine(std::ostream* out, bool terminal)
    : out_(out), terminal_(terminal), start_(Clock::now()), last_(start_) {}

bool StatusLine::due(bool force) {
  if (out_ == nullptr) return false;
  const Clock::time_point now = Clock::now();
  const double interval = terminal_ ? 0.25 : 5.0;
  if (!force && std::chrono::duration<double>(now - last_).count() < interval) return false;
  last_ = now;
  return true;
}

void StatusLine::show(const std::string& text) {
  if (out_ == nullptr) return;
  if (!terminal_) {
    *out_ << text << '\n' << std::flush;
    return;
  }
  std::string line = text;
  if (line.size() < last_width_) line.append(last_width_ - line.size(), ' ');  // erase the longer old line
  last_width_ = text.size();
  *out_ << '\r' << line << std::flush;
}

void StatusLine::end_line() {
  if (out_ != nullptr && terminal_ && last_width_ > 0) *out_ << '\n' << std::flush;
  last_width_ = 0;
}

double StatusLine::elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

}  // namespace hgrn
