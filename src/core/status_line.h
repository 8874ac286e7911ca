// status_line.h: a progress line for long commands: on a terminal one line redrawn a few times per second, elsewhere
// (logs) a whole line every few seconds, so that a log stays readable and a terminal shows live progress.
#pragma once
#include <chrono>
#include <ostream>
#include <string>

namespace hgrn {

class StatusLine {
 public:
  // out null: silent.
  StatusLine(std::ostream* out, bool terminal);

  // Whether a line is due now (always when forced); the caller then builds it and passes it to show().
  bool due(bool force = false);
  void show(const std::string& line);
  // Ends a redrawn line so that what follows starts on its own.
  void end_line();

  double elapsed_s() const;

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream* out_;
  bool terminal_;
  Clock::time_point start_, last_;
  size_t last_width_ = 0;
};

}  // namespace hgrn
