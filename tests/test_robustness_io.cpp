// test_robustness_io.cpp: what the user's files go through when writing fails or the input is not what it claims
// to be. Disk full (a small tmpfs when the test runs as root and can mount one, else a file size limit), injected
// write, fsync and rename failures in checkpoints, exports and token shards, `export --force` and `prepare` over
// what is already there, oversized models, and a run directory whose checkpoints are all damaged. Each failure
// must end in a clear message and a clean exit, with every earlier output kept.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <sstream>

#include "config/config.h"
#include "core/checked_math.h"
#include "data/prepare.h"
#include "data/token_shards.h"
#include "export_fixtures.h"
#include "gpu_test.h"
#include "io/atomic_write.h"
#include "io/checkpoint.h"
#include "io/hdf5_export.h"
#include "io/hf_export.h"
#include "models/cost.h"
#include "train/trainer.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;
using export_testing::random_params;
using export_testing::read_file;
using export_testing::small_model_config;
using export_testing::write_file;
using testing::CommandResult;
using testing::hgrn_binary;
using testing::run_command;
using testing::run_hgrn;
using testing::ScratchDir;
using testing::shell_quote;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "expected '" << part << "' in:\n" << text;
}

// Files in dir whose name holds ".tmp-": what a failed write must not leave behind.
std::vector<std::string> temporaries_in(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) found.push_back(entry.path());
  return found;
}

// Clears injected failures whatever a test leaves behind.
class InjectedFailures : public ::testing::Test {
 protected:
  void TearDown() override { clear_write_failures(); }
};

TrainingState small_state(int64_t step, uint64_t seed) {
  const ModelConfig model = small_model_config();
  Config config;
  config.model = model;
  TrainingState state;
  state.step = step;
  for (auto& [name, value] : random_params(model, seed)) {
    state.adam_m.push_back(Tensor::zeros(value.shape(), DType::F32));
    state.adam_v.push_back(Tensor::zeros(value.shape(), DType::F32));
    state.params.emplace_back(name, value);
  }
  state.config_yaml = config_to_yaml(config);
  state.model_signature = "robustness test";
  return state;
}

// ---------------------------------------------------------------------------------------------------------------
// Injected failures: every writer reports them, names the file, and keeps what was there.

TEST_F(InjectedFailures, CheckpointRenameAndSyncFailuresKeepThePreviousCheckpoint) {
  ScratchDir scratch;
  const std::string dir = scratch / "checkpoints";
  const std::string first = save_checkpoint(dir, small_state(1, 1));
  for (WriteStep step : {WriteStep::kRename, WriteStep::kSync}) {
    inject_write_failure(step, "step_00000002.h5", step == WriteStep::kRename ? EXDEV : EIO);
    try {
      save_checkpoint(dir, small_state(2, 2));
      ADD_FAILURE() << "an injected failure was not reported";
    } catch (const Error& error) {
      expect_contains(error.what(), "step_00000002.h5");
    }
    EXPECT_FALSE(fs::exists(dir + "/step_00000002.h5"));
    EXPECT_TRUE(temporaries_in(dir).empty());
    EXPECT_EQ(load_checkpoint(first).step, 1);
  }
}

TEST_F(InjectedFailures, ExportsKeepTheEarlierExport) {
  ScratchDir scratch;
  const ModelConfig model = small_model_config();
  const std::string h5 = scratch / "weights.h5", hf = scratch / "hf";
  export_hdf5(model, random_params(model, 1), h5, DType::F32);
  export_hf(model, random_params(model, 1), hf, DType::F32);
  const std::string h5_bytes = read_file(h5), hf_weights = read_file(hf + "/model.safetensors");

  inject_write_failure(WriteStep::kSync, "weights.h5", EIO);
  EXPECT_THROW(export_hdf5(model, random_params(model, 2), h5, DType::F32, /*overwrite=*/true), Error);
  inject_write_failure(WriteStep::kWrite, "model.safetensors", ENOSPC);
  try {
    export_hf(model, random_params(model, 2), hf, DType::F32, kDefaultShardBytes, /*overwrite=*/true);
    ADD_FAILURE() << "an injected ENOSPC was not reported";
  } catch (const Error& error) {
    expect_contains(error.what(), "model.safetensors");
    expect_contains(error.what(), std::strerror(ENOSPC));
  }
  inject_write_failure(WriteStep::kRename, "hf", EIO);
  EXPECT_THROW(export_hf(model, random_params(model, 2), hf, DType::F32, kDefaultShardBytes, true), Error);

  EXPECT_EQ(read_file(h5), h5_bytes);
  EXPECT_EQ(read_file(hf + "/model.safetensors"), hf_weights);
  EXPECT_TRUE(temporaries_in(scratch.str()).empty());
}

