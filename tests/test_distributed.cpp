// test_distributed.cpp: multi-process data parallelism (mpirun): on the CPU through MPI (2 ranks) and, where the
// machine has several GPUs, through NCCL (2 and 4 ranks): the same loss curve and weights as one process with the
// same global batch, with and without ZeRO-1; bitwise resume of a multi-rank run; stateful ranks reading disjoint
// streams (data.stateful); a killed rank ending the run; refusal when the ranks run different configs. Skipped (not
// passed) where mpirun is missing, hgrn was built without MPI (or NCCL, for the GPU tests), or there are fewer GPUs
// than ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "hgrn_binary.h"
#include "core/allocator.h"
#include "io/checkpoint.h"
#include "scratch_dir.h"
#include "token_shard_fixtures.h"

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

#define SKIP_WITHOUT_GPUS(ranks)                                                                              \
  do {                                                                                                        \
    SKIP_WITHOUT_MPI();                                                                                       \
    if (run_hgrn({"--version"}).out.find("NCCL: compiled in") == std::string::npos)                            \
      GTEST_SKIP() << "this hgrn was built without NCCL (skipped)";                                           \
    if (cuda_device_count() < (ranks))                                                                        \
      GTEST_SKIP() << cuda_device_count() << " GPU(s) visible, " << (ranks) << " needed (skipped)";           \
  } while (0)

// mpirun as root (CI containers) needs --allow-run-as-root; --oversubscribe lets 2 ranks share fewer cores.
// `wrapper` goes between the environment and mpirun (e.g. "timeout 120").
std::string mpirun(int ranks, const std::string& wrapper = "") {
  // NVLink multicast (NVLS) stays off: the lent multi-GPU machines do not support it reliably.
  return "OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0 " + wrapper + " mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) +
         " " + shell_quote(testing::hgrn_binary());
}

// type: the family member (model.type); each with a head layout of its own at hidden size 32.
std::string write_config(const testing::ScratchDir& dir, const std::string& device = "cpu",
                         const std::string& type = "hgrn2") {
  const std::string path = dir / ("dp-" + device + "-" + type + ".yaml");
  const std::string layout = type == "hgrn2"  ? "expand_ratio: 8"
                             : type == "hgrn" ? "expand_ratio: 1"
                                              : "num_heads: 2";
  std::ofstream(path) << R"(
model: {type: )" << type << ", " << layout << R"(, hidden_size: 32, num_hidden_layers: 2, vocab_size: 17,
        intermediate_size: 48}
data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}
training: {device: )" << device << R"(, micro_batch_size: 8, max_steps: 6, lr: 0.003, warmup_steps: 2,
           eval_interval: 0, eval_batches: 1, seed: 3}
checkpoint: {interval: 3, keep_last: 5}
logging: {log_interval: 1}
)";
  return path;
}

// ||a - b|| / ||a|| over a tensor's elements.
double relative_difference(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.item(i), y = b.item(i);
    num += (x - y) * (x - y);
    den += x * x;
  }
  return std::sqrt(num / std::max(den, 1e-30));
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

