// test_signals.cpp: `hgrn train` as a real process: SIGTERM finishes the step, writes a checkpoint and exits with
// status 75, and the same command resumes; a second signal exits at once; SIGKILL at any moment leaves every
// checkpoint file valid and the newest one resumable.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "hgrn_binary.h"
#include "io/checkpoint.h"
#include "scratch_dir.h"
#include "train/stop_signal.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

// A config whose steps take a few milliseconds and that logs every step.
std::string write_config(const std::string& run_dir, int64_t max_steps, int64_t checkpoint_interval) {
  const std::string path = run_dir + ".yaml";
  std::ofstream(path) << "model: {hidden_size: 32, num_hidden_layers: 2, expand_ratio: 8, vocab_size: 17}\n"
                      << "data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}\n"
                      << "training: {micro_batch_size: 8, max_steps: " << max_steps
                      << ", warmup_steps: 2, eval_interval: 0, eval_batches: 1, threads: 1}\n"
                      << "checkpoint: {interval: " << checkpoint_interval << ", keep_last: 100}\n"
                      << "logging: {log_interval: 1, run_dir: " << run_dir << "}\n";
  return path;
}

pid_t start_training(const std::string& config_path, const std::string& log_path) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    const std::string binary = testing::hgrn_binary();
    execl(binary.c_str(), binary.c_str(), "train", "--config", config_path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Lines in the metrics file: how many steps the running process has logged.
int64_t logged_steps(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"kind\": \"train\"") != std::string::npos;
  return n;
}

bool wait_for_steps(const std::string& run_dir, int64_t steps) {
  for (int i = 0; i < 3000 && logged_steps(run_dir) < steps; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return logged_steps(run_dir) >= steps;
}

int wait_exit_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string slurp(const std::string& path) {
  std::ostringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

TEST(Signals, SigtermWritesACheckpointExitsWith75AndTheRunResumes) {
  const testing::ScratchDir scratch;  // the run directory and, beside it, the config and the logs
  const std::string run_dir = scratch / "run";
  const std::string config = write_config(run_dir, 100000, 0);
  pid_t pid = start_training(config, run_dir + ".log");
  ASSERT_TRUE(wait_for_steps(run_dir, 3)) << slurp(run_dir + ".log");
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit_status(pid), kExitStoppedBySignal) << slurp(run_dir + ".log");
  std::ostringstream warnings;
  std::optional<std::string> latest = find_latest_valid_checkpoint(run_dir + "/checkpoints", warnings);
  ASSERT_TRUE(latest.has_value()) << slurp(run_dir + ".log");
  const TrainingState stopped = load_checkpoint(*latest);
  EXPECT_GE(stopped.step, 3);
  EXPECT_EQ(stopped.step, logged_steps(run_dir)) << "the checkpoint holds exactly the steps that were taken";

  // The same command continues from there to a new max_steps and exits 0.
  const std::string resume_config = write_config(run_dir, stopped.step + 3, 0);
  pid = start_training(resume_config, run_dir + ".resume.log");
  EXPECT_EQ(wait_exit_status(pid), 0) << slurp(run_dir + ".resume.log");
  EXPECT_NE(slurp(run_dir + ".resume.log").find("resumed from " + *latest), std::string::npos);
  EXPECT_EQ(load_checkpoint(*find_latest_valid_checkpoint(run_dir + "/checkpoints", warnings)).step,
            stopped.step + 3);
}

TEST(Signals, SecondSignalExitsAtOnce) {
  const testing::ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  pid_t pid = start_training(write_config(run_dir, 100000, 0), run_dir + ".log");
  ASSERT_TRUE(wait_for_steps(run_dir, 2)) << slurp(run_dir + ".log");
  kill(pid, SIGINT);
  kill(pid, SIGINT);
  const int status = wait_exit_status(pid);
  // Either the second signal arrived before the first was handled to completion (exit 128 + SIGINT), or the
  // graceful stop had already finished; both are fine, a hang or a crash is not.
  EXPECT_TRUE(status == 128 + SIGINT || status == kExitStoppedBySignal) << status << "\n" << slurp(run_dir + ".log");
  // Whatever checkpoint files exist (none, if the second signal came before the first checkpoint) are whole.
  std::error_code no_dir;
  for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints", no_dir))
    if (checkpoint_step_from_file_name(entry.path().filename().string()))
      EXPECT_NO_THROW(load_checkpoint(entry.path().string())) << entry.path();
}

TEST(Signals, SigkillNeverLeavesABadCheckpoint) {
  // Checkpoints every step, so a kill lands inside a checkpoint write often. Every file with a checkpoint's name
  // must load, and the newest must resume.
  const testing::ScratchDir scratch;
  for (int round = 0; round < 4; ++round) {
    const std::string run_dir = scratch / ("run-" + std::to_string(round));
    pid_t pid = start_training(write_config(run_dir, 100000, 1), run_dir + ".log");
    ASSERT_TRUE(wait_for_steps(run_dir, 2 + round)) << slurp(run_dir + ".log");
    std::this_thread::sleep_for(std::chrono::microseconds(700 * round));
    kill(pid, SIGKILL);
    EXPECT_EQ(wait_exit_status(pid), 128 + SIGKILL);
    for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints"))
      if (checkpoint_step_from_file_name(entry.path().filename().string()))
        EXPECT_NO_THROW(load_checkpoint(entry.path().string())) << entry.path();
    std::ostringstream warnings;
    EXPECT_TRUE(find_latest_valid_checkpoint(run_dir + "/checkpoints", warnings).has_value());
  }
}

}  // namespace
}  // namespace hgrn
