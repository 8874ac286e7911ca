// test_plot_runs.cpp: tools/plot_runs.py on a real run: a short training run's metrics.jsonl drawn to a PNG, and a
// malformed metrics file refused with a message naming the file and line. Skipped (not passed) without python3 and
// matplotlib.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "hgrn_binary.h"
#include "scratch_dir.h"

namespace hgrn {
namespace {

using testing::run_command;
using testing::run_hgrn;
using testing::shell_quote;

#define SKIP_WITHOUT_MATPLOTLIB()                                                                              \
  do {                                                                                                         \
    if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0)                                   \
      GTEST_SKIP() << "python3 with matplotlib is not available (skipped)";                                    \
  } while (0)

std::string plot_command(const std::string& args) {
  return "python3 " + shell_quote(std::string(HGRN_SOURCE_DIR) + "/tools/plot_runs.py") + " " + args;
}

TEST(PlotRuns, DrawsAShortRunToAPng) {
  SKIP_WITHOUT_MATPLOTLIB();
  testing::ScratchDir scratch;
  const std::string config = scratch / "run.yaml";
  std::ofstream(config) << R"(
model: {hidden_size: 32, num_hidden_layers: 1, expand_ratio: 8, vocab_size: 17, intermediate_size: 48}
data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}
training: {device: cpu, micro_batch_size: 4, max_steps: 6, warmup_steps: 2, eval_interval: 3, eval_batches: 1}
checkpoint: {interval: 0}
logging: {log_interval: 1}
)";
  const auto trained = run_hgrn({"train", "-c", config, "--set", "logging.run_dir=" + scratch / "run"});
  ASSERT_EQ(trained.status, 0) << trained.err;
  const std::string png = scratch / "run.png";
  const auto drawn = run_command(plot_command(shell_quote(scratch / "run") + " -o " + shell_quote(png)));
  ASSERT_EQ(drawn.status, 0) << drawn.err;
  ASSERT_TRUE(std::filesystem::exists(png));
  std::ifstream file(png, std::ios::binary);
  char magic[8] = {};
  file.read(magic, sizeof magic);
  EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << "not a PNG";
  EXPECT_GT(std::filesystem::file_size(png), 10000u) << "a plot of five panels is larger than an empty image";
}

TEST(PlotRuns, AMalformedMetricsFileIsRefusedNamingFileAndLine) {
  SKIP_WITHOUT_MATPLOTLIB();
  testing::ScratchDir scratch;
  std::filesystem::create_directories(scratch / "bad");
  std::ofstream(scratch / "bad/metrics.jsonl") << "{\"kind\": \"train\", \"step\": 1, \"loss\": 2.0}\n{not json\n";
  const auto drawn = run_command(plot_command(shell_quote(scratch / "bad") + " -o " + shell_quote(scratch / "x.png")));
  EXPECT_EQ(drawn.status, 1) << drawn.err;
  EXPECT_NE(drawn.err.find("metrics.jsonl:2:"), std::string::npos) << "the file and line: " << drawn.err;
  EXPECT_FALSE(std::filesystem::exists(scratch / "x.png"));
}

}  // namespace
}  // namespace hgrn
