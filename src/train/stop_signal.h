// stop_signal.h: graceful stop on SIGTERM / SIGINT. The first signal asks the trainer to finish the current step,
// write a checkpoint and exit with kExitStoppedBySignal; a second signal exits at once (status 128 + signal) —
// the atomic checkpoint writer guarantees that even then no complete checkpoint is damaged.
#pragma once

namespace hgrn {

// EX_TEMPFAIL from sysexits.h: "try again later", which is what a stopped run wants from a job scheduler.
constexpr int kExitStoppedBySignal = 75;

// Installs the handlers (idempotent). Call once before the training loop.
void install_stop_signal_handlers();
// True once SIGTERM or SIGINT has arrived.
bool stop_requested();
// The signal that asked for the stop (0 if none), for the log line.
int stop_signal_number();

}  // namespace hgrn