TEST_F(InjectedFailures, TokenShardWriteAndRenameFailuresKeepTheEarlierShard) {
  ScratchDir scratch;
  const std::string prefix = scratch / "shard";
  {
    TokenShardWriter writer(prefix, 100);
    writer.append_document({1, 2, 3});
    writer.finish();
  }
  const std::string idx = read_file(shard_idx_path(prefix)), bin = read_file(shard_bin_path(prefix));
  // The rename last: a failed rename of the .idx leaves no shard at all (never a mismatched pair), so the earlier
  // one is gone then, by the commit order of token_shards.h.
  for (WriteStep step : {WriteStep::kWrite, WriteStep::kSync, WriteStep::kRename}) {
    inject_write_failure(step, step == WriteStep::kRename ? ".idx" : "shard", ENOSPC);
    try {
      TokenShardWriter writer(prefix, 100);
      writer.append_document({4, 5, 6, 7});
      writer.finish();
      ADD_FAILURE() << "an injected failure was not reported";
    } catch (const Error& error) {
      expect_contains(error.what(), prefix);
    }
    EXPECT_TRUE(temporaries_in(scratch.str()).empty());
    if (step != WriteStep::kRename) {
      EXPECT_EQ(read_file(shard_idx_path(prefix)), idx);
      EXPECT_EQ(read_file(shard_bin_path(prefix)), bin);
    } else {
      EXPECT_FALSE(fs::exists(shard_idx_path(prefix)));
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// A full disk, as the hgrn binary meets it: a clean exit with the message, never a crash in HDF5's exit handler.

// A directory where writes fail once `bytes` are used: a tmpfs of that size when this process may mount one, else
// an ordinary directory whose commands run with no file allowed past `file_limit` bytes (EFBIG for ENOSPC).
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, int64_t bytes, int64_t file_limit) : dir_(dir), file_limit_(file_limit) {
    fs::create_directories(dir_);
    const std::string options = "size=" + std::to_string(bytes);
    mounted_ = ::mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  const std::string& dir() const { return dir_; }
  bool mounted() const { return mounted_; }

  // `hgrn <args>` on this disk.
  CommandResult run(const std::vector<std::string>& args) const {
    std::string command = shell_quote(hgrn_binary());
    for (const std::string& a : args) command += " " + shell_quote(a);
    if (!mounted_)
      command = "bash -c " + shell_quote("trap '' XFSZ; ulimit -f " + std::to_string(file_limit_ / 1024) + "; exec " +
                                         command);
    return run_command(command);
  }

 private:
  std::string dir_;
  int64_t file_limit_;
  bool mounted_ = false;
};

TEST(FullDisk, CheckpointFailsCleanlyAndKeepsThePreviousOne) {
  ScratchDir scratch;
  const std::string config = scratch / "run.yaml";
  write_file(config,
             "model: {hidden_size: 64, num_hidden_layers: 2, expand_ratio: 16, vocab_size: 41}\n"
             "data: {task: mqar, seq_len: 32, mqar: {num_kv_pairs: 4}}\n"
             "training: {device: cpu, threads: 1, micro_batch_size: 4, max_steps: 1, warmup_steps: 0, "
             "eval_interval: 0}\n"
             "checkpoint: {interval: 1, keep_last: 5}\n");
  // The first checkpoint, written where there is room, tells how large one is.
  const std::string room = scratch / "room";
  ASSERT_EQ(run_hgrn({"train", "-c", config, "-s", "logging.run_dir=" + room}).status, 0);
  const std::string first = room + "/checkpoints/step_00000001.h5";
  const int64_t checkpoint_bytes = static_cast<int64_t>(fs::file_size(first));

  // A disk with room for the copied run and a quarter of a checkpoint: its step-2 checkpoint runs out of space, and
  // so does an export (a third of a checkpoint: the weights without the two AdamW moments).
  SmallDisk disk(scratch / "disk", checkpoint_bytes * 5 / 4 + (32 << 10), checkpoint_bytes / 4);
  if (!disk.mounted()) std::cout << "note: cannot mount a tmpfs here; a file size limit stands in for a full disk\n";
  const std::string run_dir = disk.dir() + "/run";
  fs::copy(room, run_dir, fs::copy_options::recursive);
  const CommandResult r = disk.run({"train", "-c", config, "-s", "logging.run_dir=" + run_dir, "-s",
                                    "training.max_steps=2"});
  EXPECT_EQ(r.status, 1) << r.err;  // -1 would be a signal (SIGSEGV at exit)
  const std::string no_room = std::strerror(disk.mounted() ? ENOSPC : EFBIG);
  expect_contains(r.err, "step_00000002.h5");
  expect_contains(r.err, no_room);
  EXPECT_EQ(load_checkpoint(run_dir + "/checkpoints/step_00000001.h5").step, 1);
  EXPECT_FALSE(fs::exists(run_dir + "/checkpoints/step_00000002.h5"));
  EXPECT_TRUE(temporaries_in(run_dir).empty());

  // Exporting onto the full disk fails the same way, for both formats.
  for (const char* format : {"hdf5", "hf"}) {
    const std::string out = run_dir + "/export-" + format;
    const CommandResult e = disk.run({"export", "--checkpoint", first, "--format", format, "--out", out});
    EXPECT_EQ(e.status, 1) << format << ": " << e.err;
    expect_contains(e.err, out);
    expect_contains(e.err, no_room);
    EXPECT_FALSE(fs::exists(out)) << format;
  }
  EXPECT_TRUE(temporaries_in(run_dir).empty());
}

// ---------------------------------------------------------------------------------------------------------------
// export --force replaces an earlier export of the same format and nothing else.

class ExportForce : public ::testing::Test {
 protected:
  void SetUp() override { checkpoint_ = save_checkpoint(scratch_ / "checkpoints", small_state(3, 7)); }

  CommandResult export_to(const std::string& format, const std::string& out) {
    return run_hgrn({"export", "--checkpoint", checkpoint_, "--format", format, "--out", out, "--force"});
  }

  // The refusal names the path, says nothing was deleted, and the path still holds exactly what it held.
  void expect_refused(const std::string& format, const std::string& out) {
    const CommandResult r = export_to(format, out);
    EXPECT_EQ(r.status, 1) << format << " over " << out << ": " << r.err;
    expect_contains(r.err, "refusing to replace " + out);
    expect_contains(r.err, "nothing was deleted");
  }

  ScratchDir scratch_;
  std::string checkpoint_;
};

TEST_F(ExportForce, RefusesAnythingButAnEarlierExportOfTheSameFormat) {
  const std::string plain = scratch_ / "notes.txt";
  write_file(plain, "my notes");
  expect_refused("hdf5", plain);
  expect_refused("hf", plain);
  EXPECT_EQ(read_file(plain), "my notes");

  const std::string unrelated = scratch_ / "project";
  fs::create_directories(unrelated);
  write_file(unrelated + "/main.c", "int main() {}");
  expect_refused("hdf5", unrelated);
  expect_refused("hf", unrelated);
  EXPECT_EQ(read_file(unrelated + "/main.c"), "int main() {}");

  // An export of the other format is not replaced either, and each format replaces its own.
  const std::string h5 = scratch_ / "weights.h5", hf = scratch_ / "hf";
  ASSERT_EQ(export_to("hdf5", h5).status, 0);
  ASSERT_EQ(export_to("hf", hf).status, 0);
  expect_refused("hf", h5);
  expect_refused("hdf5", hf);
  EXPECT_TRUE(fs::is_regular_file(hf + "/config.json"));
  EXPECT_EQ(export_to("hdf5", h5).status, 0);
  EXPECT_EQ(export_to("hf", hf).status, 0);

  // An HDF5 file that is not an hgrn export (a checkpoint) is not one either.
  expect_refused("hdf5", checkpoint_);
  EXPECT_EQ(load_checkpoint(checkpoint_).step, 3);
}

// ---------------------------------------------------------------------------------------------------------------
// Model sizes: refused before anything is allocated, never wrapped around.

TEST(ModelSize, CheckedArithmeticRefusesOverflow) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_THROW(checked_mul(int64_t{1} << 32, int64_t{1} << 31, "x"), Error);
  EXPECT_THROW(checked_add(INT64_MAX, 1, "x"), Error);
  EXPECT_THROW(shape_numel({int64_t{1} << 32, int64_t{1} << 32}), Error);
  // A model config built in code skips validation: its cost still does not wrap around.
  ModelConfig huge = small_model_config();
  huge.hidden_size = 1'000'000'000;
  huge.intermediate_size = std::nullopt;
  EXPECT_THROW(model_cost(huge, 32), Error);
}

// A 4 GB address-space limit for the commands below. One BLAS and OpenMP thread: on a many-core host their thread
// pools alone (stacks and buffers per core) would not fit, and the tests are about the model's size.
const std::string kBoundedMemory = "ulimit -v 4000000; export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1; exec ";

TEST(ModelSize, InfoRefusesHugeModelsQuicklyNamingTheKey) {
  for (const std::string& setting : {"model.num_hidden_layers=100000000", "model.hidden_size=1000000000",
                                     "model.vocab_size=100000000000", "model.hidden_ratio=1000000000000"}) {
    // Bounded memory: a run that started to build such a model would fail differently under this limit.
    const std::string command = "bash -c " + shell_quote(kBoundedMemory + shell_quote(hgrn_binary()) +
                                                         " info -c configs/mqar-tiny.yaml -s " + setting);
    const CommandResult r = run_command("cd " + shell_quote(HGRN_SOURCE_DIR) + " && " + command);
    EXPECT_EQ(r.status, 2) << setting << ": " << r.err;
    expect_contains(r.err, setting.substr(0, setting.find('=')));
  }
}

TEST(ModelSize, TrainRefusesAModelLargerThanTheHostWithTheEstimate) {
  ScratchDir scratch;
  const std::string command =
      "bash -c " + shell_quote(kBoundedMemory + shell_quote(hgrn_binary()) +
                               " train -c configs/mqar-tiny.yaml -s training.device=cpu -s model.hidden_size=65536 "
                               "-s model.num_hidden_layers=1024 -s model.expand_ratio=64 -s logging.run_dir=" +
                               shell_quote(scratch / "run"));
  const CommandResult r = run_command("cd " + shell_quote(HGRN_SOURCE_DIR) + " && " + command);
  EXPECT_EQ(r.status, 2) << r.err;
  expect_contains(r.err, "estimated");
  expect_contains(r.err, "this host has");
  EXPECT_FALSE(fs::exists(scratch / "run"));
}

TEST(ModelSize, TrainRefusesAModelLargerThanTheGpuWithTheEstimate) {
  HGRN_SKIP_WITHOUT_GPU();
  ScratchDir scratch;
  // About 10^11 parameters: no GPU holds their weights and AdamW moments (the host is not asked: it trains on the GPU).
  const CommandResult r = run_command(
      "cd " + shell_quote(HGRN_SOURCE_DIR) + " && " + shell_quote(hgrn_binary()) +
      " train -c configs/mqar-tiny.yaml -s training.device=cuda -s training.precision=bf16 -s model.hidden_size=16384"
      " -s model.num_hidden_layers=512 -s model.expand_ratio=128 -s logging.run_dir=" + shell_quote(scratch / "run"));
  EXPECT_EQ(r.status, 2) << r.err;
  expect_contains(r.err, "estimated");
  expect_contains(r.err, "this GPU has");
  EXPECT_FALSE(fs::exists(scratch / "run"));
}

// ---------------------------------------------------------------------------------------------------------------
// prepare: input that is not what --corpus says, impossible options, leftovers and existing shards.

PrepareOptions wikitext_options(const std::string& input, const std::string& prefix) {
  PrepareOptions options;
  options.corpus = "wikitext";
  options.inputs = {input};
  options.output_prefix = prefix;
  options.threads = 1;
  return options;
}

std::string small_wikitext() {
  std::string text;
  for (int article = 0; article < 20; ++article)
    text += " = Article " + std::to_string(article) + " = \n\n Some text of article " + std::to_string(article) +
            " .\n\n";
  return text;
}

TEST(PrepareInput, RefusesJsonLinesAsWikiText) {
  ScratchDir scratch;
  const std::string input = scratch / "00.jsonl";
  write_file(input, "{\"text\": \"a document\", \"meta\": {\"pile_set_name\": \"Pile-CC\"}}\n");
  try {
    prepare_corpus(wikitext_options(input, scratch / "out"));
    FAIL() << "JSON lines were accepted as WikiText";
  } catch (const Error& error) {
    expect_contains(error.what(), input);
    expect_contains(error.what(), "--corpus pile");
  }
  EXPECT_FALSE(fs::exists(shard_idx_path(scratch / "out_train")));
}

TEST(PrepareInput, RefusesAnEmptyTrainingSplitAndTooManyThreads) {
  ScratchDir scratch;
  const std::string input = scratch / "wiki.txt";
  write_file(input, small_wikitext());
  PrepareOptions options = wikitext_options(input, scratch / "out");
  options.valid_fraction = 0.9999;
  try {
    prepare_corpus(options);
    FAIL() << "an empty training split was written";
  } catch (const Error& error) {
    expect_contains(error.what(), "--valid-fraction");
  }
  EXPECT_FALSE(fs::exists(shard_idx_path(scratch / "out_train")));
  EXPECT_FALSE(fs::exists(shard_idx_path(scratch / "out_valid")));

  const CommandResult r = run_hgrn({"prepare", "--corpus", "wikitext", "--input", input, "--output",
                                    scratch / "many", "--threads", "100000"});
  EXPECT_EQ(r.status, 2) << r.err;
  expect_contains(r.err, "--threads");
  options.valid_fraction = 0;
  options.threads = 100000;
  EXPECT_THROW(prepare_corpus(options), Error);
}

TEST(PrepareOutput, RemovesTemporariesOfKilledRunsAndRefusesToOverwriteWithoutForce) {
  ScratchDir scratch;
  const std::string input = scratch / "wiki.txt", prefix = scratch / "out";
  write_file(input, small_wikitext());
  // A process id that is certainly not running: a child that has exited and been reaped.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string dead = shard_bin_path(prefix + "_train") + ".tmp-" + std::to_string(child);
  const std::string alive = shard_bin_path(prefix + "_train") + ".tmp-" + std::to_string(::getppid());
  write_file(dead, "left by a killed prepare");
  write_file(alive, "a running prepare's");

  PrepareOptions options = wikitext_options(input, prefix);
  std::ostringstream progress;
  options.progress = &progress;
  const PrepareResult first = prepare_corpus(options);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive));
  expect_contains(progress.str(), dead);
  fs::remove(alive);

  const std::string idx = read_file(shard_idx_path(first.train_prefix));
  try {
    prepare_corpus(options);
    FAIL() << "an existing shard was overwritten without --force";
  } catch (const Error& error) {
    expect_contains(error.what(), "refusing to overwrite " + shard_bin_path(first.train_prefix));
    expect_contains(error.what(), "--force");
  }
  EXPECT_EQ(read_file(shard_idx_path(first.train_prefix)), idx);
  options.force = true;
  EXPECT_EQ(prepare_corpus(options).train.documents, first.train.documents);

  // --force replaces a shard, not a file that happens to have a shard's name.
  const std::string other = scratch / "other";
  write_file(shard_bin_path(other + "_train"), "not a shard");
  options.output_prefix = other;
  try {
    prepare_corpus(options);
    FAIL() << "--force replaced a file that is not a shard";
  } catch (const Error& error) {
    expect_contains(error.what(), shard_bin_path(other + "_train"));
  }
  EXPECT_EQ(read_file(shard_bin_path(other + "_train")), "not a shard");
}

