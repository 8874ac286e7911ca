// test_robustness_config.cpp: malformed and extreme configs, generated from a valid one key by key (wrong types,
// out-of-range and non-finite numbers, missing, unknown and duplicate keys, broken YAML, NUL bytes, several
// documents): every one is refused with a ConfigError that names the file and the key, quickly, and the binary
// exits 2 on them instead of crashing. And concurrent runs: a second trainer on a run directory in use is refused
// with the holder's process id, and a trainer killed with SIGKILL leaves no stale lock.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "config/config.h"
#include "core/rng.h"
#include "hgrn_binary.h"
#include "scratch_dir.h"
#include "train/run_lock.h"

namespace hgrn {
namespace {

const char* kSource = "fuzz.yaml";

Config valid_config() {
  Config c;
  c.model.expand_ratio = 16;
  c.model.vocab_size = 64;
  return c;
}

// The valid config's lines, and for each key the line it is on and its path.
struct KeyLine {
  std::string path;
  size_t line = 0;
  std::string indent;
  std::string leaf;
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

std::vector<KeyLine> key_lines(const std::vector<std::string>& lines) {
  std::vector<KeyLine> keys;
  std::vector<std::string> sections;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const size_t indent = line.find_first_not_of(' ');
    const size_t colon = line.find(':');
    if (indent == std::string::npos || line[indent] == '#' || colon == std::string::npos) continue;
    sections.resize(indent / 2);
    const std::string leaf = line.substr(indent, colon - indent);
    if (colon + 1 == line.size()) {
      sections.push_back(leaf);
      continue;
    }
    std::string path;
    for (const std::string& s : sections) path += s + ".";
    keys.push_back({path + leaf, i, line.substr(0, indent), leaf});
  }
  return keys;
}

struct Case {
  std::string what, text, key;  // key: what the message must name ("" for whole-file problems)
};

std::vector<Case> generated_cases() {
  const std::vector<std::string> base = lines_of(config_to_yaml(valid_config()));
  std::vector<Case> cases;
  const auto with_line = [&](size_t index, const std::string& replacement) {
    std::vector<std::string> lines = base;
    lines[index] = replacement;
    return join_lines(lines);
  };
  for (const KeyLine& k : key_lines(base)) {
    const std::string value = base[k.line].substr(base[k.line].find(':') + 2);
    const bool is_string = value.find_first_not_of("0123456789.-+e") != std::string::npos && value != "true" &&
                           value != "false" && value != "null";
    // Every key: a list or a mapping where a scalar belongs.
    for (const char* bad : {"[1, 2]", "{a: 1}"})
      cases.push_back({k.path + " = " + bad, with_line(k.line, k.indent + k.leaf + ": " + bad), k.path});
    // An unknown key next to it and the same key twice.
    cases.push_back({"unknown key beside " + k.path, with_line(k.line, base[k.line] + "\n" + k.indent + k.leaf +
                                                                           "_typo: 1"), k.path + "_typo"});
    cases.push_back({"duplicate " + k.path, with_line(k.line, base[k.line] + "\n" + base[k.line]), k.path});
    if (is_string) continue;
    // Numbers and booleans: wrong types, out-of-range, negative and non-finite values (no numeric key takes any).
    for (const char* bad : {"\"12\"", "twelve", "-1", "-1.5", "1e400", ".nan", ".inf", "-.inf",
                            "123456789012345678901234567890", "-123456789012345678901234567890"}) {
      // A huge positive number is a legal (if unwise) value of a float key: only integer keys overflow.
      const bool float_key = value.find_first_of(".e") != std::string::npos;
      if (float_key && std::string(bad) == "123456789012345678901234567890") continue;
      cases.push_back({k.path + " = " + bad, with_line(k.line, k.indent + k.leaf + ": " + bad), k.path});
    }
  }
  // Whole-file problems: broken YAML, NUL bytes, several documents, nothing at all.
  const std::string valid = join_lines(base);
  cases.push_back({"unclosed bracket", valid + "model: [1, 2\n", ""});
  cases.push_back({"tab indentation", "model:\n\thidden_size: 64\n", ""});
  cases.push_back({"second document", valid + "---\nmodel: {hidden_size: 32}\n", ""});
  cases.push_back({"empty", "", ""});
  cases.push_back({"comments only", "# nothing\n# here\n", ""});
  cases.push_back({"NUL filled", std::string(4096, '\0'), ""});
  cases.push_back({"top level list", "- model\n- data\n", ""});
  cases.push_back({"top level scalar", "hello\n", ""});
  Rng rng(11);
  for (int i = 0; i < 20; ++i) {
    std::string text = valid;
    text[rng.below(text.size())] = '\0';
    cases.push_back({"NUL byte " + std::to_string(i), text, ""});
  }
  return cases;
}

TEST(RobustnessConfig, EveryMalformedConfigIsRefusedNamingFileAndKey) {
  const std::vector<Case> cases = generated_cases();
  ASSERT_GT(cases.size(), 500u);
  for (const Case& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
      parse_config(c.text, kSource);
      ADD_FAILURE() << c.what << ": accepted";
      continue;
    } catch (const ConfigError& error) {
      message = error.what();
    } catch (const std::exception& error) {
      ADD_FAILURE() << c.what << ": not a ConfigError: " << error.what();
      continue;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 1.0) << c.what;
    EXPECT_EQ(message.rfind(std::string(kSource) + ":", 0), 0u) << c.what << ": " << message;
    if (!c.key.empty()) EXPECT_NE(message.find(c.key), std::string::npos) << c.what << ": " << message;
  }
}

// Out of range for what the key means (a sample per kind of check), each refused naming the key.
TEST(RobustnessConfig, ImpossibleValuesAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.hidden_size", "0"},          {"model.num_hidden_layers", "-3"}, {"model.vocab_size", "0"},
      {"model.expand_ratio", "0"},         {"model.expand_ratio", "7"},       {"model.num_heads", "2"},
      {"data.seq_len", "0"},               {"data.mqar.num_kv_pairs", "0"},   {"training.micro_batch_size", "0"},
      {"training.max_steps", "-1"},        {"training.lr", "0.0"},            {"training.beta1", "1.0"},
      {"training.min_lr_ratio", "2.0"},    {"training.grad_clip", "-1.0"},    {"training.max_nonfinite_steps", "0"},
      {"training.warmup_steps", "100000"}, {"checkpoint.keep_last", "0"},     {"logging.log_interval", "0"},
      {"logging.run_dir", "\"\""},         {"training.device", "tpu"},        {"checkpoint.resume", "/no/such/file"}};
  for (const auto& [key, value] : cases) {
    try {
      parse_config(config_to_yaml(valid_config()), kSource, {key + "=" + value});
      ADD_FAILURE() << key << "=" << value << ": accepted";
    } catch (const ConfigError& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind(std::string(kSource) + ":", 0), 0u) << message;
      EXPECT_NE(message.find(key), std::string::npos) << key << "=" << value << ": " << message;
    }
  }
}

