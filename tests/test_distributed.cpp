// test_distributed.cpp: multi-process data parallelism through MPI on the CPU (mpirun -np 2): the same loss curve
// and weights as one process with the same global batch, bitwise resume of a 2-rank run, and refusal when the
// ranks run different configs. Skipped (not passed) where mpirun is missing or hgrn was built without MPI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hgrn_binary.h"
#include "io/checkpoint.h"
#include "scratch_dir.h"

namespace hgrn {
namespace {

using testing::run_command;
using testing::run_hgrn;
using testing::shell_quote;

#define SKIP_WITHOUT_MPI()                                                                                     \
  do {                                                                                                         \
    if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun on PATH (skipped)";   \
    if (run_hgrn({"--version"}).out.find("MPI: compiled in") == std::string::npos)                              \
      GTEST_SKIP() << "this hgrn was built without MPI (skipped)";                                             \
  } while (0)

// mpirun as root (CI containers) needs --allow-run-as-root; --oversubscribe lets 2 ranks share fewer cores.
// `wrapper` goes between the environment and mpirun (e.g. "timeout 120").
std::string mpirun(int ranks, const std::string& wrapper = "") {
  return "OMP_NUM_THREADS=1 " + wrapper + " mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
         " " + shell_quote(testing::hgrn_binary());
}

std::string write_config(const testing::ScratchDir& dir) {
  const std::string path = dir / "dp.yaml";
  std::ofstream(path) << R"(
model: {hidden_size: 32, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 17, intermediate_size: 48}
data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}
training: {device: cpu, micro_batch_size: 8, max_steps: 6, lr: 0.003, warmup_steps: 2, eval_interval: 0,
           eval_batches: 1, seed: 3}
checkpoint: {interval: 3, keep_last: 5}
logging: {log_interval: 1}
)";
  return path;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record["kind"] == "train") out.push_back(record["loss"].get<double>());
  }
  return out;
}

TEST(Distributed, TwoRanksTrainLikeOneProcessWithTheSameGlobalBatch) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  auto one = run_hgrn({"train", "-c", config, "--set", "logging.run_dir=" + dir / "one"});
  ASSERT_EQ(one.status, 0) << one.err;
  // 2 ranks x 4 sequences: rank r draws MQAR sequences 2c + r, the same 8 per step as the single process.
  auto two = run_command(mpirun(2) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=4" +
                         " --set logging.run_dir=" + shell_quote(dir / "two"));
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_NE(two.out.find("2 data-parallel ranks"), std::string::npos) << two.out;
  // training.global_batch_size fixes the global batch instead: 2 ranks x 2 sequences x 2 accumulation steps.
  auto fixed = run_command(mpirun(2) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=2" +
                           " --set training.global_batch_size=8 --set logging.run_dir=" + shell_quote(dir / "fixed"));
  ASSERT_EQ(fixed.status, 0) << fixed.err;
  EXPECT_NE(fixed.out.find("global batch 2 x 2 x 2 sequences"), std::string::npos) << fixed.out;
  const std::vector<double> a = losses(dir / "one"), b = losses(dir / "two"), c = losses(dir / "fixed");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u) << "rank 0 alone writes the metrics, once per step";
  ASSERT_EQ(c.size(), 6u);
  // The gradients are summed in another order (two halves, then MPI's sum): fp32 rounding only, 1e-5 relative.
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_NEAR(b[s], a[s], 1e-5 * a[s]) << "step " << s + 1;
    EXPECT_NEAR(c[s], a[s], 1e-5 * a[s]) << "step " << s + 1 << " with global_batch_size";
  }
  const TrainingState ta = load_checkpoint(dir / "one/checkpoints/step_00000006.h5");
  const TrainingState tb = load_checkpoint(dir / "two/checkpoints/step_00000006.h5");
  EXPECT_EQ(ta.world_size, 1);
  EXPECT_EQ(tb.world_size, 2);
  for (size_t p = 0; p < ta.params.size(); ++p) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < ta.params[p].second.numel(); ++i) {
      const double x = ta.params[p].second.item(i), y = tb.params[p].second.item(i);
      num += (x - y) * (x - y);
      den += x * x;
    }
    EXPECT_LE(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << ta.params[p].first;
  }
}

