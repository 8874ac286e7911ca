// test_cli.cpp: the built `hgrn` binary, run as a user would: --version, --help, `info` on the default config
// (its parameter total against model_param_specs), and the exit statuses and messages of bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"
#include "data/token_shards.h"
#include "gpu_test.h"
#include "hgrn_binary.h"
#include "models/cost.h"
#include "models/params.h"
#include "scratch_dir.h"

namespace hgrn {
namespace {

using testing::hgrn_binary;
using testing::run_hgrn;
using testing::CommandResult;
using testing::ScratchDir;

std::string default_config() { return std::string(HGRN_SOURCE_DIR) + "/configs/mqar-tiny.yaml"; }

std::string write_temp_config(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

int64_t param_total(const ModelConfig& m) {
  int64_t total = 0;
  for (const ParamSpec& spec : model_param_specs(m)) total += shape_numel(spec.shape);
  return total;
}

// The number on the "  total" line of the parameter table.
int64_t printed_param_total(const std::string& info_output) {
  const size_t table = info_output.find("== parameters ==");
  if (table == std::string::npos) return -1;
  const size_t line = info_output.find("\n  total", table);
  if (line == std::string::npos) return -1;
  std::istringstream in(info_output.substr(line + 8));
  int64_t value = -1;
  in >> value;
  return value;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(hgrn_binary())) << "hgrn binary not found at " << hgrn_binary();
  }
};

TEST_F(Cli, VersionNamesTheCommitAndCuda) {
  const CommandResult r = run_hgrn({"--version"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(std::string("hgrn ") + HGRN_VERSION + " (git " + HGRN_GIT_COMMIT + ")"), std::string::npos)
      << r.out;
#ifdef HGRN_WITH_CUDA
  EXPECT_NE(r.out.find("CUDA backend: compiled in"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("CUDA backend: not compiled in"), std::string::npos) << r.out;
#endif
}

TEST_F(Cli, HelpListsTheCommandsWithExamples) {
  CommandResult r = run_hgrn({"--help"});
  EXPECT_EQ(r.status, 0) << r.err;
  for (const char* text : {"train", "info", "--version", "Examples:", "hgrn info --config configs/mqar-tiny.yaml"})
    EXPECT_NE(r.out.find(text), std::string::npos) << "missing " << text << " in\n" << r.out;
  for (const char* command : {"info", "train"}) {
    r = run_hgrn({command, "--help"});
    EXPECT_EQ(r.status, 0) << r.err;
    for (const char* text : {"--config", "--set", "Examples:"})
      EXPECT_NE(r.out.find(text), std::string::npos) << "missing " << text << " in\n" << r.out;
  }
}

TEST_F(Cli, BenchRecurrenceOnTheCpuReportsTimesRatesAndTheFlopCount) {
  ScratchDir dir;
  const std::string json_path = (dir.path() / "recurrence.json").string();
  const CommandResult r = run_hgrn({"bench", "--recurrence", "1,70,2,16,8", "--dtype", "fp32", "--device", "cpu",
                                    "--warmup", "1", "--iters", "2", "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| forward GB/s | forward TFLOP/s | forward+backward TFLOP/s |"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("ceilings measured"), std::string::npos) << "no GPU ceilings on the CPU";
  std::ifstream f(json_path);
  ASSERT_TRUE(f.good()) << json_path;
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_GT(j.at("forward_ms").get<double>(), 0.0);
  EXPECT_GT(j.at("forward_backward_ms").get<double>(), 0.0);
  // B·T tokens at the chunkwise count, with fla's chunk for T = 70 (64).
  EXPECT_DOUBLE_EQ(j.at("forward_flops").get<double>(), 70.0 * gla_recurrence_flops_per_token(2, 16, 8, 64));
  EXPECT_DOUBLE_EQ(j.at("forward_tflops").get<double>(),
                   j.at("forward_flops").get<double>() / (j.at("forward_ms").get<double>() * 1e-3) / 1e12);
  EXPECT_EQ(j.at("device_copy_gbps").get<double>(), 0.0);
}

TEST_F(Cli, BenchScanOnTheCpuReportsTimesAndRates) {
  ScratchDir dir;
  const std::string json_path = (dir.path() / "scan.json").string();
  const CommandResult r = run_hgrn({"bench", "--scan", "2,70,8", "--dtype", "fp32", "--device", "cpu", "--warmup",
                                    "1", "--iters", "2", "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| forward ms | forward+backward ms | forward GB/s | forward+backward GB/s |"),
            std::string::npos)
      << r.out;
  std::ifstream f(json_path);
  ASSERT_TRUE(f.good()) << json_path;
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j.at("kind").get<std::string>(), "scan");
  EXPECT_GT(j.at("forward_ms").get<double>(), 0.0);
  EXPECT_GT(j.at("forward_backward_ms").get<double>(), 0.0);
  // fp32: x, g, o in the forward (12 bytes an element); x, g, dO, dx, dg more in the backward (20).
  EXPECT_DOUBLE_EQ(j.at("forward_min_bytes").get<double>(), 2 * 70 * 8 * 12.0);
  EXPECT_DOUBLE_EQ(j.at("forward_backward_min_bytes").get<double>(), 2 * 70 * 8 * 32.0);
  // Two benchmarks at once are refused.
  EXPECT_NE(run_hgrn({"bench", "--scan", "2,70,8", "--recurrence", "1,70,2,16,8", "--device", "cpu"}).status, 0);
}

// --document-tokens: the steps, the recurrence and the scan timed with resets at random document starts (the cost of
// data.reset_state_at_document); the resets reach the model (the first step's loss differs from the run without).
TEST_F(Cli, BenchWithDocumentResets) {
  ScratchDir dir;
  auto first_loss = [&](const std::string& documents) {
    const std::string json_path = (dir.path() / ("steps" + documents + ".json")).string();
    const CommandResult r = run_hgrn({"bench", "--config", default_config(), "--set", "training.device=cpu",
                                      "--warmup", "0", "--steps", "1", "--document-tokens", documents, "--json",
                                      json_path});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.find("the state restarted at each document start") != std::string::npos, documents != "0")
        << r.out;
    std::ifstream f(json_path);
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("document_tokens").get<int64_t>(), std::stoll(documents));
    return j.at("first_loss").get<double>();
  };
  EXPECT_NE(first_loss("8"), first_loss("0"));
  for (const std::vector<std::string>& op : {std::vector<std::string>{"--recurrence", "1,70,2,16,8"},
                                             std::vector<std::string>{"--scan", "2,70,8", "--fused"}}) {
    std::vector<std::string> command{"bench", "--dtype", "fp32", "--device", "cpu", "--warmup", "1", "--iters", "2",
                                     "--document-tokens", "16"};
    command.insert(command.end(), op.begin(), op.end());
    const CommandResult r = run_hgrn(command);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("with resets: packed documents of ~16 tokens"), std::string::npos) << r.out;
  }
}

