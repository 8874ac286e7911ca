// generate.cpp: `hgrn generate (--checkpoint PATH | --hf DIR | --config FILE) (--prompt TEXT | --prompt-file FILE)
// [sampling options] [--batch N] [--tokenizer byte|FILE.json] [--json FILE] [--decode P] [--precision P]`: loads the
// model, tokenises the prompt, prefills, decodes (models/generation.h) and streams the text; timings go to stderr
// and, with --json, to a file.
#include "cli/generate.h"

#include <omp.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>

#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "io/atomic_write.h"
#include "io/hf_export.h"
#include "models/generation.h"
#include "models/registry.h"
#include "ops/gemm_cpu.h"
#include "train/trainer.h"

namespace hgrn::cli {

namespace fs = std::filesystem;

namespace {

// f(), with an hgrn::Error it throws turned into a UsageError: for steps that only fail on the user's input.
template <typename F>
auto as_usage_error(F&& f) {
  try {
    return f();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& bad_input) {
    throw UsageError(bad_input.what());
  }
}

// The model and what its source says about the tokenizer.
struct LoadedModel {
  std::unique_ptr<CausalLM> model;
  std::string source;               // the checkpoint or directory, for messages
  std::string recorded_tokenizer;   // "byte" or a tokenizer.json path; empty: none recorded
  std::string why_no_tokenizer;     // said when none is recorded and --tokenizer is missing
};

// A checkpoint's run records its tokenizer in the sidecar of its training shards (hgrn prepare).
void find_checkpoint_tokenizer(const Config& trained, LoadedModel& loaded) {
  if (trained.data.train_data.empty()) {
    loaded.why_no_tokenizer = "its run trained on MQAR, which has no tokenizer";
    return;
  }
  const std::string sidecar = shard_json_path(trained.data.train_data);
  if (!fs::exists(sidecar)) {
    loaded.why_no_tokenizer = "its training shards' sidecar " + sidecar + " (which names the tokenizer) is not here";
    return;
  }
  loaded.recorded_tokenizer = read_shard_metadata(sidecar).tokenizer;
}

LoadedModel load_model(const GenerateArgs& args, const std::optional<Config>& run_config) {
  LoadedModel loaded;
  Rng unused_init(0);  // the weights are overwritten
  if (!args.hf_dir.empty()) {
    const ModelConfig config = read_hf_config(args.hf_dir);
    loaded.model = create_model(config, unused_init, DType::F32);
    loaded.model->load_parameters(read_hf_weights(args.hf_dir, config), args.hf_dir);
    loaded.source = args.hf_dir;
    const std::string tokenizer_json = (fs::path(args.hf_dir) / "tokenizer.json").string();
    if (fs::exists(tokenizer_json))
      loaded.recorded_tokenizer = tokenizer_json;
    else
      loaded.why_no_tokenizer = "the directory has no tokenizer.json";
    return loaded;
  }
  std::string path = args.checkpoint;
  if (path.empty()) {
    std::ostringstream warnings;
    const std::optional<std::string> latest =
        find_latest_valid_checkpoint(run_config->logging.run_dir + "/checkpoints", warnings);
    if (!latest)
      throw UsageError("no valid checkpoint in " + run_config->logging.run_dir +
                       "/checkpoints: train first, or pass --checkpoint PATH or --hf DIR" + warnings.str());
    path = *latest;
  }
  const TrainingState state = load_checkpoint(path);
  const Config trained = config_of_checkpoint(state, path);
  loaded.model = create_model(trained.model, unused_init, DType::F32);
  loaded.model->load_parameters(state.params, path);
  loaded.source = path;
  find_checkpoint_tokenizer(trained, loaded);
  return loaded;
}

std::unique_ptr<Tokenizer> resolve_tokenizer(const GenerateArgs& args, const LoadedModel& loaded) {
  std::string spec = args.tokenizer.empty() ? loaded.recorded_tokenizer : args.tokenizer;
  if (spec.empty())
    throw UsageError(loaded.source + " records no tokenizer (" + loaded.why_no_tokenizer +
                     "): pass --tokenizer byte or --tokenizer FILE.json");
  std::unique_ptr<Tokenizer> tokenizer = as_usage_error([&] { return make_tokenizer(spec); });
  const int64_t vocab = loaded.model->config().vocab_size;
  if (tokenizer->vocab_size() > vocab)
    throw UsageError("the tokenizer " + tokenizer->name() + " has " + std::to_string(tokenizer->vocab_size()) +
                     " ids, more than the model's vocabulary of " + std::to_string(vocab) + " (" + loaded.source +
                     "): it is not the model's tokenizer");
  return tokenizer;
}

std::string prompt_text(const GenerateArgs& args) {
  if (args.prompt_file.empty()) return args.prompt;
  std::ifstream in(args.prompt_file, std::ios::binary);
  if (!in) throw UsageError("--prompt-file: cannot read " + args.prompt_file);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The device and threads of --config's training section; else the GPU when there is one and the model runs there.
Device choose_device(const std::optional<Config>& run_config, const ModelConfig& model) {
  const std::string wanted = run_config ? run_config->training.device : "auto";
  const bool gpu_refused = !model_family(model.type).cuda_refusal(model).empty();
  if (run_config && run_config->training.threads > 0) {
    omp_set_num_threads(static_cast<int>(run_config->training.threads));
    gemm_cpu_set_threads(static_cast<int>(run_config->training.threads));
  }
  return resolve_device(gpu_refused ? "cpu" : wanted);
}

// How the tokens were decoded, in a few words.
std::string decode_path_summary(const GenerationResult& r) {
  if (r.fused)
    return std::string("fused steps") + (r.graph ? " replayed as a CUDA graph" : "") + " (set up in " +
           std::to_string(r.setup_seconds * 1e3) + " ms)";
  if (!r.fallback_reason.empty()) return "op by op: " + r.fallback_reason;
  return "op by op";
}

nlohmann::json generation_json(const GenerateArgs& args, const LoadedModel& loaded, const Tokenizer& tokenizer,
                               const std::vector<int32_t>& prompt, const GenerationResult& r) {
  nlohmann::json samples = nlohmann::json::array();
  for (const GeneratedSequence& s : r.sequences)
    samples.push_back({{"ids", s.ids}, {"text", tokenizer.decode(s.ids)}, {"stopped_at_eos", s.stopped_at_eos}});
  return {
      {"model", {{"source", loaded.source}, {"type", loaded.model->config().type}}},
      {"tokenizer", tokenizer.name()},
      {"prompt_ids", prompt},
      {"samples", samples},
      {"settings",
       {{"max_new_tokens", args.max_new_tokens}, {"temperature", args.sampling.temperature},
        {"top_k", args.sampling.top_k}, {"top_p", args.sampling.top_p},
        {"repetition_penalty", args.sampling.repetition_penalty}, {"seed", args.seed}, {"batch", args.batch},
        {"decode", args.decode}, {"precision", args.precision}}},
      {"timings",
       {{"decode_path", decode_path_summary(r)}, {"setup_seconds", r.setup_seconds},
        {"prefill_tokens", r.prefill_tokens}, {"prefill_seconds", r.prefill_seconds},
        {"decode_steps", r.decode_steps}, {"decode_seconds", r.decode_seconds},
        {"decode_tokens_per_second", r.decode_tokens_per_second()}, {"seconds_per_step", r.seconds_per_step()}}},
  };
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateArgs& args) {
  CLI::App* command = app.add_subcommand("generate", "Continue a prompt with a trained model, streaming the text");
  CLI::Option* checkpoint =
      command->add_option("--checkpoint", args.checkpoint, "Checkpoint file written by hgrn train")->type_name("PATH");
  CLI::Option* hf = command->add_option("--hf", args.hf_dir, "Hugging Face model directory (fla's or hgrn export's)")
                        ->type_name("DIR");
  checkpoint->excludes(hf);
  command->add_option("-c,--config", args.config_path,
                      "Run config: its newest checkpoint when neither --checkpoint nor --hf is given, and its "
                      "training.device and training.threads")
      ->type_name("FILE");
  CLI::Option* prompt = command->add_option("--prompt", args.prompt, "The text to continue")->type_name("TEXT");
  CLI::Option* prompt_file =
      command->add_option("--prompt-file", args.prompt_file, "Read the text to continue from a file")
          ->type_name("FILE");
  prompt->excludes(prompt_file);
  command->add_option("-n,--max-new-tokens", args.max_new_tokens, "Stop after this many new tokens (or at EOS)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--temperature", args.sampling.temperature, "Softmax temperature; 0 is greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--top-k", args.sampling.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--top-p", args.sampling.top_p,
                      "Sample among the fewest most likely tokens whose probability reaches p (1: all)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  command->add_option("--repetition-penalty", args.sampling.repetition_penalty,
                      "Divide the positive logits of tokens already in the text by R, multiply the negative ones "
                      "(1: none)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--seed", args.seed, "Seed of the sampling (the same seed gives the same text)")
      ->capture_default_str();
  command->add_option("--batch", args.batch, "Continuations of the prompt decoded side by side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--tokenizer", args.tokenizer,
                      "byte or a tokenizer.json (default: the one recorded by the checkpoint's training shards or "
                      "the HF directory)")
      ->type_name("byte|FILE.json");
  command->add_option("--json", args.json_path, "Also write the ids, texts and timings to this JSON file")
      ->type_name("FILE");
  command->add_option("--decode", args.decode,
                      "fused: fused per-layer steps on buffers made once, a CUDA graph on the GPU; ops: op by op; "
                      "auto: fused on the GPU, ops on the CPU")
      ->check(CLI::IsMember({"auto", "fused", "ops"}))
      ->capture_default_str();
  command->add_option("--precision", args.precision,
                      "Activations and GEMM weights: bf16 (GPU only) or fp32; auto: bf16 for fused decoding on the "
                      "GPU, else fp32")
      ->check(CLI::IsMember({"auto", "bf16", "fp32"}))
      ->capture_default_str();
  command->parse_complete_callback([command] {
    if (command->count("--checkpoint") + command->count("--hf") + command->count("--config") == 0)
      throw CLI::ValidationError("--checkpoint", "name the model: --checkpoint PATH, --hf DIR or --config FILE");
    if (command->count("--prompt") + command->count("--prompt-file") == 0)
      throw CLI::ValidationError("--prompt", "give the text to continue: --prompt TEXT or --prompt-file FILE");
  });
  command->footer(
      "Examples:\n"
      "  hgrn generate --checkpoint runs/wikitext2-byte/checkpoints/step_00002000.h5 --prompt 'The castle'\n"
      "  hgrn generate --config configs/wikitext2-byte.yaml --prompt 'The' --temperature 0 -n 200\n"
      "  hgrn generate --hf exports/m --prompt-file prompt.txt --top-p 0.9 --batch 4 --json out.json");
  return command;
}

int run_generate_command(const GenerateArgs& args, std::ostream& out, std::ostream& log) {
  std::optional<Config> run_config;
  if (!args.config_path.empty()) run_config = load_config(args.config_path);
  const LoadedModel loaded = load_model(args, run_config);
  const std::unique_ptr<Tokenizer> tokenizer = resolve_tokenizer(args, loaded);
  CausalLM& model = *loaded.model;

  const std::string text = prompt_text(args);
  const std::vector<int32_t> prompt = as_usage_error([&] { return tokenizer->encode(text); });
  GenerationOptions options;
  options.max_new_tokens = args.max_new_tokens;
  options.sampling = args.sampling;
  options.seed = args.seed;
  options.batch = args.batch;
  options.eos_id = tokenizer->eos_id();
  options.vocab_limit = tokenizer->vocab_size();
  as_usage_error([&] {
    check_prompt(prompt, model.config().vocab_size);
    check_sampling_options(options.sampling);
  });

  const Device device = choose_device(run_config, model.config());
  const bool fused = args.decode == "fused" || (args.decode == "auto" && device == Device::CUDA);
  if (args.precision == "bf16" && device != Device::CUDA)
    throw UsageError("--precision bf16 needs the GPU; this model runs on the CPU (use --precision fp32)");
  // auto: bf16 where the fused path will run on the GPU; a model without one decodes op by op in fp32, as before.
  const bool fused_on_gpu = fused && device == Device::CUDA && model.fused_decoding_refusal().empty();
  const DType precision =
      args.precision == "bf16" || (args.precision == "auto" && fused_on_gpu) ? DType::BF16 : DType::F32;
  options.decode = fused ? DecodePath::Fused : DecodePath::Ops;
  options.fused_dtype = precision;
  model.to_device(device, precision);
  log << "generating with " << model_family(model.config().type).display_name() << " from " << loaded.source
      << " on " << device_name(device) << " in " << dtype_name(precision) << ", tokenizer " << tokenizer->name()
      << "\n";

  // One continuation streams as it comes; several are printed whole, one after another.
  const bool streaming = args.batch == 1;
  if (streaming) out << text << std::flush;
  const GenerationResult r = generate(model, prompt, options, [&](const std::vector<int32_t>& tokens) {
    if (streaming && tokens[0] >= 0) out << tokenizer->decode(std::span<const int32_t>(&tokens[0], 1)) << std::flush;
  });
  if (streaming) {
    out << "\n";
  } else {
    for (size_t b = 0; b < r.sequences.size(); ++b)
      out << "--- sample " << b << " ---\n" << text << tokenizer->decode(r.sequences[b].ids) << "\n";
  }

  log << "decoding: " << decode_path_summary(r) << "\n";
  log << "prefill: " << r.prefill_tokens << " tokens in " << r.prefill_seconds * 1e3 << " ms; decode: "
      << r.decode_steps << " steps x " << args.batch << " sequences in " << r.decode_seconds << " s";
  if (r.decode_steps > 0)
    log << " (" << r.decode_tokens_per_second() << " tokens/s, " << r.seconds_per_step() * 1e3 << " ms per step)";
  log << "\n";
  if (!args.json_path.empty()) {
    // Text that is not valid UTF-8 (a byte tokenizer's partial characters) is written with U+FFFD in its place.
    const nlohmann::json record = generation_json(args, loaded, *tokenizer, prompt, r);
    write_file_atomically(args.json_path, record.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    log << "wrote " << args.json_path << "\n";
  }
  return kExitOk;
}

}  // namespace hgrn::cli