// Trains `config` (8 sequences per step) in one process and with `ranks` ranks of 8/ranks sequences each, with
// and without ZeRO-1, and compares every step's loss (relative loss_tolerance), the final weights and the final
// optimiser moments (relative weight_tolerance over each tensor): the gradients are summed in another order (the
// ranks' partial sums, then the collective's), so they differ by rounding only.
// `extra`: settings for the multi-rank runs alone (" --set key=value ...").
void expect_ranks_train_like_one_process(const testing::ScratchDir& dir, const std::string& config, int ranks,
                                         double loss_tolerance, double weight_tolerance,
                                         double moment_tolerance = -1, const std::string& extra = "") {
  if (moment_tolerance < 0) moment_tolerance = weight_tolerance;
  auto one = run_hgrn({"train", "-c", config, "--set", "logging.run_dir=" + dir / "one"});
  ASSERT_EQ(one.status, 0) << one.err;
  const std::vector<double> a = losses(dir / "one");
  ASSERT_EQ(a.size(), 6u);
  const TrainingState ta = load_checkpoint(dir / "one/checkpoints/step_00000006.h5");
  EXPECT_EQ(ta.world_size, 1);
  for (const bool zero1 : {false, true}) {
    SCOPED_TRACE(zero1 ? "ZeRO-1" : "plain data parallelism");
    const std::string run = dir / (zero1 ? "zero1" : "ranks");
    auto many = run_command(mpirun(ranks) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=" +
                            std::to_string(8 / ranks) + " --set training.zero1=" + (zero1 ? "true" : "false") +
                            extra + " --set logging.run_dir=" + shell_quote(run));
    ASSERT_EQ(many.status, 0) << many.err;
    EXPECT_NE(many.out.find(std::to_string(ranks) + " data-parallel ranks"), std::string::npos) << many.out;
    if (zero1) {  // the moments really are sharded: rank 0 keeps about 1/ranks of them
      const size_t at = many.out.find("ZeRO-1: rank 0 keeps the AdamW moments of ");
      ASSERT_NE(at, std::string::npos) << many.out;
      long kept = 0, total = 0;
      ASSERT_EQ(std::sscanf(many.out.c_str() + at, "ZeRO-1: rank 0 keeps the AdamW moments of %ld of the %ld", &kept,
                            &total), 2);
      EXPECT_LE(kept, total / ranks + 64 * static_cast<long>(ta.params.size()))
          << "one share, give or take the 64-element alignment of each tensor";
      EXPECT_GE(kept, total / ranks / 2);
    }
    const std::vector<double> b = losses(run);
    ASSERT_EQ(b.size(), 6u) << "rank 0 alone writes the metrics, once per step";
    for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(b[s], a[s], loss_tolerance * a[s]) << "step " << s + 1;
    const TrainingState tb = load_checkpoint(run + "/checkpoints/step_00000006.h5");
    EXPECT_EQ(tb.world_size, ranks);
    for (size_t p = 0; p < ta.params.size(); ++p) {
      EXPECT_LE(relative_difference(ta.params[p].second, tb.params[p].second), weight_tolerance) << ta.params[p].first;
      // Under ZeRO-1 the moments were gathered from the ranks' shares: every element must be back in place.
      EXPECT_LE(relative_difference(ta.adam_m[p], tb.adam_m[p]), moment_tolerance) << ta.params[p].first;
      EXPECT_LE(relative_difference(ta.adam_v[p], tb.adam_v[p]), moment_tolerance) << ta.params[p].first;
    }
    // FP8: the ranks' amaxes are reduced to their maximum, so rank 0's scales are the one process's up to the
    // rounding of the values they were taken from (gradients summed in another order move by a few per cent).
    ASSERT_EQ(tb.fp8_scaling.size(), ta.fp8_scaling.size());
    for (size_t i = 0; i < ta.fp8_scaling.size(); ++i)
      if (ta.fp8_scaling[i].first.find("scales") != std::string::npos)
        EXPECT_LE(relative_difference(ta.fp8_scaling[i].second, tb.fp8_scaling[i].second), 5e-2)
            << ta.fp8_scaling[i].first;
  }
}

