// test_checkpoint.cpp: HDF5 checkpoints: bit-exact round trips, atomic writes (including a writer killed with
// SIGKILL mid-save), refusal of truncated / corrupted / incomplete files with messages that say what is wrong,
// finding the newest valid checkpoint, pruning, and the resume compatibility check. Also the CRC-32 it relies on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/crc32.h"
#include "io/hdf5_check.h"
#include "scratch_dir.h"
#include "test_files.h"

namespace hgrn {
namespace {

namespace fs = std::filesystem;

using testing::ScratchDir;

Tensor random_tensor(Rng& rng, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_item(i, rng.normal());
  return t;
}

// A small model-like state. Parameter names are deliberately not in alphabetical order, so a reader that listed
// them by name instead of by model order would be caught.
TrainingState make_state(int64_t step, uint64_t seed = 1) {
  Rng rng(seed);
  TrainingState state;
  state.step = step;
  state.tokens_seen = step * 4096;
  state.data_cursor = static_cast<uint64_t>(step) * 32 + 5;
  state.rng = RngState{0xFEDCBA9876543210ull, 0x0123456789ABCDEFull + static_cast<uint64_t>(step)};
  const std::vector<std::pair<std::string, Shape>> specs = {
      {"model.embeddings.weight", {16, 8}},
      {"model.layers.10.attn.q_proj.weight", {8, 8}},
      {"model.layers.2.attn.g_norm.weight", {8}},
      {"lm_head.weight", {16, 8}},
  };
  for (const auto& [name, shape] : specs) {
    state.params.emplace_back(name, random_tensor(rng, shape, DType::F32));
    state.adam_m.push_back(random_tensor(rng, shape, DType::F32));
    state.adam_v.push_back(random_tensor(rng, shape, DType::F32));
  }
  state.adam_step = step;
  state.config_yaml = "model:\n  hidden_size: 8\n  num_hidden_layers: 2\ntraining:\n  lr: 0.003  # λ, UTF-8\n";
  state.model_signature = "hgrn2 L=2 D=8 K=4 V=4 I=32 vocab=16 lb=1 tied=0 fp32";
  state.world_size = 1;
  state.hgrn_version = "0.1.0";
  state.git_commit = "0123456789ab";
  return state;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

void expect_states_identical(const TrainingState& expected, const TrainingState& actual) {
  EXPECT_EQ(actual.step, expected.step);
  EXPECT_EQ(actual.tokens_seen, expected.tokens_seen);
  EXPECT_EQ(actual.data_cursor, expected.data_cursor);
  EXPECT_EQ(actual.rng, expected.rng);
  EXPECT_EQ(actual.adam_step, expected.adam_step);
  EXPECT_EQ(actual.config_yaml, expected.config_yaml);
  EXPECT_EQ(actual.model_signature, expected.model_signature);
  EXPECT_EQ(actual.world_size, expected.world_size);
  EXPECT_EQ(actual.hgrn_version, expected.hgrn_version);
  EXPECT_EQ(actual.git_commit, expected.git_commit);
  ASSERT_EQ(actual.params.size(), expected.params.size());
  ASSERT_EQ(actual.adam_m.size(), expected.params.size());
  ASSERT_EQ(actual.adam_v.size(), expected.params.size());
  for (size_t i = 0; i < expected.params.size(); ++i) {
    EXPECT_EQ(actual.params[i].first, expected.params[i].first);
    EXPECT_TRUE(same_bits(actual.params[i].second, expected.params[i].second)) << expected.params[i].first;
    EXPECT_TRUE(same_bits(actual.adam_m[i], expected.adam_m[i])) << "adam m of " << expected.params[i].first;
    EXPECT_TRUE(same_bits(actual.adam_v[i], expected.adam_v[i])) << "adam v of " << expected.params[i].first;
  }
  ASSERT_EQ(actual.fp8_scaling.size(), expected.fp8_scaling.size());
  for (size_t i = 0; i < expected.fp8_scaling.size(); ++i) {
    EXPECT_EQ(actual.fp8_scaling[i].first, expected.fp8_scaling[i].first);
    EXPECT_TRUE(same_bits(actual.fp8_scaling[i].second, expected.fp8_scaling[i].second))
        << expected.fp8_scaling[i].first;
  }
}

using testing::read_bytes;
using testing::write_bytes;

std::set<std::string> file_names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

// The message of the hgrn::Error that load_checkpoint throws for `path` (fails the test if it does not throw).
std::string load_error(const std::string& path) {
  try {
    load_checkpoint(path);
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "load_checkpoint(" << path << ") accepted a bad file";
  return "";
}

// Edits a saved checkpoint with HDF5 directly, the way a damaged or half-written file might look.
void delete_hdf5_object(const std::string& path, const char* group, const char* attribute_or_link, bool attribute) {
  hdf5::prepare_library();
  hdf5::Handle file(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "test: cannot open ", path),
                    H5Fclose, path);
  hdf5::Handle owner(H5_CHECK(H5Oopen(file.id(), group, H5P_DEFAULT), "test: cannot open ", group), H5Oclose,
                     group);
  if (attribute)
    H5_CHECK(H5Adelete(owner.id(), attribute_or_link), "test: cannot delete attribute ", attribute_or_link);
  else
    H5_CHECK(H5Ldelete(owner.id(), attribute_or_link, H5P_DEFAULT), "test: cannot delete ", attribute_or_link);
  owner.close();
  file.close();
}

// Flips one byte inside the stored data of `tensor` (found by searching the file for its bytes).
void flip_byte_in_tensor_data(const std::string& path, const Tensor& tensor) {
  std::string bytes = read_bytes(path);
  const std::string pattern(static_cast<const char*>(tensor.raw_data()), tensor.nbytes());
  const size_t at = bytes.find(pattern);
  ASSERT_NE(at, std::string::npos) << "tensor bytes not found in " << path;
  ASSERT_EQ(bytes.find(pattern, at + 1), std::string::npos) << "tensor bytes are not unique in " << path;
  bytes[at + pattern.size() / 2] ^= 0x10;
  write_bytes(path, bytes);
}

TEST(Crc32, MatchesZlibKnownAnswers) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);  // the standard check value of CRC-32/ISO-HDLC (zlib)
  EXPECT_EQ(crc32(nullptr, 0), 0u);
  EXPECT_EQ(crc32("a", 1), 0xE8B7BE43u);
  const std::string text = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32(text.data(), text.size()), 0x414FA339u);
  // Continuing across buffers gives the same value as one call.
  EXPECT_EQ(crc32(text.data() + 10, text.size() - 10, crc32(text.data(), 10)), 0x414FA339u);
}

