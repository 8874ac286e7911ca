// eval.cpp: `hgrn eval`: loads a checkpoint (the model comes from the checkpoint's own config, the data from the
// given one), scores the validation shard (or MQAR's held-out sequences) and prints loss, perplexity, bits per
// byte and, for WikiText, word-level perplexity; the last line is the same as JSON.
#include "cli/eval.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "config/config.h"
#include "core/format.h"
#include "core/status_line.h"
#include "data/data_sources.h"
#include "data/token_shards.h"
#include "io/checkpoint.h"
#include "models/registry.h"
#include "train/evaluate.h"
#include "train/trainer.h"

namespace hgrn::cli {

CLI::App* add_eval_command(CLI::App& app, EvalArgs& args) {
  CLI::App* eval = app.add_subcommand("eval", "Held-out loss, perplexity and accuracy of a checkpoint");
  add_config_options(*eval, args.config);
  eval->add_option("--checkpoint", args.checkpoint,
                   "Checkpoint file (default: the newest valid one in logging.run_dir/checkpoints)");
  eval->add_option("--data", args.data, "Shard prefix to score (default: data.valid_data)");
  eval->add_flag("--stateful", args.stateful,
                 "Carry the recurrent state across consecutive windows (unlimited context)");
  eval->add_option("--seq-len", args.seq_len, "Tokens per forward call (default: data.seq_len)")
      ->check(CLI::PositiveNumber);
  eval->add_option("--batch-size", args.batch_size,
                   "Sequences (stateful: parallel streams) per call (default: training.micro_batch_size)")
      ->check(CLI::PositiveNumber);
  eval->add_option("--max-tokens", args.max_tokens, "Score about this many tokens only (default: all)")
      ->check(CLI::NonNegativeNumber);
  eval->footer(
      "Examples:\n"
      "  hgrn eval --config configs/wikitext2-byte.yaml\n"
      "  hgrn eval -c configs/wikitext2-byte.yaml --stateful --batch-size 1\n"
      "  hgrn eval -c configs/mqar-tiny.yaml --checkpoint runs/mqar-tiny/checkpoints/step_00001500.h5");
  return eval;
}

int run_eval_command(const EvalArgs& args, std::ostream& out) {
  const Config config = load_config(args.config.config_path, args.config.overrides);
  std::string path = args.checkpoint;
  if (path.empty()) {
    std::ostringstream warnings;
    std::optional<std::string> latest =
        find_latest_valid_checkpoint(config.logging.run_dir + "/checkpoints", warnings);
    out << warnings.str();
    HGRN_CHECK(latest, "no valid checkpoint in ", config.logging.run_dir,
               "/checkpoints: train first, or pass --checkpoint PATH");
    path = *latest;
  }
  const TrainingState state = load_checkpoint(path);
  const Config trained = parse_stored_config(state.config_yaml, path + " (its stored config)");
  // The model comes from the checkpoint; a config describing another one is refused as a resume would refuse it.
  try {
    check_checkpoint_model(state, model_signature(config.model), path);
  } catch (const Error& error) {
    throw ConfigError(config.source + ": model: " + error.what());
  }
  for (const ConfigChange& change : config_changes(state.config_yaml, path, config))
    if (change.key.rfind("model.", 0) == 0 && change.key.rfind("model.memory.", 0) != 0)
      out << "note: " << change.key << " is " << change.after << " in " << config.source << " but "
          << change.before << " in the checkpoint: evaluating the checkpoint's model\n";
  Rng unused_init(0);
  const std::unique_ptr<CausalLM> owned_model = create_model(trained.model, unused_init, DType::F32);
  CausalLM& model = *owned_model;
  model.load_parameters(state.params, path);
  // Where training would run (training.device: auto takes the GPU when the model can use one), in its precision;
  // bf16 falls back to fp32 on the CPU, where only fp32 runs.
  const std::string no_cuda = model_family(trained.model.type).cuda_refusal(trained.model);
  const Device device = resolve_device(no_cuda.empty() ? config.training.device : "cpu");
  const DType act_dtype = device == Device::CUDA ? activation_dtype(config.training.precision, device) : DType::F32;
  model.to_device(device, act_dtype);
  out << "checkpoint " << path << " (step " << state.step << ", " << state.tokens_seen << " tokens) on the "
      << (device == Device::CUDA ? "GPU, " + std::string(dtype_name(act_dtype)) + " activations" : "CPU") << "\n";

  const int64_t batch_size = args.batch_size > 0 ? args.batch_size : config.training.micro_batch_size;
  char json[512];
  if (config.data.task == "mqar") {
    // The trainer's held-out stream, so that eval repeats the run's own evaluations.
    std::unique_ptr<BatchSource> source = make_evaluation_source(config, evaluation_data_seed(config.training.seed));
    const EvalResult r = evaluate_batches(model, *source, config.training.eval_batches, batch_size);
    out << "MQAR held-out: " << r.targets << " queries | loss " << r.loss << " | accuracy " << r.accuracy
        << " (chance " << chance_accuracy(config).value() << ")\n";
    std::snprintf(json, sizeof json, "{\"task\": \"mqar\", \"targets\": %lld, \"loss\": %.6g, \"accuracy\": %.6g}",
                  static_cast<long long>(r.targets), r.loss, r.accuracy);
    out << json << "\n";
    return 0;
  }

  const std::string prefix = args.data.empty() ? config.data.valid_data : args.data;
  HGRN_CHECK(!prefix.empty(), "nothing to evaluate: the config has no data.valid_data; pass --data PREFIX");
  const std::shared_ptr<const TokenShardReader> shard_ptr =
      open_token_shard(config, args.data.empty() ? "data.valid_data" : "--data", prefix);
  const TokenShardReader& shard = *shard_ptr;
  ShardEvalOptions options;
  options.seq_len = args.seq_len > 0 ? args.seq_len : config.data.seq_len;
  options.batch_size = batch_size;
  options.stateful = args.stateful;
  options.max_tokens = args.max_tokens;
  if (config.data.reset_state_at_document)
    options.document_eos = document_eos_id(args.data.empty() ? "data.valid_data" : "--data", prefix);
  // Progress on stderr (redrawn on a terminal, a line every few seconds in a log), so stdout stays the result.
  StatusLine status(&std::cerr, ::isatty(STDERR_FILENO) == 1);
  options.on_progress = [&status](int64_t scored, int64_t total) {
    if (!status.due(/*force=*/scored >= total)) return;
    const double elapsed = status.elapsed_s(), per_s = static_cast<double>(scored) / std::max(elapsed, 1e-9);
    char line[192];
    std::snprintf(line, sizeof line, "eval: %lld / %lld tokens (%.1f%%) | %.0f tok/s | elapsed %s | ETA %s",
                  static_cast<long long>(scored), static_cast<long long>(total),
                  100.0 * static_cast<double>(scored) / static_cast<double>(std::max<int64_t>(total, 1)), per_s,
                  format_duration(elapsed).c_str(),
                  format_duration(per_s > 0 ? static_cast<double>(total - scored) / per_s : -1).c_str());
    status.show(line);
  };
  const EvalResult r = evaluate_shard(model, shard, options);
  status.end_line();
  out << prefix << ": " << r.targets << " tokens scored (" << (args.stateful ? "stateful" : "window") << " mode, "
      << options.seq_len << " tokens per call"
      << (options.document_eos ? ", state restarted at each document start" : "") << ") | loss " << r.loss
      << " | ppl " << std::exp(r.loss)
      << " | accuracy " << r.accuracy << "\n";

  // Per byte and per word: the mean loss is over (nearly) every token of the shard, so the shard's total NLL is
  // about loss x (tokens - 1), spread over its bytes or words (sidecar counts).
  double bits_per_byte = 0, word_ppl = 0;
  if (std::filesystem::exists(shard_json_path(prefix))) {
    const ShardMetadata meta = read_shard_metadata(shard_json_path(prefix));
    const double total_nll = r.loss * static_cast<double>(shard.num_tokens() - 1);
    if (meta.bytes > 0) {
      bits_per_byte = total_nll / std::log(2.0) / static_cast<double>(meta.bytes);
      out << "bits per byte " << bits_per_byte << "\n";
    }
    if (meta.corpus == "wikitext" && meta.words > 0) {
      word_ppl = std::exp(total_nll / static_cast<double>(meta.words));
      out << "word-level perplexity " << word_ppl << " (" << meta.words << " words incl. one <eos> per line)\n";
    }
  }
  std::snprintf(json, sizeof json,
                "{\"data\": \"%s\", \"mode\": \"%s\", \"targets\": %lld, \"loss\": %.6g, \"ppl\": %.6g, "
                "\"accuracy\": %.6g, \"bits_per_byte\": %.6g, \"word_ppl\": %.6g, \"document_resets\": %s}",
                prefix.c_str(), args.stateful ? "stateful" : "window", static_cast<long long>(r.targets), r.loss,
                std::exp(r.loss), r.accuracy, bits_per_byte, word_ppl, options.document_eos ? "true" : "false");
  out << json << "\n";
  return 0;
}

}  // namespace hgrn::cli
