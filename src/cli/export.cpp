// export.cpp: `hgrn export --checkpoint PATH --format hf|hdf5 --out PATH [--dtype fp32|bf16] [--shard-size BYTES]
// [--force] [--reference-logits N]`: the checkpoint's fp32 weights, under the model config stored in it, written
// by io/hf_export or io/hdf5_export. Outputs appear atomically: a failed export leaves nothing that looks complete.
#include "cli/export.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/autograd.h"
#include "core/rng.h"
#include "data/data_sources.h"
#include "io/atomic_write.h"
#include "io/checkpoint.h"
#include "io/hdf5_export.h"
#include "io/hf_export.h"
#include "models/registry.h"

namespace hgrn::cli {

namespace fs = std::filesystem;

namespace {

std::string byte_count(uintmax_t bytes) {
  char buffer[64];
  if (bytes >= 1'000'000)
    std::snprintf(buffer, sizeof buffer, "%.2f MB", static_cast<double>(bytes) / 1e6);
  else
    std::snprintf(buffer, sizeof buffer, "%ju bytes", bytes);
  return buffer;
}

}  // namespace

CLI::App* add_export_command(CLI::App& app, ExportArgs& args) {
  CLI::App* command = app.add_subcommand(
      "export",
      "Write a checkpoint's weights as a Hugging Face model directory (fla's *ForCausalLM of the model's type) or an HDF5 file");
  command->add_option("--checkpoint", args.checkpoint_path, "Checkpoint file written by hgrn train (step_*.h5)")
      ->required()
      ->type_name("PATH");
  command->add_option("--format", args.format, "hf: config.json + model.safetensors (or shards + index); "
                                               "hdf5: one weights file (hgrn-weights-v1)")
      ->required()
      ->check(CLI::IsMember({"hf", "hdf5"}))
      ->type_name("hf|hdf5");
  command->add_option("--out", args.out_path, "Output directory (hf) or file (hdf5)")->required()->type_name("PATH");
  command->add_option("--dtype", args.dtype, "Stored weight type (checkpoints hold fp32; bf16 rounds to nearest even)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->type_name("fp32|bf16")
      ->capture_default_str();
  command->add_option("--shard-size", args.shard_bytes,
                      "hf: split the weights into shards of at most this many bytes when they are larger "
                      "(transformers' default, 5 GB)")
      ->check(CLI::PositiveNumber)
      ->type_name("BYTES")
      ->capture_default_str();
  command->add_flag("--force", args.force,
                    "Replace an existing output (the old one is replaced only once the new one is complete)");
  command->add_option("--reference-logits", args.reference_sequences,
                      "hf: also write hgrn_reference.safetensors with hgrn's logits on N random sequences of 100 "
                      "tokens, for tools/verify_hf_export.py")
      ->check(CLI::NonNegativeNumber)
      ->type_name("N")
      ->capture_default_str();
  command->parse_complete_callback([&args] {
    if (args.reference_sequences > 0 && args.format != "hf")
      throw CLI::ValidationError("--reference-logits", "goes with --format hf (the verifier loads the HF directory)");
  });
  command->footer(
      "Examples:\n"
      "  hgrn export --checkpoint runs/mqar-tiny/checkpoints/step_00001500.h5 --format hf --out exports/mqar-tiny\n"
      "  hgrn export --checkpoint CKPT --format hf --out exports/m --dtype bf16 --reference-logits 4\n"
      "  hgrn export --checkpoint CKPT --format hdf5 --out exports/m.h5 --force\n"
      "Check an HF export with fla on a GPU machine: python3 tools/verify_hf_export.py exports/m");
  return command;
}

NamedTensors reference_logits(const ModelConfig& config, const NamedTensors& params, int64_t sequences) {
  HGRN_CHECK(sequences > 0, "reference logits: the number of sequences must be positive, got ", sequences);
  // The initial values are overwritten below; only the parameter set is needed.
  Rng init_rng(0);
  const std::unique_ptr<CausalLM> model = create_model(config, init_rng);
  for (const auto& [name, value] : params) model->parameter(name)->value.copy_from(value);

  Rng token_rng(kReferenceSeed);
  Tensor input_ids = Tensor::empty({sequences, kReferenceSequenceLength}, DType::I64);
  int64_t* ids = input_ids.data<int64_t>();
  for (int64_t i = 0; i < input_ids.numel(); ++i)
    ids[i] = static_cast<int64_t>(token_rng.below(static_cast<uint64_t>(config.vocab_size)));

  Tape tape;
  tape.set_enabled(false);  // inference: no backward closures, no saved activations
  Var logits = model->forward(tape, input_ids);
  Tensor logits_f32 = logits->value.dtype() == DType::F32 ? logits->value : logits->value.to(DType::F32);
  return {{"input_ids", input_ids}, {"logits", logits_f32}};
}

int run_export_command(const ExportArgs& args, std::ostream& out) {
  const TrainingState state = load_checkpoint(args.checkpoint_path);
  const Config config = config_of_checkpoint(state, args.checkpoint_path);
  const DType dtype = dtype_from_name(args.dtype);
  std::string no_eos;
  const std::optional<int64_t> eos = training_eos_id(config, &no_eos);
  if (!no_eos.empty())
    out << "note: bos_token_id and eos_token_id are left null: the tokenizer of the training data is not known here ("
        << no_eos << ")\n";

  if (args.format == "hdf5") {
    export_hdf5(config.model, state.params, args.out_path, dtype, args.force, eos);
    out << "exported " << state.params.size() << " tensors (" << args.dtype << ") of " << args.checkpoint_path
        << " (step " << state.step << ") to " << args.out_path << " ("
        << byte_count(fs::file_size(args.out_path)) << ")\n";
    return kExitOk;
  }

  require_hf_form(config.model, args.out_path);
  publish_atomically(args.out_path, /*is_directory=*/true, args.force, hf_export_kind(),
                     [&](const std::string& temp_dir) {
    write_hf_files(config.model, state.params, temp_dir, dtype, args.shard_bytes, eos);
    if (args.reference_sequences > 0) {
      // The reference runs on the weights as exported (bf16-rounded for --dtype bf16), which is what transformers
      // loads, so the comparison measures the two forwards and not the export's rounding.
      NamedTensors exported;
      for (const auto& [name, value] : state.params)
        exported.emplace_back(name, dtype == DType::F32 ? value : value.to(dtype).to(DType::F32));
      write_safetensors_file((fs::path(temp_dir) / kReferenceFileName).string(),
                             reference_logits(config.model, exported, args.reference_sequences), {{"format", "pt"}});
    }
  });

  out << "exported " << state.params.size() << " tensors (" << args.dtype << ") of " << args.checkpoint_path
      << " (step " << state.step << ") to " << args.out_path << ":\n";
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(args.out_path)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& file : files)
    out << "  " << file.filename().string() << "  " << byte_count(fs::file_size(file)) << "\n";
  if (args.reference_sequences > 0)
    out << "verify with fla (on a machine with torch, transformers and flash-linear-attention):\n"
        << "  python3 tools/verify_hf_export.py " << args.out_path << "\n";
  return kExitOk;
}

}  // namespace hgrn::cli