// ---------------------------------------------------------------------------------------------------------------
// resume: auto with nothing but damaged checkpoints refuses instead of starting over.

TEST(ResumeAuto, RefusesWhenEveryCheckpointIsDamaged) {
  ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  const Config config = parse_config(R"(
model: {hidden_size: 16, num_hidden_layers: 1, expand_ratio: 8, vocab_size: 41, intermediate_size: 32}
data: {task: mqar, seq_len: 32, mqar: {num_kv_pairs: 4}}
training: {device: cpu, micro_batch_size: 2, max_steps: 4, warmup_steps: 0, eval_interval: 0}
checkpoint: {interval: 2, keep_last: 5, resume: auto}
)",
                                     "resume.yaml", {"logging.run_dir=" + run_dir});
  std::ostringstream log;
  train(config, log);
  std::vector<std::string> damaged;
  for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints")) {
    fs::resize_file(entry.path(), fs::file_size(entry.path()) / 2);
    damaged.push_back(entry.path().string());
  }
  ASSERT_EQ(damaged.size(), 2u);
  try {
    train(config, log);
    FAIL() << "a run over damaged checkpoints started from step 0";
  } catch (const Error& error) {
    for (const std::string& path : damaged) expect_contains(error.what(), path);
  }
  for (const std::string& path : damaged) EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(std::distance(fs::directory_iterator(run_dir + "/checkpoints"), fs::directory_iterator()), 2);
}

}  // namespace
}  // namespace hgrn
