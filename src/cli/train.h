// train.h: `hgrn train`: loads a config and runs the training loop (train/trainer.h).
#pragma once
#include "cli/common.h"

namespace hgrn::cli {

struct TrainArgs {
  ConfigArgs config;
  bool allow_config_change = false;  // resume although keys that change what is trained differ from the checkpoint
};

CLI::App* add_train_command(CLI::App& app, TrainArgs& args);
// Loads the config (throws ConfigError) and trains; returns run_training's exit status.
int run_train_command(const TrainArgs& args);

}  // namespace hgrn::cli