// A `ranks`-rank run (ZeRO-1 or not) stopped at step 3 and resumed continues bit for bit: the same losses and final
// weights as the straight run; one process refuses the multi-rank checkpoint.
void expect_multi_rank_resume_is_bitwise(const testing::ScratchDir& dir, const std::string& config, int ranks,
                                         bool zero1, const std::string& extra = "") {
  const std::string launch = mpirun(ranks) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=" +
                             std::to_string(8 / ranks) + " --set training.zero1=" + (zero1 ? "true" : "false") + extra;
  auto straight = run_command(launch + " --set logging.run_dir=" + shell_quote(dir / "straight"));
  ASSERT_EQ(straight.status, 0) << straight.err;
  // A fresh run directory holding only the step-3 checkpoint, resumed to step 6.
  std::filesystem::create_directories(dir / "resumed/checkpoints");
  std::filesystem::copy_file(dir / "straight/checkpoints/step_00000003.h5", dir / "resumed/checkpoints/step_00000003.h5");
  auto resumed = run_command(launch + " --set logging.run_dir=" + shell_quote(dir / "resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  const std::vector<double> a = losses(dir / "straight"), b = losses(dir / "resumed");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(b[s], a[3 + s]) << "step " << 4 + s;
  const TrainingState ta = load_checkpoint(dir / "straight/checkpoints/step_00000006.h5");
  const TrainingState tb = load_checkpoint(dir / "resumed/checkpoints/step_00000006.h5");
  for (size_t p = 0; p < ta.params.size(); ++p) {
    EXPECT_EQ(std::memcmp(ta.params[p].second.raw_data(), tb.params[p].second.raw_data(),
                          ta.params[p].second.nbytes()),
              0)
        << ta.params[p].first;
    EXPECT_EQ(std::memcmp(ta.adam_v[p].raw_data(), tb.adam_v[p].raw_data(), ta.adam_v[p].nbytes()), 0)
        << ta.params[p].first;
  }
  // One process cannot continue a multi-rank checkpoint: the world size is part of what must match, even where the
  // config changes that a resume refuses by default are allowed.
  auto single = run_hgrn({"train", "-c", config, "--allow-config-change", "--set", "logging.run_dir=" + dir / "straight"});
  EXPECT_NE(single.status, 0);
  EXPECT_NE(single.err.find("world"), std::string::npos) << single.err;
}

TEST(Distributed, TwoRanksTrainLikeOneProcessWithTheSameGlobalBatch) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  // fp32 on the CPU: 1e-5 relative on the losses, 1e-4 on weights and moments.
  expect_ranks_train_like_one_process(dir, write_config(dir), 2, 1e-5, 1e-4);
}

// Gradients summed in bf16 (training.grad_reduce_dtype): each rank's gradients and each partial sum are rounded to
// bf16 (8 significant bits). After six AdamW steps on 2 CPU ranks the losses moved by up to 2e-5 relative, the
// weights by up to 5e-3 and the moments by 7e-3 (a rank's gradients left out move them by O(1)); held to 2e-4, 2e-2
// and 5e-2. The weights must differ from those of the same ranks summing in fp32, or the option did nothing.
void expect_bf16_sums_train_like_one_process(const testing::ScratchDir& dir, const std::string& config, int ranks) {
  const std::string fp32_run = dir / "fp32-sums";
  auto fp32 = run_command(mpirun(ranks) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=" +
                          std::to_string(8 / ranks) + " --set logging.run_dir=" + shell_quote(fp32_run));
  ASSERT_EQ(fp32.status, 0) << fp32.err;
  expect_ranks_train_like_one_process(dir, config, ranks, 2e-4, 2e-2, 5e-2, " --set training.grad_reduce_dtype=bf16");
  const TrainingState summed_fp32 = load_checkpoint(fp32_run + "/checkpoints/step_00000006.h5");
  const TrainingState summed_bf16 = load_checkpoint(dir / "ranks/checkpoints/step_00000006.h5");
  bool any_differs = false;
  for (size_t p = 0; p < summed_fp32.params.size(); ++p)
    any_differs |= std::memcmp(summed_fp32.params[p].second.raw_data(), summed_bf16.params[p].second.raw_data(),
                               summed_fp32.params[p].second.nbytes()) != 0;
  EXPECT_TRUE(any_differs) << "the bf16 sums gave the fp32 sums' weights bit for bit";
}

TEST(Distributed, GradientsSummedInBf16TrainLikeOneProcessWithinTheirRounding) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_bf16_sums_train_like_one_process(dir, write_config(dir), 2);
}

TEST(Distributed, GradientsSummedInBf16ResumeBitwise) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, write_config(dir), 2, true, " --set training.grad_reduce_dtype=bf16");
}

// Every family member: its gradient groups and parameters go through the same data-parallel path.
class DistributedEveryMember : public ::testing::TestWithParam<std::string> {};

TEST_P(DistributedEveryMember, TwoRanksTrainLikeOneProcess) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_ranks_train_like_one_process(dir, write_config(dir, "cpu", GetParam()), 2, 1e-5, 1e-4);
}