TEST(CheckpointNames, FinalAndTemporaryNamesAreDistinct) {
  EXPECT_EQ(checkpoint_file_name(42), "step_00000042.h5");
  EXPECT_EQ(checkpoint_file_name(123456789), "step_123456789.h5");
  EXPECT_EQ(checkpoint_step_from_file_name("step_00000042.h5"), 42);
  EXPECT_EQ(checkpoint_step_from_file_name("step_123456789.h5"), 123456789);
  EXPECT_EQ(checkpoint_step_from_file_name("step_000000042.h5"), std::nullopt);  // not the canonical spelling
  EXPECT_EQ(checkpoint_step_from_file_name("step_42.h5"), std::nullopt);
  EXPECT_EQ(checkpoint_step_from_file_name("step_0000004x.h5"), std::nullopt);
  EXPECT_EQ(checkpoint_step_from_file_name("metrics.jsonl"), std::nullopt);

  const std::string temp = checkpoint_temp_file_name(7);
  EXPECT_EQ(temp.rfind("step_00000007.h5.tmp-", 0), 0u) << temp;
  EXPECT_TRUE(is_checkpoint_temp_file_name(temp));
  EXPECT_TRUE(is_checkpoint_temp_file_name("step_00000030.h5.tmp-99999"));
  EXPECT_EQ(checkpoint_step_from_file_name(temp), std::nullopt);  // a temp file is never taken for a checkpoint
  EXPECT_FALSE(is_checkpoint_temp_file_name("step_00000030.h5"));
  EXPECT_FALSE(is_checkpoint_temp_file_name("notes.h5.tmp-1"));
}