// Generation on the CPU with the default config's model, fused and op by op: the table row, and the JSON's rates
// consistent with its times; without --config, or bf16 on the CPU, it is refused.
TEST_F(Cli, BenchGenerateReportsPrefillAndDecodeRates) {
  ScratchDir dir;
  for (const std::string decode : {"fused", "ops"}) {
    const std::string json_path = (dir.path() / (decode + ".json")).string();
    const CommandResult r =
        run_hgrn({"bench", "--config", default_config(), "--generate", "--device", "cpu", "--dtype", "fp32",
                  "--batch", "2", "--prompt-length", "20", "--new-tokens", "6", "--decode", decode, "--warmup", "1",
                  "--runs", "2", "--json", json_path});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("| prefill tokens/s | decode tokens/s | ms per token |"), std::string::npos) << r.out;
    std::ifstream f(json_path);
    ASSERT_TRUE(f.good()) << json_path;
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_EQ(j.at("kind").get<std::string>(), "generation");
    EXPECT_EQ(j.at("decode_path").get<std::string>(), decode == "fused" ? "fused" : "op by op");
    EXPECT_EQ(j.at("batch").get<int64_t>(), 2);
    EXPECT_EQ(j.at("new_tokens").get<int64_t>(), 6);
    const double ms = j.at("ms_per_token").get<double>(), prefill_ms = j.at("prefill_ms").get<double>();
    EXPECT_GT(ms, 0.0);
    const double prefill_rate = 2 * 20 / (prefill_ms * 1e-3);
    EXPECT_NEAR(j.at("prefill_tokens_per_s").get<double>(), prefill_rate, 1e-6 * prefill_rate);
    EXPECT_GT(j.at("decode_tokens_per_s").get<double>(), 0.0);
    EXPECT_GT(j.at("weight_bytes").get<double>(), 0.0);
    EXPECT_GT(j.at("state_bytes").get<double>(), 0.0);
  }
  EXPECT_NE(run_hgrn({"bench", "--generate", "--scan", "2,70,8", "--device", "cpu"}).status, 0);
  const CommandResult bf16 = run_hgrn({"bench", "--config", default_config(), "--generate", "--device", "cpu",
                                       "--new-tokens", "4", "--warmup", "0", "--runs", "1"});
  EXPECT_NE(bf16.status, 0);
  EXPECT_NE(bf16.err.find("bf16 needs the GPU"), std::string::npos) << bf16.err;
}

