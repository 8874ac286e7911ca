// prepare.cpp: `hgrn prepare --corpus KIND --input FILE... --output PREFIX [...]`: the command-line options of the
// corpus -> token shard pipeline in data/prepare.h.
#include "cli/prepare.h"

#include <unistd.h>

#include <iostream>

namespace hgrn::cli {

CLI::App* add_prepare_command(CLI::App& app, PrepareOptions& options) {
  CLI::App* prepare = app.add_subcommand(
      "prepare", "Tokenise a corpus into token shards (Megatron .bin/.idx plus a .json sidecar) for training");
  prepare
      ->add_option("--corpus", options.corpus,
                   "Corpus format: wikitext (.tokens/.raw/.txt) or pile (.jsonl/.jsonl.zst)")
      ->required()
      ->check(CLI::IsMember({"wikitext", "pile"}))
      ->type_name("KIND");
  prepare->add_option("--input", options.inputs, "Input files, read in this order (one or more)")
      ->required()
      ->type_name("FILE");
  prepare->add_option("--tokenizer", options.tokenizer,
                      "\"byte\" (UTF-8 bytes, EOS 256) or a Hugging Face tokenizer.json (GPT-2, GPT-NeoX-20B, ...)")
      ->capture_default_str()
      ->type_name("byte|PATH");
  prepare->add_option("--output", options.output_prefix,
                      "Output prefix: writes PREFIX_<split>.{bin,idx,json} (and PREFIX_valid.* with --valid-fraction)")
      ->required()
      ->type_name("PREFIX");
  prepare
      ->add_option("--valid-fraction", options.valid_fraction,
                   "Fraction of documents (chosen by a hash of their index and --seed) that go to PREFIX_valid; 0 "
                   "writes no validation shard")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            double value = -1;
            try {
              value = std::stod(text);
            } catch (const std::exception&) {
            }
            return value >= 0.0 && value < 1.0 ? std::string() : "expected a number in [0, 1), got " + text;
          },
          "in [0, 1)"))
      ->type_name("F");
  prepare->add_option("--split", options.split,
                      "Name of the main output, PREFIX_<split>: train, or valid/test for a split that comes as its "
                      "own file (WikiText)")
      ->capture_default_str();
  prepare->add_option("--seed", options.seed, "Seed of the train/valid split")->capture_default_str();
  prepare->add_option("--threads", options.threads, "Tokenising threads (0: one per core)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, kMaxPrepareThreads));
  prepare->add_flag("--force", options.force,
                    "Replace an earlier shard at the output prefix (anything else there is refused)");
  prepare->add_flag("--skip-bad", options.skip_bad,
                    "Skip (and count) malformed JSON lines and non-UTF-8 documents instead of stopping at the first");
  prepare->add_option("--pile-subsets", options.pile_subsets,
                      "Keep only these Pile subsets (pile_set_name values, comma-separated)")
      ->delimiter(',')
      ->type_name("A,B");
  prepare->footer(
      "Examples:\n"
      "  hgrn prepare --corpus wikitext --input ../shared/data/wikitext-2/train.txt --output data/wt2-byte\n"
      "  hgrn prepare --corpus wikitext --input train.txt --tokenizer gpt2/tokenizer.json --valid-fraction 0.01 \\\n"
      "               --output data/wt2-gpt2\n"
      "  hgrn prepare --corpus pile --input 00.jsonl.zst 01.jsonl.zst --tokenizer 20B_tokenizer.json \\\n"
      "               --pile-subsets 'Pile-CC,Wikipedia (en)' --skip-bad --output data/pile");
  return prepare;
}

int run_prepare_command(PrepareOptions options) {
  options.progress = &std::cerr;
  options.progress_is_terminal = ::isatty(STDERR_FILENO) == 1;
  prepare_corpus(options);
  return kExitOk;
}

}  // namespace hgrn::cli