TEST(Checkpoint, RoundTripIsBitExact) {
  ScratchDir dir;
  TrainingState state = make_state(120);
  // Values whose bits a careless conversion would change: a NaN with a payload, -0, a subnormal, the extremes.
  float* embedding = state.params[0].second.data<float>();
  const uint32_t nan_with_payload = 0x7FC12345u;
  std::memcpy(&embedding[0], &nan_with_payload, sizeof(float));
  embedding[1] = -0.0f;
  embedding[2] = std::numeric_limits<float>::denorm_min();
  embedding[3] = std::numeric_limits<float>::max();
  embedding[4] = -std::numeric_limits<float>::infinity();
  state.data_cursor = std::numeric_limits<uint64_t>::max();
  state.rng = RngState{std::numeric_limits<uint64_t>::max(), std::numeric_limits<uint64_t>::max() - 1};
  state.world_size = 8;
  state.git_commit = "";  // a build outside git has none

  const std::string path = save_checkpoint(dir.str(), state);
  EXPECT_EQ(path, dir / "step_00000120.h5");
  expect_states_identical(state, load_checkpoint(path));
}

// The FP8 scaling arrays (training.precision fp8) come back in order and bit for bit; a checkpoint without them
// loads with none.
TEST(Checkpoint, RoundTripKeepsTheFp8ScalingArrays) {
  ScratchDir dir;
  Rng rng(9);
  TrainingState state = make_state(3);
  state.fp8_scaling.emplace_back("slot_params", Tensor::from_vector<int64_t>({4, 0, 2}, {3}));
  state.fp8_scaling.emplace_back("forward_history", random_tensor(rng, {6 * 16}, DType::F32));
  state.fp8_scaling.emplace_back("forward_positions", Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 15}, {6}));
  state.fp8_scaling.emplace_back("gradient_scales", random_tensor(rng, {3}, DType::F32));
  expect_states_identical(state, load_checkpoint(save_checkpoint(dir.str(), state)));
  state.fp8_scaling.clear();
  EXPECT_TRUE(load_checkpoint(save_checkpoint(dir.str(), state)).fp8_scaling.empty());
}

TEST(Checkpoint, RoundTripKeepsDtypesAndUnusualShapes) {
  ScratchDir dir;
  Rng rng(3);
  TrainingState state = make_state(1);
  state.params.clear();
  state.adam_m.clear();
  state.adam_v.clear();
  const std::vector<std::tuple<std::string, Shape, DType>> specs = {
      {"fp64.weight", {3, 5}, DType::F64},
      {"scalar", {}, DType::F32},
      {"empty.rows", {0, 4}, DType::F32},
      {"three.d", {2, 3, 4}, DType::F64},
      {"bf16.weight", {4, 2}, DType::BF16},
      {"int64.counts", {5}, DType::I64},
      {"int32.ids", {3}, DType::I32},
  };
  for (const auto& [name, shape, dtype] : specs) {
    state.params.emplace_back(name, random_tensor(rng, shape, dtype));
    state.adam_m.push_back(random_tensor(rng, shape, dtype));
    state.adam_v.push_back(random_tensor(rng, shape, dtype));
  }
  state.config_yaml = "";
  expect_states_identical(state, load_checkpoint(save_checkpoint(dir.str(), state)));
}