TEST(Distributed, TwoRankRunResumesBitwiseAndRefusesAnotherWorldSize) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  const std::string two_ranks = mpirun(2) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=4";
  auto straight = run_command(two_ranks + " --set logging.run_dir=" + shell_quote(dir / "straight"));
  ASSERT_EQ(straight.status, 0) << straight.err;
  // A fresh run directory holding only the step-3 checkpoint, resumed by 2 ranks to step 6.
  std::filesystem::create_directories(dir / "resumed/checkpoints");
  std::filesystem::copy_file(dir / "straight/checkpoints/step_00000003.h5", dir / "resumed/checkpoints/step_00000003.h5");
  auto resumed = run_command(two_ranks + " --set logging.run_dir=" + shell_quote(dir / "resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  const std::vector<double> a = losses(dir / "straight"), b = losses(dir / "resumed");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(b[s], a[3 + s]) << "step " << 4 + s;
  const TrainingState ta = load_checkpoint(dir / "straight/checkpoints/step_00000006.h5");
  const TrainingState tb = load_checkpoint(dir / "resumed/checkpoints/step_00000006.h5");
  for (size_t p = 0; p < ta.params.size(); ++p)
    EXPECT_EQ(std::memcmp(ta.params[p].second.raw_data(), tb.params[p].second.raw_data(),
                          ta.params[p].second.nbytes()),
              0)
        << ta.params[p].first;
  // One process cannot continue a 2-rank checkpoint: the world size is part of what must match.
  auto single = run_hgrn({"train", "-c", config, "--set", "logging.run_dir=" + dir / "straight"});
  EXPECT_NE(single.status, 0);
  EXPECT_NE(single.err.find("world"), std::string::npos) << single.err;
}

TEST(Distributed, AKilledRankMakesTheRunExitNonZeroWithinTenSeconds) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir), run = dir / "killed";
  // A long 2-rank run; once it is training, SIGKILL rank 1 (found by the launcher's rank variable in its
  // environment) and time how long the job takes to end: the surviving rank must not hang in its all-reduce.
  const std::string script =
      mpirun(2, "timeout 120") + " train -c " + shell_quote(config) +
      " --set training.micro_batch_size=4 --set training.max_steps=1000000" +
      " --set logging.run_dir=" + shell_quote(run) + " > " + shell_quote(dir / "log.txt") + " 2>&1 & job=$!\n" +
      "for i in $(seq 300); do [ -s " + shell_quote(run + "/metrics.jsonl") + " ] && break; sleep 0.1; done\n" +
      "killed=0\n" +
      "for p in $(pgrep -f " + shell_quote("logging.run_dir=" + run) + "); do\n" +
      "  tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && kill -9 $p && killed=1\n" +
      "done\n" +
      "[ $killed = 1 ] || { kill $job; echo 'no rank 1 process found to kill'; exit 0; }\n" +
      "start=$(date +%s%N); wait $job; rc=$?; end=$(date +%s%N)\n" +
      "echo \"rc=$rc ms=$(( (end - start) / 1000000 ))\"\n";
  std::ofstream(dir / "kill.sh") << script;
  auto r = run_command("bash " + shell_quote(dir / "kill.sh"));
  std::ifstream log_file(dir / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  int rc = -1;
  long ms = -1;
  ASSERT_EQ(std::sscanf(r.out.c_str(), "rc=%d ms=%ld", &rc, &ms), 2) << r.out << r.err;
  EXPECT_NE(rc, 0) << log;
  EXPECT_LT(ms, 10000) << "the job took " << ms << " ms to end after a rank was killed";
  EXPECT_NE(log.find("signal 9"), std::string::npos) << "the launcher names the killed rank and signal:\n" << log;
}

TEST(Distributed, RanksWithDifferentConfigsAreRefused) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  const std::string rank = " -np 1 " + shell_quote(testing::hgrn_binary()) + " train -c " + shell_quote(config) +
                           " --set logging.run_dir=" + shell_quote(dir / "run");
  auto r = run_command("OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe" + rank + " :" + rank +
                       " --set training.lr=0.001");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("rank 1 runs with another config than rank 0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace hgrn