// Training steps on the CPU (the default config): the JSON has the median and the mean step time, each between the
// fastest and the slowest step, and the tokens/s of each; the printout gives both.
TEST_F(Cli, BenchStepsReportTheMedianAndTheMeanStepTime) {
  ScratchDir dir;
  const std::string json_path = (dir.path() / "steps.json").string();
  const CommandResult r = run_hgrn({"bench", "--config", default_config(), "--set", "training.device=cpu", "--warmup",
                                    "1", "--steps", "4", "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(" / median "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tokens/s at the mean"), std::string::npos) << r.out;
  std::ifstream f(json_path);
  ASSERT_TRUE(f.good()) << json_path;
  const nlohmann::json j = nlohmann::json::parse(f);
  const double lo = j.at("min_ms").get<double>(), hi = j.at("max_ms").get<double>();
  const double median = j.at("median_ms").get<double>(), mean = j.at("mean_ms").get<double>();
  EXPECT_GT(lo, 0.0);
  EXPECT_LE(lo, median);
  EXPECT_LE(median, hi);
  EXPECT_LE(lo, mean);
  EXPECT_LE(mean, hi);
  const double tokens = j.at("tokens_per_step").get<double>();
  EXPECT_NEAR(j.at("tokens_per_s").get<double>(), tokens / (median * 1e-3), 1e-6 * tokens / (median * 1e-3));
  EXPECT_NEAR(j.at("tokens_per_s_mean").get<double>(), tokens / (mean * 1e-3), 1e-6 * tokens / (mean * 1e-3));
}