TEST(Checkpoint, SaveLeavesOnlyTheFinalFileAndReplacesTheSameStep) {
  ScratchDir dir;
  save_checkpoint(dir.str(), make_state(5, 1));
  EXPECT_EQ(file_names_in(dir.str()), (std::set<std::string>{"step_00000005.h5"}));
  // Saving the same step again (a resumed run reaching it again) replaces the file.
  TrainingState second = make_state(5, 2);
  const std::string path = save_checkpoint(dir.str(), second);
  EXPECT_EQ(file_names_in(dir.str()), (std::set<std::string>{"step_00000005.h5"}));
  expect_states_identical(second, load_checkpoint(path));
}

TEST(Checkpoint, SaveRejectsAnInconsistentStateAndWritesNothing) {
  ScratchDir dir;
  TrainingState missing_moment = make_state(1);
  missing_moment.adam_v.pop_back();
  EXPECT_THROW(save_checkpoint(dir.str(), missing_moment), Error);

  TrainingState wrong_shape = make_state(1);
  wrong_shape.adam_m[1] = Tensor::zeros({3}, DType::F32);
  EXPECT_THROW(save_checkpoint(dir.str(), wrong_shape), Error);

  TrainingState slash_in_name = make_state(1);
  slash_in_name.params[0].first = "model/embeddings";
  EXPECT_THROW(save_checkpoint(dir.str(), slash_in_name), Error);

  TrainingState duplicate = make_state(1);
  duplicate.params[1].first = duplicate.params[0].first;
  EXPECT_THROW(save_checkpoint(dir.str(), duplicate), Error);

  EXPECT_TRUE(file_names_in(dir.str()).empty());
}

TEST(Checkpoint, InterruptedWriteIsIgnoredByFindLatestAndRemovedByPrune) {
  ScratchDir dir;
  save_checkpoint(dir.str(), make_state(10));
  const std::string step20 = save_checkpoint(dir.str(), make_state(20));
  // What a writer killed during step 30's save leaves: a partial file under the temporary name.
  const std::string bytes = read_bytes(step20);
  const fs::path leftover = dir / "step_00000030.h5.tmp-99999";
  write_bytes(leftover, bytes.substr(0, bytes.size() / 2));

  std::ostringstream warnings;
  EXPECT_EQ(find_latest_valid_checkpoint(dir.str(), warnings), step20);
  EXPECT_EQ(warnings.str(), "");  // not even looked at: it does not have a checkpoint's name

  prune_checkpoints(dir.str(), 5, 0);
  EXPECT_EQ(file_names_in(dir.str()), (std::set<std::string>{"step_00000010.h5", "step_00000020.h5"}));
}

