// train.cpp: `hgrn train --config FILE [--set ...]`: the config is loaded and validated here, so a mistake in it
// stops the run before any work starts; the training itself is run_training's.
#include "cli/train.h"

#include "config/config.h"
#include "train/trainer.h"

namespace hgrn::cli {

CLI::App* add_train_command(CLI::App& app, TrainArgs& args) {
  CLI::App* train = app.add_subcommand("train", "Train the model a config describes (metrics and checkpoints go to "
                                                "logging.run_dir)");
  add_config_options(*train, args.config);
  train->add_flag("--allow-config-change", args.allow_config_change,
                  "Resume even though the config changes keys that alter what is trained (seed, batch, learning "
                  "rate, data, model details); every change is printed and kept as config.resume-STEP.yaml. Without "
                  "it only lengths, intervals, logging, checkpointing and memory knobs may change on resume");
  train->footer(
      "Examples:\n"
      "  hgrn train --config configs/mqar-tiny.yaml\n"
      "  hgrn train --config configs/mqar-tiny.yaml --set training.max_steps=100 --set logging.run_dir=runs/quick\n"
      "  hgrn train -c configs/hgrn2-150m.yaml -s training.device=cuda -s checkpoint.resume=never\n"
      "  hgrn train -c configs/mqar-tiny.yaml -s training.lr=1e-3 --allow-config-change   # resume with a new lr");
  return train;
}

int run_train_command(const TrainArgs& args) {
  const Config config = load_config(args.config.config_path, args.config.overrides);
  return run_training(config, TrainOptions{args.allow_config_change});
}

}  // namespace hgrn::cli
