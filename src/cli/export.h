// export.h: `hgrn export`: a training checkpoint's weights as a Hugging Face directory (fla HGRN2ForCausalLM layout,
// loadable by transformers after `import fla`) or as an HDF5 weights file, optionally with reference logits that
// tools/verify_hf_export.py compares against fla's forward.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "cli/common.h"
#include "config/config.h"
#include "io/safetensors.h"

namespace hgrn::cli {

struct ExportArgs {
  std::string checkpoint_path;
  std::string format;             // hf | hdf5
  std::string out_path;           // a directory (hf) or a file (hdf5)
  std::string dtype = "fp32";     // fp32 | bf16
  int64_t shard_bytes = kDefaultShardBytes;
  bool force = false;             // replace an existing output (only once the new one is complete)
  int64_t reference_sequences = 0;  // --reference-logits N
};

CLI::App* add_export_command(CLI::App& app, ExportArgs& args);
// Loads the checkpoint, rebuilds its config, exports; prints what was written to `out`. Returns the exit status.
int run_export_command(const ExportArgs& args, std::ostream& out);

// The file name of the reference logits inside an exported directory.
inline constexpr const char* kReferenceFileName = "hgrn_reference.safetensors";
// Over 64 tokens, so that hgrn and fla both take their chunkwise paths (fla reads T <= 64 step by step), with a
// partial last chunk.
inline constexpr int64_t kReferenceSequenceLength = 100;
inline constexpr uint64_t kReferenceSeed = 20240607;

// hgrn's own forward on `sequences` random token sequences of kReferenceSequenceLength tokens (ids uniform over the
// vocabulary, drawn from Rng(kReferenceSeed)), with the model's weights set to `params` (fp32, by fla name).
// Returns {"input_ids": I64 [N, T], "logits": F32 [N, T, vocab]} with T = kReferenceSequenceLength.
NamedTensors reference_logits(const ModelConfig& config, const NamedTensors& params, int64_t sequences);

}  // namespace hgrn::cli