// Through the binary: a bad config exits 2 with the message on stderr, never a crash (a signal) or status 1.
TEST(RobustnessConfig, TheBinaryExitsTwoOnMalformedConfigs) {
  testing::ScratchDir dir;
  const std::vector<Case> cases = generated_cases();
  for (size_t i = 0; i < cases.size(); i += 37) {
    const std::string path = dir / ("c" + std::to_string(i) + ".yaml");
    std::ofstream(path, std::ios::binary) << cases[i].text;
    for (const char* command : {"info", "train"}) {
      const testing::CommandResult r = testing::run_hgrn({command, "--config", path});
      EXPECT_EQ(r.status, 2) << command << " " << cases[i].what << ": " << r.err;
      EXPECT_NE(r.err.find("hgrn: error: " + path + ":"), std::string::npos) << cases[i].what << ": " << r.err;
    }
  }
}

// ---- concurrent runs ----

TEST(RobustnessConcurrency, ASecondLockOnARunDirectoryIsRefusedWithTheHolder) {
  testing::ScratchDir dir;
  {
    RunDirLock first(dir / "run");
    try {
      RunDirLock second(dir / "run");
      ADD_FAILURE() << "a second lock was granted";
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("is in use by another hgrn train (process " + std::to_string(::getpid())),
                std::string::npos) << message;
      EXPECT_NE(message.find(RunDirLock::lock_path(dir / "run")), std::string::npos) << message;
    }
  }
  RunDirLock again(dir / "run");  // released with the first
}

std::string tiny_config(const testing::ScratchDir& dir, int64_t max_steps) {
  const std::string path = dir / ("tiny-" + std::to_string(max_steps) + ".yaml");
  std::ofstream(path) << "model: {hidden_size: 16, num_hidden_layers: 1, expand_ratio: 8, vocab_size: 17}\n"
                         "data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}\n"
                         "training: {device: cpu, threads: 1, micro_batch_size: 2, max_steps: " +
                             std::to_string(max_steps) + ", warmup_steps: 0, eval_interval: 0}\n"
                         "logging: {log_interval: 1, run_dir: " + (dir / "run") + "}\n";
  return path;
}

// Two trainers on one run directory: the second is refused (exit non-zero, the first one's process id named) and
// the first goes on untouched; after the first is killed with SIGKILL the directory is free again at once.
TEST(RobustnessConcurrency, TwoTrainersOnOneRunDirectory) {
  testing::ScratchDir dir;
  const std::string long_config = tiny_config(dir, 100000000);
  const pid_t first = ::fork();
  ASSERT_GE(first, 0);
  if (first == 0) {
    const std::string binary = testing::hgrn_binary();
    const int null_fd = ::open("/dev/null", O_WRONLY);
    ::dup2(null_fd, 1);
    ::execl(binary.c_str(), binary.c_str(), "train", "--config", long_config.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const std::string metrics = dir / "run/metrics.jsonl";
  for (int i = 0; i < 600 && !(std::filesystem::exists(metrics) && std::filesystem::file_size(metrics) > 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(std::filesystem::exists(metrics)) << "the first trainer did not start";

  const testing::CommandResult second = testing::run_hgrn({"train", "--config", tiny_config(dir, 3)});
  EXPECT_NE(second.status, 0);
  EXPECT_NE(second.err.find("in use by another hgrn train (process " + std::to_string(first) + ","),
            std::string::npos) << second.err;
  int status = 0;
  EXPECT_EQ(::waitpid(first, &status, WNOHANG), 0) << "the first trainer stopped";

  ::kill(first, SIGKILL);
  ::waitpid(first, &status, 0);
  // No stale lock: a new run in the same directory starts (and, with no checkpoint yet, trains from step 0).
  const testing::CommandResult third = testing::run_hgrn({"train", "--config", tiny_config(dir, 3)});
  EXPECT_EQ(third.status, 0) << third.err;
}

}  // namespace
}  // namespace hgrn
