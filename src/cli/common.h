// common.h: what the hgrn subcommands share: the --config/--set options, the exit statuses, the version text and
// the reporting of command-line and config errors.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "config/config.h"
#include "io/checkpoint.h"

namespace hgrn::cli {

// Exit statuses: scripts can tell a bad command line or config (fix the input) from a run that failed.
constexpr int kExitOk = 0;
constexpr int kExitRuntimeError = 1;
constexpr int kExitUsageError = 2;

struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> overrides;  // "section.key=value", applied in order after the file
};

// Adds -c/--config FILE (required) and -s/--set KEY=VALUE (repeatable) to a subcommand.
void add_config_options(CLI::App& command, ConfigArgs& args);

// "hgrn 0.1.0 (git abc123)" and a second line saying whether the CUDA backend is compiled in.
std::string version_text();

// Prints CLI11's message for a failed parse plus a hint (the closest command for a mistyped one) to stderr and
// returns the exit status; --help and --version go through here too and return 0.
int report_parse_error(CLI::App& app, const CLI::ParseError& error, int argc, char** argv);

// Input the user must fix that is not a config key (a flag's value, a prompt, a file that does not fit): main reports
// it with kExitUsageError.
struct UsageError : Error {
  using Error::Error;
};

// The run config stored in a checkpoint read from `path` (its data files need not exist here).
Config config_of_checkpoint(const TrainingState& state, const std::string& path);

// Prints "hgrn: error: <message>" to stderr.
void print_error(const std::string& message);

}  // namespace hgrn::cli
