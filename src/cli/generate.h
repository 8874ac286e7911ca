// generate.h: `hgrn generate`: continues a prompt with a trained model (an hgrn checkpoint or a Hugging Face
// directory), streaming the text to stdout.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "cli/common.h"
#include "models/sampling.h"

namespace hgrn::cli {

struct GenerateArgs {
  std::string checkpoint;   // an hgrn checkpoint
  std::string hf_dir;       // or a Hugging Face directory (fla's or hgrn's export)
  std::string config_path;  // optional run config: its newest checkpoint by default, its device and threads
  std::string prompt, prompt_file;
  int64_t max_new_tokens = 128;
  SamplingOptions sampling;
  uint64_t seed = 0;
  int64_t batch = 1;
  std::string tokenizer;    // "byte" or a tokenizer.json; empty: what the model's source records
  std::string json_path;    // where to write ids, text and timings (empty: nowhere)
  std::string decode = "auto";     // auto (fused on the GPU, op by op on the CPU), fused or ops
  std::string precision = "auto";  // auto (bf16 for fused decoding on the GPU, else fp32), bf16 (GPU) or fp32
};

CLI::App* add_generate_command(CLI::App& app, GenerateArgs& args);
// Generates; the text goes to `out`, the timings to `log`. Input to fix (prompt, tokenizer, options) throws
// UsageError.
int run_generate_command(const GenerateArgs& args, std::ostream& out, std::ostream& log);

}  // namespace hgrn::cli
