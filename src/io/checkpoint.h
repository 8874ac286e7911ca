// checkpoint.h: training checkpoints as HDF5 files, written atomically and verified in full on load, plus finding
// the newest usable checkpoint, pruning old ones and checking that a checkpoint fits the run that wants to resume.
//
// Files are <dir>/step_<step, zero-padded to 8 digits>.h5. Layout (format_version 1):
//   /                      attribute complete (int64) = 1, written after everything else
//   /meta                  group; int64 attributes step, tokens_seen, adam_step, world_size, format_version,
//                          param_count; uint64 attributes data_cursor, rng_seed, rng_counter; string attributes
//                          hgrn_version, git_commit, model_signature; uint32 attribute crc32 over all of these
//                          (see meta_checksum in checkpoint.cpp for the byte encoding)
//   /config                scalar fixed-length UTF-8 string dataset: the resolved config YAML
//   /params/<name>         one dataset per parameter, named by its fla state-dict key (dots are fine in HDF5
//                          names), in model order (the groups track link creation order)
//   /adam/m/<name>         AdamW first moment of that parameter
//   /adam/v/<name>         AdamW second moment of that parameter
//   /recurrent_states/layer_<l>  only from a data.stateful run: layer l's carried state of every stream, [streams,
//                          ...] (train/carried_states.h), layers in order; readers that do not carry states ignore it
// Every dataset is stored contiguously and uncompressed, little-endian, with attributes
//   crc32 (uint32)         CRC-32 (zlib's) of the dataset's raw element bytes, or of the config text's bytes
//   dtype (string)         tensor datasets only: hgrn's dtype name (fp32, fp64, bf16 as uint16 bits, int32, int64)
// so h5py can read a checkpoint directly (h5py.File(path)["params"][name][()]) and zlib.crc32 can verify it.
//
// Atomicity: a checkpoint is written under a temporary name in the same directory (checkpoint_temp_file_name),
// flushed, closed and fsync'ed, then renamed to its final name, and the directory is fsync'ed. rename() within a
// directory is atomic, so a crash at any moment (kill -9, power loss) leaves either no file with the final name or
// a complete one; a leftover temporary file is never mistaken for a checkpoint and prune_checkpoints removes it.
// A run directory is meant to have one writer: temporary names carry the writer's process id so that two
// misconfigured writers do not write into the same file, but pruning removes every temporary file it finds.
#pragma once
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace hgrn {

// Bumped whenever the layout above changes in a way an older reader would misread.
constexpr int64_t kCheckpointFormatVersion = 1;

// Everything a run needs to continue exactly where it stopped.
struct TrainingState {
  int64_t step = 0;          // optimiser steps completed
  int64_t tokens_seen = 0;
  uint64_t data_cursor = 0;  // MqarGenerator::cursor() of the training data
  RngState rng;              // any trainer RNG state still in use (serialised exactly)
  std::vector<std::pair<std::string, Tensor>> params;  // fp32 master weights, by fla name, in model order
  std::vector<Tensor> adam_m, adam_v;                   // AdamW moments, same order (and shapes) as params
  int64_t adam_step = 0;                                // AdamW's step count
  std::vector<Tensor> recurrent_states;  // data.stateful: per layer, every stream's carried state; empty otherwise
  // training.precision fp8: the delayed-scaling states as named arrays (ops/fp8_linear.h, fp8_scaling_save), in
  // order; empty otherwise.
  std::vector<std::pair<std::string, Tensor>> fp8_scaling;
  std::string config_yaml;      // the resolved config (config_to_yaml)
  std::string model_signature;  // identifies model shape and precision; built by the trainer, compared on resume
  int64_t world_size = 1;
  std::string hgrn_version, git_commit;
};

// "step_00000042.h5": the final file name of the checkpoint after `step` steps.
std::string checkpoint_file_name(int64_t step);
// The step of a final checkpoint file name (as checkpoint_file_name writes it), nullopt for any other name.
std::optional<int64_t> checkpoint_step_from_file_name(const std::string& file_name);
// "step_00000042.h5.tmp-<pid>": where save_checkpoint writes before the rename.
std::string checkpoint_temp_file_name(int64_t step);
// True for names checkpoint_temp_file_name produces (by any process): what a crashed writer leaves behind.
bool is_checkpoint_temp_file_name(const std::string& file_name);

// Writes <dir>/step_<8-digit step>.h5 atomically (see above), creating dir if needed, and returns its path. Tensors
// must be defined and on the CPU; adam_m and adam_v must match params in count, shape and dtype. Replaces an
// existing checkpoint of the same step. Throws hgrn::Error naming the file and what failed; the temporary file is
// removed then.
std::string save_checkpoint(const std::string& dir, const TrainingState& state);

// Loads and verifies a checkpoint: the file is HDF5 and not truncated, the complete marker is set, every required
// object is present with a consistent shape and type, and every checksum matches. Throws hgrn::Error naming the
// file and what is wrong (truncated, not a valid HDF5 file, incomplete, missing object X, checksum mismatch in X).
TrainingState load_checkpoint(const std::string& path);

// The path of the newest checkpoint in dir (by step) that loads and verifies. Newer ones that do not are skipped
// with one line on `warnings` each (path and reason). nullopt if there is none, or dir does not exist.
std::optional<std::string> find_latest_valid_checkpoint(const std::string& dir, std::ostream& warnings);

// find_latest_valid_checkpoint for checkpoint.resume: auto. When dir holds checkpoints but none of them loads,
// starting over would write new checkpoints beside the damaged ones and lose the run, so this throws hgrn::Error
// naming every file and why it failed instead of returning nullopt.
std::optional<std::string> find_checkpoint_to_resume(const std::string& dir, std::ostream& warnings);

// Deletes the checkpoints in dir except the newest keep_last (>= 1) and, if keep_every > 0, every one whose step is
// a multiple of keep_every. Also deletes temporary files left by a writer that crashed.
void prune_checkpoints(const std::string& dir, int64_t keep_last, int64_t keep_every);

// The model part of check_checkpoint_compatible, for any use of a checkpoint with a config (resume, eval): the
// checkpoint's model signature equals `model_signature`. Throws hgrn::Error with both signatures.
void check_checkpoint_model(const TrainingState& loaded, const std::string& model_signature, const std::string& path);

// Checks that a loaded checkpoint (from `path`, for messages) fits the current run: same model signature, world
// size, and parameter names and shapes in the same order. Throws hgrn::Error saying which field differs, both
// values, and what to do (resume with the config that wrote it, or start over with checkpoint.resume: never).
void check_checkpoint_compatible(const TrainingState& loaded, const std::string& model_signature, int64_t world_size,
                                 const std::vector<std::pair<std::string, Shape>>& param_shapes,
                                 const std::string& path);

}  // namespace hgrn
