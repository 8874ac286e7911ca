// train.cpp: `hgrn train --config FILE [--set ...]`: the config is loaded and validated here, so a mistake in it
// stops the run before any work starts; the training itself is run_training's.
#include "cli/train.h"

#include "config/config.h"
#include "train/trainer.h"

namespace hgrn::cli {

CLI::App* add_train_command(CLI::App& app, ConfigArgs& args) {
  CLI::App* train = app.add_subcommand("train", "Train the model a config describes (metrics and checkpoints go to "
                                                "logging.run_dir)");
  add_config_options(*train, args);
  train->footer(
      "Examples:\n"
      "  hgrn train --config configs/mqar-tiny.yaml\n"
      "  hgrn train --config configs/mqar-tiny.yaml --set training.max_steps=100 --set logging.run_dir=runs/quick\n"
      "  hgrn train -c configs/hgrn2-150m.yaml -s training.device=cuda -s checkpoint.resume=never");
  return train;
}

int run_train_command(const ConfigArgs& args) {
  const Config config = load_config(args.config_path, args.overrides);
  return run_training(config);
}

}  // namespace hgrn::cli