TEST_P(DistributedEveryMember, TwoGpusTrainLikeOneProcess) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_ranks_train_like_one_process(dir, write_config(dir, "cuda", GetParam()), 2, 1e-4, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Members, DistributedEveryMember, ::testing::Values("hgrn", "gla", "retnet"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// training.overlap_reductions: false queues the same reductions after the backward instead of during it, so the run
// gives the same bits (plain and ZeRO-1), and says so in its log.
void expect_reductions_after_the_backward_give_the_same_bits(const testing::ScratchDir& dir, const std::string& config,
                                                           int ranks) {
  for (const char* zero1 : {"false", "true"}) {
    SCOPED_TRACE(std::string("zero1=") + zero1);
    std::vector<TrainingState> states;
    for (const char* overlap : {"true", "false"}) {
      const std::string run = dir / (std::string("overlap-") + overlap + "-" + zero1);
      auto r = run_command(mpirun(ranks) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=" +
                           std::to_string(8 / ranks) + " --set training.zero1=" + zero1 +
                           " --set training.overlap_reductions=" + overlap +
                           " --set logging.run_dir=" + shell_quote(run));
      ASSERT_EQ(r.status, 0) << r.err;
      const bool said = r.out.find("reduced after the backward") != std::string::npos;
      EXPECT_EQ(said, std::string(overlap) == "false") << r.out;
      states.push_back(load_checkpoint(run + "/checkpoints/step_00000006.h5"));
    }
    ASSERT_EQ(states[0].params.size(), states[1].params.size());
    for (size_t p = 0; p < states[0].params.size(); ++p) {
      EXPECT_EQ(std::memcmp(states[0].params[p].second.raw_data(), states[1].params[p].second.raw_data(),
                            states[0].params[p].second.nbytes()), 0)
          << states[0].params[p].first;
      EXPECT_EQ(std::memcmp(states[0].adam_v[p].raw_data(), states[1].adam_v[p].raw_data(),
                            states[0].adam_v[p].nbytes()), 0)
          << states[0].params[p].first;
    }
  }
}

TEST(Distributed, ReductionsAfterTheBackwardGiveTheSameBits) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_reductions_after_the_backward_give_the_same_bits(dir, write_config(dir), 2);
}

// `hgrn bench` under mpirun reports the step's gradient reductions: one a gradient group (the LM head, each layer,
// the embedding: 4 at 2 layers), with the time they took.
TEST(Distributed, BenchReportsTheGradientReductions) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  for (const char* zero1 : {"false", "true"}) {
    SCOPED_TRACE(std::string("zero1=") + zero1);
    const std::string json = dir / (std::string("bench-") + zero1 + ".json");
    auto r = run_command(mpirun(2) + " bench --config " + shell_quote(config) +
                         " --warmup 1 --steps 2 --set training.zero1=" + zero1 + " --json " + shell_quote(json));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("gradient reductions: 4 a step"), std::string::npos) << r.out;
    const auto report = nlohmann::json::parse(std::ifstream(json));
    EXPECT_EQ(report["ranks"].get<int>(), 2);
    EXPECT_EQ(report["reduce_buckets"].get<int>(), 4);
    EXPECT_GT(report["reduce_busy_ms"].get<double>(), 0.0);
    EXPECT_GE(report["reduce_tail_ms"].get<double>(), 0.0);
  }
}

TEST(Distributed, GlobalBatchSizeFixesTheBatchOverAllRanks) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  auto one = run_hgrn({"train", "-c", config, "--set", "logging.run_dir=" + dir / "one"});
  ASSERT_EQ(one.status, 0) << one.err;
  // training.global_batch_size fixes the global batch: 2 ranks x 2 sequences x 2 accumulation steps.
  auto fixed = run_command(mpirun(2) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=2" +
                           " --set training.global_batch_size=8 --set logging.run_dir=" + shell_quote(dir / "fixed"));
  ASSERT_EQ(fixed.status, 0) << fixed.err;
  EXPECT_NE(fixed.out.find("global batch 2 x 2 x 2 sequences"), std::string::npos) << fixed.out;
  const std::vector<double> a = losses(dir / "one"), c = losses(dir / "fixed");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(c.size(), 6u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(c[s], a[s], 1e-5 * a[s]) << "step " << s + 1;
}