// A writer killed with SIGKILL at random moments during a stream of saves: every file that has a checkpoint's final
// name must be complete and verify, because the final name only ever appears through rename() of a synced file.
TEST(Checkpoint, WriterKilledAtAnyMomentNeverLeavesAnIncompleteFinalFile) {
  ScratchDir dir;
  // Big enough (about 3 MiB a file) that a save takes a while and the kills land inside writes.
  TrainingState state = make_state(0);
  Rng rng(11);
  state.params.emplace_back("big.weight", random_tensor(rng, {512, 512}, DType::F32));
  state.adam_m.push_back(random_tensor(rng, {512, 512}, DType::F32));
  state.adam_v.push_back(random_tensor(rng, {512, 512}, DType::F32));

  Rng delays(5);
  int64_t next_step = 1;
  // At least 8 rounds, and more (with longer delays) until some save has finished: on a loaded machine a save may
  // take longer than the first rounds' delays, and a test where every kill lands before the first rename proves
  // nothing about complete files.
  auto finished_saves = [&] {
    int64_t n = 0;
    for (const auto& entry : fs::directory_iterator(dir.str()))
      n += checkpoint_step_from_file_name(entry.path().filename().string()) ? 1 : 0;
    return n;
  };
  for (int round = 0; round < 8 || (finished_saves() == 0 && round < 40); ++round) {
    const int64_t first_step = next_step;
    next_step += 1000;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) {
      // The child saves until it is killed (bounded, in case the parent is gone), and never returns into gtest.
      try {
        for (int64_t step = first_step; step < first_step + 1000; ++step) {
          state.step = step;
          save_checkpoint(dir.str(), state);
        }
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    ::usleep(static_cast<useconds_t>(2000 + delays.below(40000) + (round >= 8 ? 50000 * (round - 7) : 0)));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << "the writer failed before it was killed";
  }

  int64_t final_files = 0;
  for (const auto& entry : fs::directory_iterator(dir.str())) {
    const std::string name = entry.path().filename().string();
    if (!checkpoint_step_from_file_name(name)) continue;
    ++final_files;
    EXPECT_NO_THROW(load_checkpoint(entry.path().string())) << name;
  }
  EXPECT_GT(final_files, 0) << "no save finished in any round; the test did not exercise anything";

  std::ostringstream warnings;
  EXPECT_TRUE(find_latest_valid_checkpoint(dir.str(), warnings).has_value());
  EXPECT_EQ(warnings.str(), "");
  prune_checkpoints(dir.str(), 1000000, 0);
  for (const auto& entry : fs::directory_iterator(dir.str()))
    EXPECT_FALSE(is_checkpoint_temp_file_name(entry.path().filename().string())) << entry.path();
}

TEST(Checkpoint, TruncatedFileIsRefusedNamingThePath) {
  ScratchDir dir;
  const std::string original = save_checkpoint(dir.str(), make_state(10));
  const fs::path truncated = dir.path() / "copy" / "step_00000010.h5";
  fs::create_directories(truncated.parent_path());
  fs::copy_file(original, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);

  ::testing::internal::CaptureStderr();
  const std::string message = load_error(truncated.string());
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find(truncated.string()), std::string::npos) << message;
  EXPECT_TRUE(message.find("truncated") != std::string::npos || message.find("not a valid HDF5") != std::string::npos)
      << message;
  EXPECT_EQ(printed, "") << "HDF5 printed its own error stack";

  fs::resize_file(truncated, 0);
  EXPECT_NE(load_error(truncated.string()).find("truncated"), std::string::npos);
}

TEST(Checkpoint, NonHdf5AndMissingFilesAreRefused) {
  ScratchDir dir;
  const fs::path text = dir / "step_00000001.h5";
  write_bytes(text, "model:\n  hidden_size: 64\n");
  const std::string message = load_error(text.string());
  EXPECT_NE(message.find(text.string()), std::string::npos) << message;
  EXPECT_NE(message.find("not a valid HDF5"), std::string::npos) << message;

  const std::string missing = dir / "step_00000002.h5";
  const std::string missing_message = load_error(missing);
  EXPECT_NE(missing_message.find(missing), std::string::npos) << missing_message;
  EXPECT_NE(missing_message.find("no such file"), std::string::npos) << missing_message;
}

TEST(Checkpoint, FlippedByteInParameterDataFailsItsChecksum) {
  ScratchDir dir;
  TrainingState state = make_state(10);
  const std::string path = save_checkpoint(dir.str(), state);
  flip_byte_in_tensor_data(path, state.params[1].second);
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;
  EXPECT_NE(message.find("/params/model.layers.10.attn.q_proj.weight"), std::string::npos) << message;
}

TEST(Checkpoint, FlippedByteInOptimizerStateFailsItsChecksum) {
  ScratchDir dir;
  TrainingState state = make_state(10);
  const std::string path = save_checkpoint(dir.str(), state);
  flip_byte_in_tensor_data(path, state.adam_v[3]);
  const std::string message = load_error(path);
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;
  EXPECT_NE(message.find("/adam/v/lm_head.weight"), std::string::npos) << message;
}

