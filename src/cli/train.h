// train.h: `hgrn train`: loads a config and runs the training loop (train/trainer.h).
#pragma once
#include "cli/common.h"

namespace hgrn::cli {

CLI::App* add_train_command(CLI::App& app, ConfigArgs& args);
// Loads the config (throws ConfigError) and trains; returns run_training's exit status.
int run_train_command(const ConfigArgs& args);

}  // namespace hgrn::cli