// HGRN_MEMORY_REPORT on a GPU: the table of what was live at the high-water mark sums to the peak that the bench
// reports (both taken after the warm-up), and names the model's ranges (the recurrence keeps its inputs); after the
// warm-up the caching allocator asks the driver for nothing (issue 3: no cudaMalloc in the steady-state step).
TEST_F(Cli, BenchMemoryReportOnTheGpuAddsUpToThePeak) {
  HGRN_SKIP_WITHOUT_GPU();
  ScratchDir dir;
  const std::string json_path = (dir.path() / "bench.json").string();
  const CommandResult r = testing::run_command(
      "HGRN_MEMORY_REPORT=1 " + testing::shell_quote(hgrn_binary()) + " bench -c " +
      testing::shell_quote(default_config()) + " -s training.device=cuda --warmup 2 --steps 3 --json " +
      testing::shell_quote(json_path));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string header = "HGRN_MEMORY_REPORT: live at the high-water mark, ";
  const size_t at = r.err.find(header);
  ASSERT_NE(at, std::string::npos) << r.err;
  const double report_gib = std::stod(r.err.substr(at + header.size()));
  std::ifstream f(json_path);
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_NEAR(report_gib, j.at("peak_memory_gib").get<double>(), 1e-3) << r.err;
  EXPECT_EQ(j.at("timed_driver_allocations").get<int64_t>(), 0) << r.out;
  EXPECT_GE(j.at("reserved_memory_gib").get<double>(), j.at("peak_memory_gib").get<double>());
  EXPECT_NE(r.err.find("  recurrence\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" B each\n"), std::string::npos) << r.err;
}

TEST_F(Cli, InfoOnTheDefaultConfigShowsTheParameterTotal) {
  const CommandResult r = run_hgrn({"info", "--config", default_config()});
  ASSERT_EQ(r.status, 0) << r.err;
  const Config config = load_config(default_config());
  EXPECT_EQ(printed_param_total(r.out), param_total(config.model)) << r.out;
  for (const char* text : {"== resolved config ==", "forward FLOPs per token",
                           "training FLOPs per token", "recurrent states", "activations for backward"})
    EXPECT_NE(r.out.find(text), std::string::npos) << "missing " << text << " in\n" << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(Cli, InfoAppliesSetOverrides) {
  const CommandResult r = run_hgrn({"info", "-c", default_config(), "--set", "model.hidden_size=256", "-s",
                             "model.num_hidden_layers=3"});
  ASSERT_EQ(r.status, 0) << r.err;
  const Config config = load_config(default_config(), {"model.hidden_size=256", "model.num_hidden_layers=3"});
  EXPECT_EQ(printed_param_total(r.out), param_total(config.model)) << r.out;
  EXPECT_NE(r.out.find("hidden_size: 256"), std::string::npos);
}

TEST_F(Cli, BadConfigFileExitsWithStatusTwoAndTheMessage) {
  const std::string path =
      write_temp_config("hgrn_cli_bad.yaml", "model:\n  expand_ratio: 16\n  hidden_size: sixty-four\n");
  for (const char* command : {"info", "train"}) {
    const CommandResult r = run_hgrn({command, "--config", path});
    EXPECT_EQ(r.status, 2) << command;
    EXPECT_EQ(r.err.rfind("hgrn: error: " + path + ":3:16: model.hidden_size: expected an integer", 0), 0u)
        << command << ": " << r.err;
  }
  std::filesystem::remove(path);
}

TEST_F(Cli, MissingConfigFileExitsWithStatusTwo) {
  const CommandResult r = run_hgrn({"info", "--config", "/nonexistent/hgrn.yaml"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("hgrn: error: /nonexistent/hgrn.yaml: cannot read the config file"), std::string::npos)
      << r.err;
}

TEST_F(Cli, BadSetExitsWithStatusTwo) {
  CommandResult r = run_hgrn({"info", "--config", default_config(), "--set", "training.lrr=1"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--set 'training.lrr=1': training.lrr: unknown key (did you mean training.lr?)"),
            std::string::npos)
      << r.err;
  r = run_hgrn({"info", "--config", default_config(), "--set", "training.max_steps=0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("training.max_steps: expected a positive integer, got 0"), std::string::npos) << r.err;
}

TEST_F(Cli, UnknownSubcommandSuggestsTheClosest) {
  const CommandResult r = run_hgrn({"trian", "--config", default_config()});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("hgrn: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'train'?"), std::string::npos) << r.err;
}

TEST_F(Cli, UnknownFlagOrMissingArgumentsFail) {
  CommandResult r = run_hgrn({"info", "--config", default_config(), "--colour"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--colour"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hgrn info --help"), std::string::npos) << r.err;
  r = run_hgrn({"info"});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--config is required"), std::string::npos) << r.err;
  r = run_hgrn({});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("subcommand is required"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

// `hgrn eval` of an MQAR run scores the held-out stream the run's own evaluations scored, on the device and in the
// precision the run trained in: the same checkpoint gives the same loss and accuracy as the run's last evaluation.
void expect_eval_repeats_the_runs_last_evaluation(const std::string& device, const std::string& precision) {
  ScratchDir dir;
  const std::string config = dir / "tiny.yaml";
  std::ofstream(config) << "model: {hidden_size: 16, num_hidden_layers: 1, expand_ratio: 8, vocab_size: 17}\n"
                           "data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}\n"
                           "training: {device: " + device + ", precision: " + precision +
                               ", micro_batch_size: 8, max_steps: 20, warmup_steps: 2, seed: 3,\n"
                           "           eval_interval: 20, eval_batches: 3}\n"
                           "logging: {run_dir: " + (dir / "run") + "}\n";
  const CommandResult trained = run_hgrn({"train", "--config", config});
  ASSERT_EQ(trained.status, 0) << trained.err;
  nlohmann::json last_eval;
  std::ifstream metrics(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("kind") == "eval") last_eval = record;
  }
  ASSERT_FALSE(last_eval.is_null());
  const CommandResult evaluated = run_hgrn({"eval", "--config", config});
  ASSERT_EQ(evaluated.status, 0) << evaluated.err;
  EXPECT_NE(evaluated.out.find(device == "cuda" ? "on the GPU, " + std::string(precision) : "on the CPU"),
            std::string::npos)
      << evaluated.out;
  const std::string json_line = evaluated.out.substr(evaluated.out.rfind("{\"task\""));
  const nlohmann::json result = nlohmann::json::parse(json_line);
  // Both print 6 significant digits of the same numbers.
  EXPECT_EQ(result.at("loss").get<double>(), last_eval.at("loss").get<double>()) << evaluated.out;
  EXPECT_EQ(result.at("accuracy").get<double>(), last_eval.at("accuracy").get<double>()) << evaluated.out;
}

TEST(CliEval, MqarEvalRepeatsTheRunsLastEvaluation) { expect_eval_repeats_the_runs_last_evaluation("cpu", "fp32"); }

TEST(CliEval, MqarEvalRepeatsTheRunsLastEvaluationOnTheGpu) {
  HGRN_SKIP_WITHOUT_GPU();
  expect_eval_repeats_the_runs_last_evaluation("cuda", "bf16");
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

// A tiny MQAR run (vocabulary 17) trained for two steps into BASE/run; returns its config file.
std::string trained_tiny_run(const std::string& base) {
  std::filesystem::create_directories(base);
  const std::string config = base + "/tiny.yaml";
  std::ofstream(config) << "model: {hidden_size: 16, num_hidden_layers: 1, expand_ratio: 8, vocab_size: 17}\n"
                           "data: {task: mqar, seq_len: 16, mqar: {num_kv_pairs: 2}}\n"
                           "training: {device: cpu, threads: 1, micro_batch_size: 2, max_steps: 2, warmup_steps: 0,\n"
                           "           eval_interval: 0, eval_batches: 1}\n"
                           "logging: {run_dir: " + base + "/run}\n";
  const CommandResult trained = run_hgrn({"train", "--config", config});
  EXPECT_EQ(trained.status, 0) << trained.err;
  return config;
}

// A config describing another model than the checkpoint's is refused (exit 2, naming the config file, the model
// section and both shapes), as a resume refuses it; so is a shard tokenised for a larger vocabulary than the model's.
TEST(CliEval, RefusesAnotherModelAndAShardOfAnotherVocabulary) {
  ScratchDir dir;
  const std::string config = trained_tiny_run(dir.str());
  CommandResult r = run_hgrn({"eval", "--config", config, "--set", "model.hidden_size=32"});
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(config + ": model: checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("D=16"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("D=32"), std::string::npos) << r.err;

  // A byte-level shard (257 ids) against the 17-id model.
  const std::string prefix = dir / "bytes";
  TokenShardWriter writer(prefix, 257);
  writer.append_document(std::vector<int32_t>(64, 200));
  ShardMetadata meta;
  meta.tokenizer = "byte";
  meta.vocab_size = 257;
  meta.eos_id = 256;
  writer.finish(meta);
  r = run_hgrn({"eval", "--config", config, "--set", "data.task=tokens", "--set", "data.train_data=" + prefix,
                "--data", prefix});
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.err.find("--data = " + prefix + " was tokenised with byte (257 ids), but model.vocab_size is 17"),
            std::string::npos) << r.err;
}

// data.reset_state_at_document on `hgrn eval`: the state restarts after each EOS of the scored shard (its sidecar's
// id), which the result says, and which changes the loss of documents packed into one window.
TEST(CliEval, DocumentResetsRestartTheStateAtEachDocument) {
  ScratchDir dir;
  const std::string config = trained_tiny_run(dir.str());
  const std::string prefix = dir / "documents";
  TokenShardWriter writer(prefix, 17);
  for (int d = 0; d < 12; ++d) {
    std::vector<int32_t> doc;
    for (int t = 0; t < 5 + d % 4; ++t) doc.push_back(1 + (3 * d + t) % 15);
    doc.push_back(16);
    writer.append_document(doc);
  }
  ShardMetadata meta;
  meta.tokenizer = "test";
  meta.vocab_size = 17;
  meta.eos_id = 16;
  writer.finish(meta);
  auto evaluate = [&](const std::string& resets) {
    const CommandResult r = run_hgrn({"eval", "--config", config, "--set", "data.task=tokens", "--set",
                                      "data.train_data=" + prefix, "--set", "data.reset_state_at_document=" + resets,
                                      "--data", prefix, "--seq-len", "32", "--batch-size", "2"});
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.find("state restarted at each document start") != std::string::npos, resets == "true") << r.out;
    return nlohmann::json::parse(r.out.substr(r.out.rfind("{\"data\"")));
  };
  const nlohmann::json with = evaluate("true"), without = evaluate("false");
  EXPECT_TRUE(with.at("document_resets").get<bool>());
  EXPECT_FALSE(without.at("document_resets").get<bool>());
  EXPECT_EQ(with.at("targets").get<int64_t>(), without.at("targets").get<int64_t>());
  EXPECT_NE(with.at("loss").get<double>(), without.at("loss").get<double>());
}

// The exported config.json names the training tokenizer's end-of-document token (the byte tokenizer's is 256) as
// eos and bos; an MQAR model has no tokenizer, so both are null.
TEST(CliExport, SpecialTokensComeFromTheTrainingTokenizer) {
  ScratchDir dir;
  const std::string prefix = dir / "bytes";
  TokenShardWriter writer(prefix, 257);
  for (int d = 0; d < 8; ++d) {
    std::vector<int32_t> doc(40, 97 + d);
    doc.push_back(256);
    writer.append_document(doc);
  }
  ShardMetadata meta;
  meta.tokenizer = "byte";
  meta.vocab_size = 257;
  meta.eos_id = 256;
  writer.finish(meta);
  const std::string config = dir / "bytes.yaml";
  std::ofstream(config) << "model: {hidden_size: 16, num_hidden_layers: 1, expand_ratio: 8, vocab_size: 257}\n"
                           "data: {task: tokens, seq_len: 16, train_data: " + prefix + "}\n"
                           "training: {device: cpu, threads: 1, micro_batch_size: 2, max_steps: 1, warmup_steps: 0,\n"
                           "           eval_interval: 0}\n"
                           "logging: {run_dir: " + (dir / "run") + "}\n";
  CommandResult r = run_hgrn({"train", "--config", config});
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_hgrn({"export", "--checkpoint", dir / "run/checkpoints/step_00000001.h5", "--format", "hf", "--out",
                dir / "hf"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(dir / "hf/config.json");
  const nlohmann::json c = nlohmann::json::parse(in);
  EXPECT_EQ(c.at("eos_token_id"), 256);
  EXPECT_EQ(c.at("bos_token_id"), 256);

  const std::string mqar = dir / "mqar";
  trained_tiny_run(mqar);
  r = run_hgrn({"export", "--checkpoint", mqar + "/run/checkpoints/step_00000002.h5", "--format", "hf", "--out",
                mqar + "/hf"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream mqar_in(mqar + "/hf/config.json");
  const nlohmann::json m = nlohmann::json::parse(mqar_in);
  EXPECT_TRUE(m.at("eos_token_id").is_null()) << m.dump();
  EXPECT_TRUE(m.at("bos_token_id").is_null()) << m.dump();
}

}  // namespace
}  // namespace hgrn