TEST(Checkpoint, FlippedByteInConfigTextFailsItsChecksum) {
  ScratchDir dir;
  TrainingState state = make_state(10);
  const std::string path = save_checkpoint(dir.str(), state);
  std::string bytes = read_bytes(path);
  const size_t at = bytes.find("num_hidden_layers: 2");
  ASSERT_NE(at, std::string::npos);
  bytes[at + std::strlen("num_hidden_layers: ")] = '3';
  write_bytes(path, bytes);
  const std::string message = load_error(path);
  EXPECT_NE(message.find("checksum"), std::string::npos) << message;
  EXPECT_NE(message.find("/config"), std::string::npos) << message;
}

TEST(Checkpoint, FileWithoutTheCompleteMarkerIsRefused) {
  ScratchDir dir;
  const std::string path = save_checkpoint(dir.str(), make_state(10));
  delete_hdf5_object(path, "/", "complete", true);
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("incomplete"), std::string::npos) << message;
  EXPECT_NE(message.find("'complete'"), std::string::npos) << message;
}

TEST(Checkpoint, MissingObjectsAreNamed) {
  ScratchDir dir;
  const std::string path = save_checkpoint(dir.str(), make_state(10));
  delete_hdf5_object(path, "/adam/v", "model.layers.2.attn.g_norm.weight", false);
  std::string message = load_error(path);
  EXPECT_NE(message.find("missing object /adam/v/model.layers.2.attn.g_norm.weight"), std::string::npos) << message;

  const std::string second = save_checkpoint(dir.str(), make_state(20));
  delete_hdf5_object(second, "/meta", "rng_counter", true);
  message = load_error(second);
  EXPECT_NE(message.find("missing object /meta attribute rng_counter"), std::string::npos) << message;

  const std::string third = save_checkpoint(dir.str(), make_state(30));
  delete_hdf5_object(third, "/", "config", false);
  message = load_error(third);
  EXPECT_NE(message.find("missing object /config"), std::string::npos) << message;

  const std::string fourth = save_checkpoint(dir.str(), make_state(40));
  delete_hdf5_object(fourth, "/params", "lm_head.weight", false);
  message = load_error(fourth);
  EXPECT_NE(message.find("/params"), std::string::npos) << message;
  EXPECT_NE(message.find("param_count"), std::string::npos) << message;
}

TEST(Checkpoint, FindLatestValidSkipsACorruptNewestWithAWarning) {
  ScratchDir dir;
  std::ostringstream warnings;
  EXPECT_EQ(find_latest_valid_checkpoint(dir.str(), warnings), std::nullopt);
  EXPECT_EQ(find_latest_valid_checkpoint(dir / "does_not_exist", warnings), std::nullopt);

  save_checkpoint(dir.str(), make_state(10));
  const std::string step20 = save_checkpoint(dir.str(), make_state(20));
  TrainingState newest = make_state(30);
  const std::string step30 = save_checkpoint(dir.str(), newest);
  write_bytes(dir / "notes.txt", "not a checkpoint");
  flip_byte_in_tensor_data(step30, newest.params[0].second);

  EXPECT_EQ(find_latest_valid_checkpoint(dir.str(), warnings), step20);
  const std::string text = warnings.str();
  EXPECT_NE(text.find("warning"), std::string::npos) << text;
  EXPECT_NE(text.find(step30), std::string::npos) << text;
  EXPECT_NE(text.find("checksum"), std::string::npos) << text;
  EXPECT_EQ(text.find(step20), std::string::npos) << "the valid checkpoint was warned about: " << text;
}

TEST(Checkpoint, FindLatestValidReturnsNothingWhenEveryCheckpointIsBad) {
  ScratchDir dir;
  const std::string path = save_checkpoint(dir.str(), make_state(10));
  fs::resize_file(path, fs::file_size(path) / 3);
  std::ostringstream warnings;
  EXPECT_EQ(find_latest_valid_checkpoint(dir.str(), warnings), std::nullopt);
  EXPECT_NE(warnings.str().find(path), std::string::npos) << warnings.str();
}

