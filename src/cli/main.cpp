// main.cpp: the hgrn command line: `hgrn train`, `hgrn info`, `hgrn --version`. Each subcommand lives in its own
// file under src/cli/; this file parses, dispatches and turns exceptions into messages and exit statuses.
#include <yaml-cpp/exceptions.h>

#include <iostream>

#include "cli/common.h"
#include "cli/info.h"
#include "cli/train.h"
#include "config/config.h"

int main(int argc, char** argv) {
  using namespace hgrn::cli;
  CLI::App app{"hgrn: pretrain HGRN2 language models (C++/CUDA).", "hgrn"};
  app.set_version_flag("--version", version_text(), "Print the version, git commit and whether CUDA is compiled in");
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  hgrn info --config configs/mqar-tiny.yaml     # sizes, FLOPs and memory of a config\n"
      "  hgrn train --config configs/mqar-tiny.yaml    # train it\n"
      "  hgrn train -c configs/mqar-tiny.yaml --set training.lr=1e-3\n"
      "Run 'hgrn <command> --help' for a command's options.");
  ConfigArgs train_args, info_args;
  CLI::App* train = add_train_command(app, train_args);
  CLI::App* info = add_info_command(app, info_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return report_parse_error(app, error, argc, argv);
  }

  // A config the loader rejects is the user's input to fix (status 2); anything else failed while running (1).
  try {
    if (*train) return run_train_command(train_args);
    if (*info) return run_info_command(info_args, std::cout);
  } catch (const hgrn::ConfigError& error) {
    print_error(error.what());
    return kExitUsageError;
  } catch (const YAML::Exception& error) {
    print_error(std::string("config: ") + error.what());
    return kExitUsageError;
  } catch (const std::exception& error) {
    print_error(error.what());
    return kExitRuntimeError;
  }
  return kExitUsageError;
}
