// trainer.h: `hgrn train`: the training loop for a resolved config.
#pragma once
#include <cstdint>
#include <ostream>
#include <vector>

#include "config/config.h"

namespace hgrn {

struct TrainingSummary {
  int64_t steps = 0;
  int64_t tokens_seen = 0;
  double first_loss = 0;      // training loss of the first step
  double final_loss = 0;      // mean training loss over the last logging interval
  double eval_loss = 0;       // held-out loss and accuracy after the last step
  double eval_accuracy = 0;
  double chance_accuracy = 0; // what guessing would score on the task
  double wall_s = 0;
  std::vector<double> step_losses;  // the training loss of every step this run took, in order
  bool stopped_by_signal = false;   // SIGTERM/SIGINT: stopped early after writing a checkpoint
};

// Trains the model the config describes, writing progress to `log` and metrics/config into logging.run_dir.
TrainingSummary train(const Config& config, std::ostream& log);

// `hgrn train`: train() with progress on stdout and the stop-signal handlers installed; returns the process exit
// status: 0 when max_steps were reached, kExitStoppedBySignal (75) after a graceful stop on SIGTERM/SIGINT.
int run_training(const Config& config);

}  // namespace hgrn
