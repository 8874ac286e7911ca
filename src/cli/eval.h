// eval.h: `hgrn eval`: the held-out loss, perplexity and accuracy of a checkpoint.
#pragma once
#include <ostream>

#include "cli/common.h"

namespace hgrn::cli {

struct EvalArgs {
  ConfigArgs config;
  std::string checkpoint;  // empty: the newest valid checkpoint of the config's run directory
  std::string data;        // a shard prefix; empty: data.valid_data
  bool stateful = false;
  int64_t seq_len = 0;     // 0: data.seq_len
  int64_t batch_size = 0;  // 0: training.micro_batch_size
  int64_t max_tokens = 0;  // 0: all
};

CLI::App* add_eval_command(CLI::App& app, EvalArgs& args);
int run_eval_command(const EvalArgs& args, std::ostream& out);

}  // namespace hgrn::cli
