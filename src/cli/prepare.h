// prepare.h: `hgrn prepare`: tokenise a corpus (WikiText or the Pile) into Megatron-format token shards that
// `hgrn train` and `hgrn eval` read (data.task: tokens).
#pragma once
#include "cli/common.h"
#include "data/prepare.h"

namespace hgrn::cli {

CLI::App* add_prepare_command(CLI::App& app, PrepareOptions& options);
// Runs data/prepare.h's pipeline with progress and summary on stderr; returns the exit status.
int run_prepare_command(PrepareOptions options);

}  // namespace hgrn::cli
