// bench.h: `hgrn bench`: time training steps of a config or generation with its model, or the HGRU2 recurrence or the
// gated scan alone (train/bench.h).
#pragma once
#include "cli/common.h"

namespace hgrn::cli {

struct BenchArgs {
  ConfigArgs config;
  std::vector<int64_t> recurrence;  // B, T, H, K, V
  std::vector<int64_t> scan;        // B, T, C
  bool fused_scan = false;          // --scan times lower_bounded_gated_scan (HGRN1's gates and scan from î, f̂)
  bool stateful = false;            // --config: time stateful steps (data.stateful), whatever the config's data.task
  std::string dtype = "bf16";
  std::string device = "auto";
  int64_t warmup = 5, steps = 20, iters = 50;
  int64_t document_tokens = 0;      // > 0: packed documents of this mean length, the state restarted at each start
  std::string json_path;
  // --generate: generation with the config's model (train/bench.h, bench_generation).
  bool generate = false;
  int64_t batch = 1, prompt_length = 512, new_tokens = 256, runs = 3;
  std::string decode = "fused";
};

CLI::App* add_bench_command(CLI::App& app, BenchArgs& args);
int run_bench_command(const BenchArgs& args, std::ostream& out);

}  // namespace hgrn::cli