// A diverging run on two ranks: both see the same all-reduced gradient norm, so both skip the same non-finite steps
// and stop together after training.max_nonfinite_steps of them, with the divergence message, within a bounded time.
TEST(Distributed, TwoRanksSkipNonFiniteStepsTogetherAndStop) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  auto diverged = run_command(mpirun(2, "timeout 120") + " train -c " + shell_quote(config) +
                              " --set training.lr=1e300 --set training.warmup_steps=0" +
                              " --set training.max_nonfinite_steps=2 --set logging.run_dir=" + shell_quote(dir / "nan"));
  EXPECT_NE(diverged.status, 0);
  EXPECT_NE(diverged.status, 124) << "the ranks did not stop together: " << diverged.err;
  EXPECT_NE((diverged.out + diverged.err).find("training diverged: 2 steps in a row"), std::string::npos)
      << diverged.out << diverged.err;
  int nonfinite = 0;
  std::ifstream metrics(dir / "nan/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (line.find("\"kind\": \"nonfinite\"") != std::string::npos) ++nonfinite;
  EXPECT_EQ(nonfinite, 2);
}

// ZeRO-1 with gradient accumulation (only the last micro-batch reduces) and tied embeddings (the lm_head group is
// then empty, the embedding complete only at the very end of the backward): still one process's losses.
TEST(Distributed, ZeroOneWithAccumulationAndTiedEmbeddingsTrainsLikeOneProcess) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  const std::string config = write_config(dir);
  const std::string tied = " --set model.tie_word_embeddings=true";
  auto one = run_hgrn({"train", "-c", config, "--set", "model.tie_word_embeddings=true", "--set",
                       "logging.run_dir=" + dir / "one"});
  ASSERT_EQ(one.status, 0) << one.err;
  auto zero = run_command(mpirun(2) + " train -c " + shell_quote(config) + tied +
                          " --set training.micro_batch_size=2 --set training.global_batch_size=8" +
                          " --set training.zero1=true --set logging.run_dir=" + shell_quote(dir / "zero"));
  ASSERT_EQ(zero.status, 0) << zero.err;
  EXPECT_NE(zero.out.find("2 data-parallel ranks (MPI, ZeRO-1); global batch 2 x 2 x 2 sequences"),
            std::string::npos)
      << zero.out;
  const std::vector<double> a = losses(dir / "one"), b = losses(dir / "zero");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(b[s], a[s], 1e-5 * a[s]) << "step " << s + 1;
  const TrainingState ta = load_checkpoint(dir / "one/checkpoints/step_00000006.h5");
  const TrainingState tb = load_checkpoint(dir / "zero/checkpoints/step_00000006.h5");
  for (size_t p = 0; p < ta.params.size(); ++p) {
    EXPECT_LE(relative_difference(ta.params[p].second, tb.params[p].second), 1e-4) << ta.params[p].first;
    EXPECT_LE(relative_difference(ta.adam_v[p], tb.adam_v[p]), 1e-4) << ta.params[p].first;
  }
}

TEST(Distributed, TwoRankRunResumesBitwiseAndRefusesAnotherWorldSize) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, write_config(dir), 2, false);
}

TEST(Distributed, TwoRankZeroOneRunResumesBitwise) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, write_config(dir), 2, true);
}

