// common.cpp: the shared pieces of the hgrn command line: config options, version text, error reporting.
#include "cli/common.h"

#include <iostream>

#include "config/suggest.h"
#include "io/checkpoint.h"

namespace hgrn::cli {

void add_config_options(CLI::App& command, ConfigArgs& args) {
  command.add_option("-c,--config", args.config_path, "YAML config file (see configs/)")->required()->type_name("FILE");
  command
      .add_option("-s,--set", args.overrides,
                  "Override one key after the file is read, as section.key=value or data.mqar.key=value; the value is "
                  "read as YAML (null clears an optional key). Repeatable.")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->take_all();
}

std::string version_text() {
#ifdef HGRN_WITH_CUDA
  const char* cuda = "CUDA backend: compiled in";
#else
  const char* cuda = "CUDA backend: not compiled in (CPU-only build)";
#endif
#ifdef HGRN_WITH_MPI
  const char* mpi = "MPI: compiled in (mpirun -np N hgrn train ...)";
#else
  const char* mpi = "MPI: not compiled in (single process only)";
#endif
#ifdef HGRN_WITH_NCCL
  const char* nccl = "NCCL: compiled in (multi-GPU data parallelism)";
#else
  const char* nccl = "NCCL: not compiled in (several ranks train on the CPU only)";
#endif
  return std::string("hgrn ") + HGRN_VERSION + " (git " + HGRN_GIT_COMMIT + ")\n" + cuda + "\n" + mpi + "\n" + nccl;
}

void print_error(const std::string& message) { std::cerr << "hgrn: error: " << message << "\n"; }

int report_parse_error(CLI::App& app, const CLI::ParseError& error, int argc, char** argv) {
  // --help and --version arrive as "errors" with exit code 0; CLI11 prints them itself.
  if (error.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(error);

  print_error(error.what());
  // CLI11 checks required options before unexpected ones, so "--cofnig x" reports only the missing --config: name
  // the words it could not place too, since they are usually the real mistake.
  std::vector<std::string> unplaced = app.remaining();
  for (const CLI::App* sub : app.get_subcommands({}))
    for (const std::string& word : sub->remaining()) unplaced.push_back(word);
  if (!unplaced.empty() && dynamic_cast<const CLI::ExtrasError*>(&error) == nullptr) {
    std::string words;
    for (const std::string& word : unplaced) words += " " + word;
    std::cerr << "hgrn: error: unexpected arguments:" << words << "\n";
  }
  std::vector<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands({})) commands.push_back(sub->get_name());

  // The first word that is not an option is the command the user meant; name the closest one if it is mistyped.
  std::string command;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (!word.empty() && word[0] != '-') {
      command = word;
      break;
    }
  }
  std::string hint;
  if (!command.empty() && std::find(commands.begin(), commands.end(), command) == commands.end()) {
    const std::string near = closest_name(command, commands);
    hint = "'" + command + "' is not an hgrn command" + (near.empty() ? "" : "; did you mean '" + near + "'?");
    hint += " The commands are: ";
    for (size_t i = 0; i < commands.size(); ++i) hint += (i ? ", " : "") + commands[i];
    hint += ". See 'hgrn --help'.";
  } else if (!command.empty()) {
    hint = "see 'hgrn " + command + " --help' for its options and examples.";
  } else {
    hint = "see 'hgrn --help' for the commands, e.g. 'hgrn info --config configs/mqar-tiny.yaml'.";
  }
  std::cerr << "hgrn: hint: " << hint << "\n";
  return kExitUsageError;
}

// A run on a token corpus names data files that need not exist where its checkpoint is read, and validation checks
// them, so when the config is refused as it stands it is read once more as an MQAR config (which needs no files).
// The original error is the one reported if that fails too.
Config config_of_checkpoint(const TrainingState& state, const std::string& path) {
  try {
    return parse_stored_config(state.config_yaml, path);
  } catch (const ConfigError& original) {
    try {
      return parse_stored_config(state.config_yaml, path, {"data.task=mqar"});
    } catch (const ConfigError&) {
      throw original;
    }
  }
}

}  // namespace hgrn::cli