TEST(Checkpoint, PruneKeepsTheNewestAndEveryNth) {
  ScratchDir dir;
  for (int64_t step = 10; step <= 100; step += 10) save_checkpoint(dir.str(), make_state(step));
  write_bytes(dir / "metrics.jsonl", "{}\n");
  write_bytes(dir / "step_000000x1.h5", "a look-alike that is not a checkpoint");

  prune_checkpoints(dir.str(), 2, 30);
  EXPECT_EQ(file_names_in(dir.str()),
            (std::set<std::string>{"step_00000030.h5", "step_00000060.h5", "step_00000090.h5", "step_00000100.h5",
                                   "metrics.jsonl", "step_000000x1.h5"}));

  prune_checkpoints(dir.str(), 1, 0);
  EXPECT_EQ(file_names_in(dir.str()),
            (std::set<std::string>{"step_00000100.h5", "metrics.jsonl", "step_000000x1.h5"}));

  EXPECT_THROW(prune_checkpoints(dir.str(), 0, 0), Error);
}

class CheckpointCompatibility : public ::testing::Test {
 protected:
  TrainingState loaded = make_state(10);
  std::string signature = loaded.model_signature;
  std::vector<std::pair<std::string, Shape>> shapes;
  const std::string path = "runs/demo/checkpoints/step_00000010.h5";

  void SetUp() override {
    for (const auto& [name, tensor] : loaded.params) shapes.emplace_back(name, tensor.shape());
  }

  std::string error_message() {
    try {
      check_checkpoint_compatible(loaded, signature, 1, shapes, path);
    } catch (const Error& error) {
      return error.what();
    }
    ADD_FAILURE() << "an incompatible checkpoint was accepted";
    return "";
  }

  static void expect_contains(const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
  }
};

TEST_F(CheckpointCompatibility, AcceptsAMatchingRun) {
  EXPECT_NO_THROW(check_checkpoint_compatible(loaded, signature, 1, shapes, path));
}

TEST_F(CheckpointCompatibility, NamesADifferentModelSignature) {
  signature = "hgrn2 L=4 D=8 K=4 V=4 I=32 vocab=16 lb=1 tied=0 fp32";
  const std::string message = error_message();
  expect_contains(message, path);
  expect_contains(message, "model signature");
  expect_contains(message, loaded.model_signature);
  expect_contains(message, signature);
  expect_contains(message, "checkpoint.resume: never");
}

TEST_F(CheckpointCompatibility, NamesADifferentWorldSize) {
  loaded.world_size = 4;
  const std::string message = error_message();
  expect_contains(message, "world size 4");
  expect_contains(message, "world size 1");
  expect_contains(message, "checkpoint.resume: never");
}

TEST_F(CheckpointCompatibility, NamesADifferentParameterCount) {
  shapes.pop_back();
  const std::string message = error_message();
  expect_contains(message, "4 parameters");
  expect_contains(message, "3");
}

TEST_F(CheckpointCompatibility, NamesADifferentParameterName) {
  shapes[2].first = "model.layers.2.attn.o_proj.weight";
  const std::string message = error_message();
  expect_contains(message, "parameter name");
  expect_contains(message, "model.layers.2.attn.g_norm.weight");
  expect_contains(message, "model.layers.2.attn.o_proj.weight");
}

TEST_F(CheckpointCompatibility, NamesADifferentParameterShape) {
  shapes[1].second = {8, 16};
  const std::string message = error_message();
  expect_contains(message, "parameter shape");
  expect_contains(message, "model.layers.10.attn.q_proj.weight");
  expect_contains(message, "[8, 8]");
  expect_contains(message, "[8, 16]");
  expect_contains(message, "checkpoint.resume: never");
}

}  // namespace
}  // namespace hgrn