// A long 2-rank run; once it is training, send `signal` to rank 1 (found by the launcher's rank variable in its
// environment) and time how long the job takes to end. KILL: the launcher notices the death and stops rank 0.
// STOP: rank 1 hangs without dying, which no launcher notices; rank 0's watchdog must end it after
// training.collective_timeout_s instead of waiting in its collective forever. Either way no rank may be left
// behind once the job has ended (a stopped one included). Returns the job's log.
std::string expect_signalled_rank_ends_the_run(const std::string& device, const std::string& signal, long max_ms,
                                               int timeout_s) {
  testing::ScratchDir dir;
  const std::string config = write_config(dir, device), run = dir / "signalled";
  const std::string script =
      mpirun(2, "timeout 120") + " train -c " + shell_quote(config) +
       " --set training.micro_batch_size=4 --set training.max_steps=1000000" +
      " --set training.collective_timeout_s=" + std::to_string(timeout_s) +
      " --set logging.run_dir=" + shell_quote(run) + " > " + shell_quote(dir / "log.txt") + " 2>&1 & job=$!\n" +
      "for i in $(seq 900); do [ -s " + shell_quote(run + "/metrics.jsonl") + " ] && break; sleep 0.1; done\n" +
      "sent=0\n" +
      "for p in $(pgrep -f " + shell_quote("logging.run_dir=" + run) + "); do\n" +
      "  tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && kill -" + signal +
      " $p && sent=$p\n" +
      "done\n" +
      "[ $sent != 0 ] || { kill $job; echo 'no rank 1 process found to signal'; exit 0; }\n" +
      "start=$(date +%s%N); wait $job; rc=$?; end=$(date +%s%N)\n" +
      // A process that still exists and is not a zombie after a grace period was left behind (then ended here).
      "left=0; for i in $(seq 20); do s=$(awk '{print $3}' /proc/$sent/stat 2>/dev/null); "
      "[ -z \"$s\" ] || [ \"$s\" = Z ] && break; sleep 0.1; done\n" +
      "s=$(awk '{print $3}' /proc/$sent/stat 2>/dev/null); "
      "[ -n \"$s\" ] && [ \"$s\" != Z ] && { left=1; kill -KILL $sent; }\n" +
      "echo \"rc=$rc ms=$(( (end - start) / 1000000 )) left=$left\"\n";
  std::ofstream(dir / "signal.sh") << script;
  auto r = run_command("bash " + shell_quote(dir / "signal.sh"));
  std::ifstream log_file(dir / "log.txt");
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  int rc = -1, left = -1;
  long ms = -1;
  EXPECT_EQ(std::sscanf(r.out.c_str(), "rc=%d ms=%ld left=%d", &rc, &ms, &left), 3) << r.out << r.err;
  EXPECT_NE(rc, 0) << log;
  EXPECT_EQ(left, 0) << "rank 1 (SIG" << signal << ") was still there after the job ended\n" << log;
  EXPECT_LT(ms, max_ms) << "the job took " << ms << " ms to end after rank 1 got SIG" << signal << "\n" << log;
  return log;
}

void expect_killed_rank_ends_the_run(const std::string& device) {
  const std::string log = expect_signalled_rank_ends_the_run(device, "KILL", 10000, 600);
  EXPECT_NE(log.find("signal 9"), std::string::npos) << "the launcher names the killed rank and signal:\n" << log;
}

// timeout_s: short, but long enough that a loaded machine's slowest ordinary step never reaches it (a GPU rank's
// first step loads its kernels). The job must end within the timeout, the watchdog's 0.1 s tick and 10 s for the
// launcher's clean-up of the stopped rank.
void expect_hung_rank_ends_the_run(const std::string& device, int timeout_s) {
  const std::string log = expect_signalled_rank_ends_the_run(device, "STOP", 1000L * timeout_s + 10000, timeout_s);
  EXPECT_NE(log.find("rank 0 of 2: "), std::string::npos) << log;
  EXPECT_NE(log.find("for the other ranks (training.collective_timeout_s = " + std::to_string(timeout_s) + ")"),
            std::string::npos)
      << log;
}

