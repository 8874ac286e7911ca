// stop_signal.cpp: async-signal-safe handlers: they only store to a lock-free atomic or call _exit.
#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace hgrn {

namespace {
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need a lock-free flag");

void on_stop_signal(int signal_number) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, signal_number)) _exit(128 + signal_number);
  static const char msg[] =
      "\nhgrn: stop requested: finishing this step and writing a checkpoint (signal again to exit at once)\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
}
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted file writes resume instead of failing with EINTR
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

bool stop_requested() { return g_stop_signal.load(std::memory_order_relaxed) != 0; }

int stop_signal_number() { return g_stop_signal.load(std::memory_order_relaxed); }

}  // namespace hgrn
