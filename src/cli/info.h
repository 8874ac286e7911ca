// info.h: `hgrn info`: the resolved config, parameter counts, FLOPs per token and the memory estimate of a run,
// without training anything.
#pragma once
#include <ostream>

#include "cli/common.h"
#include "config/config.h"

namespace hgrn::cli {

CLI::App* add_info_command(CLI::App& app, ConfigArgs& args);
// Loads the config (throws ConfigError) and prints the report; returns the exit status.
int run_info_command(const ConfigArgs& args, std::ostream& out);
// The report itself, for a config already loaded.
void print_info(const Config& config, std::ostream& out);

}  // namespace hgrn::cli