// data.stateful on two ranks: rank r reads streams 2r and 2r + 1 of the four one process with 4 rows reads
// (disjoint, and together that process's batch): the same losses and, gathered in global stream order, the same
// carried states. Stopped after step 3 and resumed, the two-rank run continues bit for bit: each rank takes its own
// rows of the checkpoint's states back. K = 4 windows a stream, so step 5 starts every stream again.
// resets: with data.reset_state_at_document too (the states restart at the shard's document starts).
void expect_stateful_ranks_read_disjoint_streams(const testing::ScratchDir& dir, const std::string& device,
                                                 double loss_tolerance, double state_tolerance, bool resets = false) {
  const std::string shard = dir / "tokens", config = dir / "stateful.yaml";
  if (resets)  // documents closed by EOS = 16, with the sidecar that names it
    testing::write_document_shard(shard, 16, 4 * 4 * 16 + 1, 5);
  else
    testing::write_random_token_shard(shard, 17, 4 * 4 * 16 + 1, 5);
  std::ofstream(config) << R"(
model: {hidden_size: 32, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 17, intermediate_size: 48}
data: {task: tokens, seq_len: 16, stateful: true, reset_state_at_document: )" << (resets ? "true" : "false")
                        << R"(, train_data: )" << shard << R"(}
training: {device: )" << device << R"(, micro_batch_size: 4, max_steps: 6, lr: 0.003, warmup_steps: 2,
           eval_interval: 0, eval_batches: 1, seed: 3}
checkpoint: {interval: 3, keep_last: 5}
logging: {log_interval: 1}
)";
  auto one = run_hgrn({"train", "-c", config, "--set", "logging.run_dir=" + dir / "one"});
  ASSERT_EQ(one.status, 0) << one.err;
  const std::string launch = mpirun(2) + " train -c " + shell_quote(config) + " --set training.micro_batch_size=2";
  auto two = run_command(launch + " --set logging.run_dir=" + shell_quote(dir / "two"));
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_NE(two.out.find("data: 4 contiguous streams of 64 tokens"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("rank r reads streams r*R to r*R + R - 1, R = 2"), std::string::npos) << two.out;
  const std::vector<double> a = losses(dir / "one"), b = losses(dir / "two");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_NEAR(b[s], a[s], loss_tolerance * a[s]) << "step " << s + 1;
  const TrainingState ta = load_checkpoint(dir / "one/checkpoints/step_00000006.h5");
  const TrainingState tb = load_checkpoint(dir / "two/checkpoints/step_00000006.h5");
  ASSERT_EQ(ta.recurrent_states.size(), 2u);
  ASSERT_EQ(tb.recurrent_states.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    ASSERT_EQ(tb.recurrent_states[l].shape(), ta.recurrent_states[l].shape()) << "layer " << l;
    EXPECT_EQ(tb.recurrent_states[l].size(0), 4) << "layer " << l;
    EXPECT_LE(relative_difference(ta.recurrent_states[l], tb.recurrent_states[l]), state_tolerance) << "layer " << l;
  }

  std::filesystem::create_directories(dir / "resumed/checkpoints");
  std::filesystem::copy_file(dir / "two/checkpoints/step_00000003.h5", dir / "resumed/checkpoints/step_00000003.h5");
  auto resumed = run_command(launch + " --set logging.run_dir=" + shell_quote(dir / "resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  const std::vector<double> c = losses(dir / "resumed");
  ASSERT_EQ(c.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(c[s], b[3 + s]) << "step " << 4 + s;
  const TrainingState tc = load_checkpoint(dir / "resumed/checkpoints/step_00000006.h5");
  for (size_t l = 0; l < 2; ++l)
    EXPECT_EQ(std::memcmp(tc.recurrent_states[l].raw_data(), tb.recurrent_states[l].raw_data(),
                          tb.recurrent_states[l].nbytes()),
              0)
        << "layer " << l;
}

TEST(Distributed, StatefulRanksReadDisjointStreamsAndResumeBitwise) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  // fp32 on the CPU, the gradients summed in another order: 1e-5 relative on the losses, 1e-4 on the states.
  expect_stateful_ranks_read_disjoint_streams(dir, "cpu", 1e-5, 1e-4);
}

TEST(Distributed, StatefulRanksWithDocumentResetsReadDisjointStreamsAndResumeBitwise) {
  SKIP_WITHOUT_MPI();
  testing::ScratchDir dir;
  expect_stateful_ranks_read_disjoint_streams(dir, "cpu", 1e-5, 1e-4, /*resets=*/true);
}

TEST(Distributed, AKilledRankMakesTheRunExitNonZeroWithinTenSeconds) {
  SKIP_WITHOUT_MPI();
  expect_killed_rank_ends_the_run("cpu");
}

TEST(Distributed, AHungRankMakesTheOthersStopAfterTheCollectiveTimeout) {
  SKIP_WITHOUT_MPI();
  expect_hung_rank_ends_the_run("cpu", 2);
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

// ---- GPUs (NCCL): fp32 with training.deterministic (the default). Losses within 1e-4 relative and weights and
// moments within 1e-3: the per-rank batches are smaller GEMMs than the single process's, whose cuBLAS algorithms may
// round differently, on top of the other summation order.
TEST(DistributedCuda, TwoGpusTrainLikeOneWithAndWithoutZeroOne) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_ranks_train_like_one_process(dir, write_config(dir, "cuda"), 2, 1e-4, 1e-3);
}

TEST(DistributedCuda, TwoGpusReducingAfterTheBackwardGiveTheSameBits) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_reductions_after_the_backward_give_the_same_bits(dir, write_config(dir, "cuda"), 2);
}

TEST(DistributedCuda, FourGpusTrainLikeOneWithAndWithoutZeroOne) {
  SKIP_WITHOUT_GPUS(4);
  testing::ScratchDir dir;
  expect_ranks_train_like_one_process(dir, write_config(dir, "cuda"), 4, 1e-4, 1e-3);
}

TEST(DistributedCuda, FourGpusSummingGradientsInBf16TrainLikeOne) {
  SKIP_WITHOUT_GPUS(4);
  testing::ScratchDir dir;
  expect_bf16_sums_train_like_one_process(dir, write_config(dir, "cuda"), 4);
}

TEST(DistributedCuda, TwoGpusSummingGradientsInBf16TrainLikeOne) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_bf16_sums_train_like_one_process(dir, write_config(dir, "cuda"), 2);
}

TEST(DistributedCuda, TwoGpusSummingGradientsInBf16ResumeBitwise) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, write_config(dir, "cuda"), 2, true, " --set training.grad_reduce_dtype=bf16");
}

// training.precision fp8 over two GPUs: the ranks' amaxes reduced to shared scales, so the run resumes bit for bit
// from rank 0's checkpoint and trains like one process (within FP8's rounding: a value near an E5M2 or E4M3 rounding
// boundary may round the other way when its sum is formed in another order).
std::string fp8_config(const testing::ScratchDir& dir) {
  const std::string path = write_config(dir, "cuda");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string device = "device: cuda,";
  text.replace(text.find(device), device.size(), "device: cuda, precision: fp8,");
  const std::string fp8_path = dir / "dp-cuda-fp8.yaml";
  std::ofstream(fp8_path) << text;
  return fp8_path;
}

TEST(DistributedCuda, Fp8TwoGpusTrainLikeOne) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  // FP8 codes keep 3 mantissa bits (E4M3) or 2 (E5M2): the other summation order flips some of them, and this tiny
  // model's moments after six steps (a few gradients each) moved by up to 0.31 on an H200. A rank's gradients left
  // out of the reduction move them by O(1); the losses, weights and scales are held tighter.
  expect_ranks_train_like_one_process(dir, fp8_config(dir), 2, 2e-2, 5e-2, 0.4);
}

TEST(DistributedCuda, Fp8TwoGpuRunResumesBitwise) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, fp8_config(dir), 2, false);
}

TEST(DistributedCuda, TwoGpuRunResumesBitwise) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, write_config(dir, "cuda"), 2, false);
}

TEST(DistributedCuda, FourGpuZeroOneRunResumesBitwise) {
  SKIP_WITHOUT_GPUS(4);
  testing::ScratchDir dir;
  expect_multi_rank_resume_is_bitwise(dir, write_config(dir, "cuda"), 4, true);
}

TEST(DistributedCuda, StatefulGpusReadDisjointStreamsAndResumeBitwise) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  // The tolerances of TwoGpusTrainLikeOneWithAndWithoutZeroOne, the states as the weights.
  expect_stateful_ranks_read_disjoint_streams(dir, "cuda", 1e-4, 1e-3);
}

TEST(DistributedCuda, StatefulGpusWithDocumentResetsReadDisjointStreamsAndResumeBitwise) {
  SKIP_WITHOUT_GPUS(2);
  testing::ScratchDir dir;
  expect_stateful_ranks_read_disjoint_streams(dir, "cuda", 1e-4, 1e-3, /*resets=*/true);
}

TEST(DistributedCuda, AKilledRankMakesTheRunExitNonZeroWithinTenSeconds) {
  SKIP_WITHOUT_GPUS(2);
  expect_killed_rank_ends_the_run("cuda");
}

TEST(DistributedCuda, AHungRankMakesTheOthersStopAfterTheCollectiveTimeout) {
  SKIP_WITHOUT_GPUS(2);
  expect_hung_rank_ends_the_run("cuda", 5);
}

}  // namespace
}  // namespace hgrn
