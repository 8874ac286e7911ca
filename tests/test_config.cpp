// test_config.cpp: the config loader: fla's derived sizes, every kind of rejected input (each message must name the
// file, the line, the key path and what was expected), --set overrides, the YAML round trip, and the shipped configs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "config/config.h"
#include "config/suggest.h"
#include "models/params.h"
#include "models/registry.h"

namespace hgrn {
namespace {

const char* kSource = "test.yaml";

// A valid config with every key written out (config_to_yaml of the defaults plus the keys that have none).
std::string base_yaml() {
  Config c;
  c.model.expand_ratio = 16;
  c.model.vocab_size = 128;
  return config_to_yaml(c);
}

// base_yaml() with the value of one key replaced; `line` and `column` say where the new value starts (1-based).
struct Edited {
  std::string text;
  int line = 0;
  int column = 0;
};

Edited with_value(const std::string& key_path, const std::string& value) {
  std::istringstream in(base_yaml());
  std::vector<std::string> sections;  // by indentation level
  std::string text, line;
  Edited edited;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t indent = line.find_first_not_of(' ');
    const size_t colon = line.find(':');
    if (indent != std::string::npos && line[indent] != '#' && colon != std::string::npos) {
      const size_t level = indent / 2;
      sections.resize(level);
      const std::string key = line.substr(indent, colon - indent);
      std::string path;
      for (const std::string& s : sections) path += s + ".";
      path += key;
      if (colon + 1 == line.size()) {
        sections.push_back(key);
      } else if (path == key_path) {
        line = line.substr(0, colon + 2) + value;
        edited.line = number;
        edited.column = static_cast<int>(colon) + 3;
      }
    }
    text += line + "\n";
  }
  EXPECT_GT(edited.line, 0) << "no key " << key_path << " in the base config";
  edited.text = text;
  return edited;
}

// Parses and returns the ConfigError message ("" and a test failure if it parsed).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, kSource, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << text;
  return "";
}

std::string at(int line, int column) {
  return std::string(kSource) + ":" + std::to_string(line) + ":" + std::to_string(column) + ": ";
}

// Rejects `value` for `key` in the file: the message names file:line:col, the key and the expected thing.
void expect_rejected(const std::string& key, const std::string& value, const std::string& expected) {
  const Edited e = with_value(key, value);
  const std::string message = error_of(e.text);
  EXPECT_NE(message.find(at(e.line, e.column) + key + ": "), std::string::npos)
      << key << "=" << value << " gave: " << message;
  EXPECT_NE(message.find(expected), std::string::npos) << key << "=" << value << " gave: " << message;
}

// ---- derived sizes (fla's HGRN2Config) ----

TEST(ConfigDerived, IntermediateSizeFollowsFla) {
  const std::vector<std::pair<int64_t, int64_t>> table = {
      {64, 256}, {768, 2048}, {1024, 2816}, {1536, 4096}, {2048, 5632}, {2560, 6912}};
  for (const auto& [hidden, expected] : table) {
    ModelConfig m;
    m.hidden_size = hidden;
    m.expand_ratio = 64;
    EXPECT_EQ(m.mlp_size(), expected) << "hidden_size " << hidden;
  }
  ModelConfig explicit_size;
  explicit_size.expand_ratio = 16;
  explicit_size.intermediate_size = 100;
  EXPECT_EQ(explicit_size.mlp_size(), 100);
  ModelConfig ratio_two;
  ratio_two.hidden_size = 768;
  ratio_two.hidden_ratio = 2;
  ratio_two.expand_ratio = 128;
  EXPECT_EQ(ratio_two.mlp_size(), 1024);  // floor(768*2*2/3) = 1024, already a multiple of 256
}

TEST(ConfigDerived, OnlyExpandRatioGivesHeads) {
  ModelConfig m;
  m.hidden_size = 1024;
  m.expand_ratio = 128;
  EXPECT_EQ(m.heads(), 8);
  EXPECT_EQ(m.key_dim(), 128);
  EXPECT_EQ(m.value_dim(), 128);
}

TEST(ConfigDerived, OnlyNumHeadsGivesExpandRatio) {
  ModelConfig m;
  m.hidden_size = 64;
  m.num_heads = 4;
  EXPECT_EQ(m.heads(), 4);
  EXPECT_EQ(m.key_dim(), 16);
  EXPECT_EQ(m.value_dim(), 16);
}

TEST(ConfigDerived, BothGivenTheLayerUsesExpandRatio) {
  ModelConfig m;
  m.hidden_size = 64;
  m.expand_ratio = 16;
  m.num_heads = 2;
  EXPECT_EQ(m.heads(), 4);
  EXPECT_EQ(m.key_dim(), 16);
  EXPECT_EQ(m.value_dim(), 16);
  // parse_config accepts both when they agree (fla stores both) and refuses a num_heads that would be ignored.
  const Config c = parse_config(with_value("model.num_heads", "4").text, kSource);
  EXPECT_EQ(c.model.heads(), 4);
  const Edited contradicting = with_value("model.num_heads", "2");
  const std::string message = error_of(contradicting.text);
  EXPECT_NE(message.find(at(contradicting.line, contradicting.column) + "model.num_heads: contradicts "
                         "model.expand_ratio = 16"), std::string::npos) << message;
  EXPECT_NE(message.find("model.num_heads = 2"), std::string::npos) << message;
}

TEST(ConfigRejected, EmptyCommentOnlyOrNulFilledFileIsNamedAsSuch) {
  for (const std::string& text : {std::string(), std::string("# only a comment\n\n"), std::string(64, '\0'),
                                  std::string("\n   \n")}) {
    const std::string message = error_of(text);
    EXPECT_EQ(message.find("model.expand_ratio"), std::string::npos) << message;
    EXPECT_EQ(message.rfind(std::string(kSource) + ": ", 0), 0u) << message;
    EXPECT_TRUE(message.find("empty or unreadable") != std::string::npos || message.find("NUL byte") != std::string::npos)
        << message;
  }
}

TEST(ConfigRejected, SecondYamlDocumentIsRefused) {
  const std::string text = base_yaml() + "---\ntraining:\n  lr: 1.0\n";
  const std::string message = error_of(text);
  EXPECT_NE(message.find("expected one YAML document, got 2"), std::string::npos) << message;
  EXPECT_EQ(message.rfind(std::string(kSource) + ":", 0), 0u) << message;
}

TEST(ConfigDerived, NeitherIsAnError) {
  ModelConfig m;
  EXPECT_THROW(m.heads(), ConfigError);
  const Edited edited = with_value("model.expand_ratio", "null");
  const std::string message = error_of(edited.text);
  EXPECT_NE(message.find(at(edited.line, 3) + "model.expand_ratio: missing"), std::string::npos) << message;  // a null points at its key
  EXPECT_NE(message.find("model.num_heads"), std::string::npos) << message;
}

TEST(ConfigDerived, MqarTokenCounts) {
  Config c = parse_config(base_yaml(), kSource);
  EXPECT_EQ(mqar_key_count(c), 63);
  EXPECT_EQ(mqar_value_count(c), 64);
  c.data.mqar.num_keys = 20;
  EXPECT_EQ(mqar_key_count(c), 20);
  EXPECT_EQ(mqar_value_count(c), 107);
}

// ---- rejected input ----

TEST(ConfigErrors, UnknownKeySuggestsTheClosest) {
  const std::string text = "model:\n  expand_ratio: 16\n  hidden_sise: 64\n";
  const std::string message = error_of(text);
  EXPECT_NE(message.find(at(3, 3) + "model.hidden_sise: unknown key (did you mean model.hidden_size?)"),
            std::string::npos)
      << message;
}

TEST(ConfigErrors, UnknownKeyWithoutCloseMatchListsTheKeys) {
  const std::string message = error_of("logging:\n  colour: red\n");
  EXPECT_NE(message.find(at(2, 3) + "logging.colour: unknown key; the keys of logging are: run_dir, log_interval"),
            std::string::npos)
      << message;
}

TEST(ConfigErrors, KeyInTheWrongSectionNamesItsSection) {
  const std::string message = error_of("model:\n  expand_ratio: 16\n  lr: 0.1\n");
  EXPECT_NE(message.find(at(3, 3) + "model.lr: unknown key (did you mean training.lr?"), std::string::npos)
      << message;
}

TEST(ConfigErrors, UnknownSection) {
  std::string message = error_of("modle:\n  hidden_size: 64\n");
  EXPECT_NE(message.find(at(1, 1) + "modle: unknown key (did you mean model?)"), std::string::npos) << message;
  message = error_of("optimizer:\n  lr: 1\n");
  EXPECT_NE(message.find(at(1, 1) + "optimizer: unknown section; expected one of: model, data, training"),
            std::string::npos)
      << message;
}

TEST(ConfigErrors, StringForInteger) {
  expect_rejected("model.hidden_size", "abc", "expected an integer, got the string 'abc'");
}

TEST(ConfigErrors, QuotedNumberForInteger) {
  expect_rejected("training.max_steps", "\"600\"", "expected an integer, got the quoted string \"600\"");
}

TEST(ConfigErrors, FloatForInteger) {
  expect_rejected("model.num_hidden_layers", "2.5", "expected an integer, got the number 2.5 (not an integer)");
  expect_rejected("training.max_steps", "1e5", "expected an integer, got the number 1e5");
}

TEST(ConfigErrors, ListOrMappingForScalar) {
  expect_rejected("training.lr", "[0.1, 0.2]", "expected a number, got a list");
  expect_rejected("logging.run_dir", "{a: 1}", "expected a string, got a mapping");
}

TEST(ConfigErrors, NullForRequiredValue) {
  // An empty value: the message points at the key (the value has no position of its own).
  const std::string message = error_of("model:\n  expand_ratio: 16\n  vocab_size:\n");
  EXPECT_NE(message.find(at(3, 3) + "model.vocab_size: expected an integer, got null"), std::string::npos)
      << message;
}

TEST(ConfigErrors, WrongBoolean) {
  expect_rejected("model.use_lower_bound", "maybe", "expected true or false, got the string 'maybe'");
  expect_rejected("model.tie_word_embeddings", "1", "expected true or false, got the integer 1");
}

TEST(ConfigErrors, NegativeSeed) {
  expect_rejected("training.seed", "-1", "expected a non-negative integer, got the integer -1");
}

TEST(ConfigErrors, IntegerOutOfRange) {
  expect_rejected("model.hidden_size", "99999999999999999999", "is out of range");
}

TEST(ConfigErrors, SectionThatIsNotAMapping) {
  const std::string message = error_of("model: 64\n");
  EXPECT_NE(message.find(at(1, 8) + "model: expected a section (a mapping of keys: type, hidden_size"), std::string::npos)
      << message;
}

TEST(ConfigErrors, DocumentThatIsNotAMapping) {
  const std::string message = error_of("- model\n- data\n");
  EXPECT_NE(message.find("test.yaml:1:1: (top level): expected a mapping with the sections model, data"),
            std::string::npos)
      << message;
}

TEST(ConfigErrors, DuplicateKey) {
  const std::string message = error_of("model:\n  expand_ratio: 16\n  expand_ratio: 8\n");
  EXPECT_NE(message.find(at(3, 3) + "model.expand_ratio: duplicate key"), std::string::npos) << message;
}

TEST(ConfigErrors, InvalidYamlSyntaxNamesTheLine) {
  const std::string message = error_of("model:\n  hidden_size: [64\n  expand_ratio: 16\n");
  EXPECT_EQ(message.rfind("test.yaml:", 0), 0u) << message;
  EXPECT_NE(message.find("invalid YAML"), std::string::npos) << message;
  EXPECT_NE(message.find("test.yaml:3:"), std::string::npos) << message;  // where yaml-cpp gave up
}

TEST(ConfigErrors, MissingFile) {
  const std::string path = "/nonexistent/dir/config.yaml";
  try {
    load_config(path);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": cannot read the config file: no such file"), std::string::npos)
        << e.what();
  }
}

TEST(ConfigErrors, HiddenSizeNotDivisible) {
  expect_rejected("model.expand_ratio", "24", "expected a divisor of model.hidden_size = 64");
  expect_rejected("model.num_heads", "3", "expected a divisor of model.hidden_size = 64");
}

TEST(ConfigErrors, NonPositiveSizesStepsAndRates) {
  for (const char* key : {"model.hidden_size", "model.num_hidden_layers", "model.vocab_size", "model.hidden_ratio",
                          "model.expand_ratio", "model.intermediate_size", "data.seq_len", "data.mqar.num_kv_pairs",
                          "training.micro_batch_size", "training.grad_accum_steps", "training.max_steps",
                          "checkpoint.keep_last", "logging.log_interval"})
    expect_rejected(key, "0", "expected a positive integer, got 0");
  for (const char* key : {"training.lr", "model.norm_eps", "model.initializer_range", "training.adam_eps"})
    expect_rejected(key, "-0.5", "expected a positive number, got -0.5");
  expect_rejected("model.norm_eps", "0", "expected a positive number, got 0.0");
  for (const char* key : {"training.warmup_steps", "training.threads", "training.eval_interval",
                          "checkpoint.interval", "checkpoint.keep_every", "data.mqar.num_keys",
                          "model.memory.keep_recurrence_states", "model.memory.recompute_gates_layers"})
    expect_rejected(key, "-1", "expected 0 or a positive integer, got -1");
  expect_rejected("training.grad_clip", "-1", "expected 0 (off) or a positive norm");
  expect_rejected("training.weight_decay", "-0.1", "expected 0 or a positive number");
}

TEST(ConfigErrors, RatiosOutOfRange) {
  expect_rejected("training.min_lr_ratio", "1.5", "expected a number in [0.0, 1.0], got 1.5");
  expect_rejected("training.beta1", "1", "expected a number in [0.0, 1.0), got 1.0");
  expect_rejected("training.beta2", "-0.1", "expected a number in [0.0, 1.0)");
  expect_rejected("training.decay_fraction", "0", "expected a number in (0.0, 1.0], got 0.0");
  expect_rejected("training.decay_fraction", "1.01", "expected a number in (0.0, 1.0]");
}

TEST(ConfigErrors, UnknownEnumValues) {
  expect_rejected("training.device", "cdua", "expected one of auto | cpu | cuda, got 'cdua' (did you mean cuda?)");
  expect_rejected("training.precision", "fp16", "expected one of fp32 | bf16 | fp8, got 'fp16'");
  expect_rejected("training.schedule", "cosin", "expected one of cosine | linear | inverse_sqrt | constant | wsd");
  expect_rejected("model.attn_mode", "fused_chunk", "expected one of chunk | fused_recurrent");
  expect_rejected("data.task", "lm", "expected one of mqar | tokens, got 'lm'");
  expect_rejected("training.grad_reduce_dtype", "fp16", "expected one of fp32 | bf16, got 'fp16'");
}

// The LM head in FP8 only under precision fp8, and only untied (a tied head is the embedding table).
TEST(ConfigErrors, Fp8LmHeadNeedsFp8AndAnUntiedHead) {
  const std::string cuda = with_value("training.device", "cuda").text;
  EXPECT_NE(error_of(cuda, {"training.precision=bf16", "training.fp8_lm_head=true"})
                .find("training.fp8_lm_head: expected false with training.precision = bf16"),
            std::string::npos);
  EXPECT_NE(error_of(cuda, {"training.precision=fp8", "training.fp8_lm_head=true", "model.tie_word_embeddings=true"})
                .find("training.fp8_lm_head: expected false with model.tie_word_embeddings = true"),
            std::string::npos);
  const Config ok = parse_config(cuda, kSource, {"training.precision=fp8", "training.fp8_lm_head=true"});
  EXPECT_TRUE(ok.training.fp8_lm_head);
}

TEST(ConfigErrors, ResumeMustBeAutoNeverOrAnExistingPath) {
  expect_rejected("checkpoint.resume", "runs/none/step_1", "expected auto, never or the path of an existing checkpoint");
  const std::string existing = testing::TempDir();
  EXPECT_EQ(parse_config(with_value("checkpoint.resume", existing).text, kSource).checkpoint.resume, existing);
  EXPECT_EQ(parse_config(with_value("checkpoint.resume", "never").text, kSource).checkpoint.resume, "never");
}

TEST(ConfigErrors, WarmupLongerThanTraining) {
  expect_rejected("training.warmup_steps", "1001", "expected at most training.max_steps = 1000, got 1001");
}

TEST(ConfigErrors, Bf16OnCpu) {
  const std::string text = with_value("training.device", "cpu").text;
  const std::string message = error_of(text, {"training.precision=bf16"});
  EXPECT_NE(message.find("test.yaml: --set 'training.precision=bf16': training.precision: expected fp32"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("bf16 training needs a GPU"), std::string::npos) << message;
  // bf16 with device auto or cuda is the GPU's business, not the config's
  EXPECT_NO_THROW(parse_config(base_yaml(), kSource, {"training.precision=bf16", "training.device=cuda"}));
}

TEST(ConfigErrors, MqarSequenceTooShort) {
  expect_rejected("data.seq_len", "31",
                  "expected at least 2*8 positions for the pairs plus 2*8 for the query-answer slots = 32");
  EXPECT_NO_THROW(parse_config(with_value("data.seq_len", "32").text, kSource));
}

TEST(ConfigErrors, TokenTaskNeedsTrainData) {
  const std::string message = error_of(with_value("data.task", "tokens").text);
  EXPECT_NE(message.find("data.train_data: expected the path prefix of shards"), std::string::npos) << message;
  // The shards themselves are looked for when training opens them (DataSources tests), not here.
  EXPECT_NO_THROW(parse_config(base_yaml(), kSource, {"data.task=tokens", "data.train_data=somewhere/wt2"}));
}

TEST(ConfigErrors, MqarVocabularyTooSmall) {
  expect_rejected("model.vocab_size", "16", "expected at least 1 noise token + 8 keys + 8 values = 17, got 16");
  EXPECT_NO_THROW(parse_config(with_value("model.vocab_size", "17").text, kSource));
}

TEST(ConfigErrors, MqarNumKeysOutOfRange) {
  expect_rejected("data.mqar.num_keys", "7", "a count in [num_kv_pairs, vocab_size - 1 - num_kv_pairs] = [8, 119]");
  expect_rejected("data.mqar.num_keys", "120", "= [8, 119]");
  EXPECT_NO_THROW(parse_config(with_value("data.mqar.num_keys", "119").text, kSource));
}

// The MQAR layout keys given with --set: the message names the --set, the key and what was expected.
void expect_mqar_setting_rejected(const std::vector<std::string>& overrides, const std::string& key,
                                  const std::string& expected) {
  const std::string message = error_of(base_yaml(), overrides);
  EXPECT_NE(message.find("--set '" + overrides.back() + "': " + key + ": "), std::string::npos) << message;
  EXPECT_NE(message.find(expected), std::string::npos) << message;
}

TEST(ConfigErrors, MqarLayoutKeys) {
  expect_mqar_setting_rejected({"data.mqar.query_placement=powerlaw"}, "data.mqar.query_placement",
                               "expected one of uniform | power_law, got 'powerlaw' (did you mean power_law?)");
  expect_mqar_setting_rejected({"data.mqar.query_placement=power_law", "data.mqar.power_a=0"}, "data.mqar.power_a",
                               "expected a number in (0.0, 1.0], got 0.0");
  expect_mqar_setting_rejected({"data.mqar.query_placement=power_law", "data.mqar.power_a=1.5"},
                               "data.mqar.power_a", "expected a number in (0.0, 1.0], got 1.5");
  expect_mqar_setting_rejected({"data.mqar.power_a=0.5"}, "data.mqar.power_a",
                               "applies only with data.mqar.query_placement = power_law");
  expect_mqar_setting_rejected({"data.mqar.filler=noise"}, "data.mqar.filler", "expected one of zero | random");
  expect_mqar_setting_rejected({"data.mqar.num_train_sequences=-1"}, "data.mqar.num_train_sequences",
                               "expected 0 or a positive integer, got -1");
  expect_mqar_setting_rejected({"data.mqar.num_train_sequences=4294967296"}, "data.mqar.num_train_sequences",
                               "at most 2147483648 sequences");
  const Config zoology = parse_config(base_yaml(), kSource,
                                      {"data.mqar.query_placement=power_law", "data.mqar.power_a=1",
                                       "data.mqar.filler=random", "data.mqar.num_train_sequences=100000"});
  EXPECT_EQ(zoology.data.mqar.query_placement, "power_law");
  EXPECT_EQ(zoology.data.mqar.power_a, 1.0);
  EXPECT_EQ(zoology.data.mqar.filler, "random");
  EXPECT_EQ(zoology.data.mqar.num_train_sequences, 100000);
  EXPECT_EQ(parse_config(config_to_yaml(zoology), kSource), zoology);
  // The defaults: hgrn's layout, as before these keys existed; power_a at its default is taken with uniform.
  const Config plain = parse_config(base_yaml(), kSource, {"data.mqar.power_a=0.01"});
  EXPECT_EQ(plain.data.mqar.power_a, 0.01);
  EXPECT_EQ(plain.data.mqar.query_placement, "uniform");
  EXPECT_EQ(plain.data.mqar.filler, "zero");
  EXPECT_EQ(plain.data.mqar.num_train_sequences, 0);
}

TEST(ConfigErrors, DocumentResetsNeedDocuments) {
  // MQAR has no EOS token, so no document starts: the key is refused there, and taken with token shards.
  expect_rejected("data.reset_state_at_document", "true", "expected false with data.task = mqar");
  const Config c = parse_config(
      base_yaml(), kSource, {"data.task=tokens", "data.train_data=somewhere/wt2", "data.reset_state_at_document=true"});
  EXPECT_TRUE(c.data.reset_state_at_document);
  EXPECT_FALSE(parse_config(base_yaml(), kSource).data.reset_state_at_document);
}

TEST(ConfigErrors, DefaultValueThatCannotWorkSaysItIsTheDefault) {
  // vocab_size is left at its default (256) but 200 pairs need 401 ids.
  const std::string message = error_of("model:\n  expand_ratio: 16\ndata:\n  seq_len: 800\n  mqar:\n    num_kv_pairs: 200\n");
  EXPECT_NE(message.find("test.yaml: model.vocab_size: too small"), std::string::npos) << message;
  EXPECT_NE(message.find("this is the default value"), std::string::npos) << message;
}

// ---- --set overrides ----

TEST(ConfigOverrides, ApplyInOrderAfterTheFile) {
  const Config c = parse_config(base_yaml(), kSource,
                                {"model.hidden_size=128", "data.mqar.num_kv_pairs=4", "training.lr=1e-3",
                                 "logging.run_dir=runs/x y", "model.num_heads=8", "model.expand_ratio=null",
                                 "training.max_steps=10", "training.warmup_steps=5", "training.max_steps=20",
                                 "model.use_lower_bound=false"});
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.data.mqar.num_kv_pairs, 4);
  EXPECT_DOUBLE_EQ(c.training.lr, 1e-3);
  EXPECT_EQ(c.logging.run_dir, "runs/x y");
  EXPECT_FALSE(c.model.expand_ratio.has_value());
  EXPECT_EQ(c.model.heads(), 8);
  EXPECT_EQ(c.model.key_dim(), 16);
  EXPECT_EQ(c.training.max_steps, 20);  // the later one wins
  EXPECT_FALSE(c.model.use_lower_bound);
}

TEST(ConfigOverrides, UnknownKeyIsRejectedAndSaysItCameFromSet) {
  std::string message = error_of(base_yaml(), {"model.hidden_sise=3"});
  EXPECT_NE(message.find("test.yaml: --set 'model.hidden_sise=3': model.hidden_sise: unknown key (did you mean "
                         "model.hidden_size?)"),
            std::string::npos)
      << message;
  message = error_of(base_yaml(), {"modle.hidden_size=3"});
  EXPECT_NE(message.find("--set 'modle.hidden_size=3': modle.hidden_size: unknown key (did you mean "
                         "model.hidden_size?)"),
            std::string::npos)
      << message;
}

TEST(ConfigOverrides, WrongTypeFromSet) {
  const std::string message = error_of(base_yaml(), {"training.max_steps=lots"});
  EXPECT_NE(message.find("test.yaml: --set 'training.max_steps=lots': training.max_steps: expected an integer, got "
                         "the string 'lots'"),
            std::string::npos)
      << message;
}

TEST(ConfigOverrides, MalformedOverride) {
  std::string message = error_of(base_yaml(), {"training.max_steps"});
  EXPECT_NE(message.find("--set 'training.max_steps': training.max_steps: expected section.key=value"),
            std::string::npos)
      << message;
  message = error_of(base_yaml(), {"model=3"});
  EXPECT_NE(message.find("--set 'model=3': model: is a section; --set takes one key inside it, e.g. "
                         "model.type=..."),
            std::string::npos)
      << message;
  message = error_of(base_yaml(), {"training.lr=[1"});
  EXPECT_NE(message.find("training.lr: the value is not a valid YAML scalar"), std::string::npos) << message;
}

TEST(ConfigOverrides, CrossKeyCheckPointsAtTheOverride) {
  const std::string message = error_of(base_yaml(), {"model.expand_ratio=7"});
  EXPECT_NE(message.find("test.yaml: --set 'model.expand_ratio=7': model.expand_ratio: expected a divisor of "
                         "model.hidden_size = 64"),
            std::string::npos)
      << message;
}

// ---- writing ----

TEST(ConfigYaml, EmitsEveryKeyWithUnsetOptionalsAsNull) {
  const Config c = parse_config(base_yaml(), kSource);
  const std::string yaml = config_to_yaml(c);
  for (const char* line : {"  num_heads: null\n", "  intermediate_size: null\n", "  expand_ratio: 16\n",
                           "  mqar:\n    num_kv_pairs: 8\n    num_keys: 0\n", "  decay_embeddings: false\n",
                           "  grad_clip: 1.0\n", "  metrics_file: metrics.jsonl\n", "  resume: auto\n"})
    EXPECT_NE(yaml.find(line), std::string::npos) << "missing " << line << " in\n" << yaml;
}

TEST(ConfigYaml, RoundTripGivesTheSameConfig) {
  Config c = parse_config(base_yaml(), kSource);
  EXPECT_EQ(parse_config(config_to_yaml(c), kSource), c);

  // Values that only survive with exact float formatting and string quoting.
  c.training.lr = 0.1 + 0.2;
  c.training.adam_eps = 1e-15;
  c.model.norm_eps = 3.0;
  c.training.seed = 18446744073709551615ull;
  c.model.num_heads = 4;
  c.model.intermediate_size = 100;
  c.model.tie_word_embeddings = true;
  c.training.schedule = "wsd";
  c.logging.run_dir = "runs/a b: #c \"d\"\\e";
  c.logging.metrics_file = "yes";
  c.checkpoint.resume = "never";
  validate_config(c);
  const Config back = parse_config(config_to_yaml(c), kSource);
  EXPECT_EQ(back, c) << config_to_yaml(c);
  EXPECT_EQ(back.logging.run_dir, c.logging.run_dir);
  EXPECT_EQ(back.training.lr, c.training.lr);
  EXPECT_EQ(back.training.seed, c.training.seed);

  c.logging.run_dir = "123";  // a number-looking string stays a string
  EXPECT_EQ(parse_config(config_to_yaml(c), kSource).logging.run_dir, "123");
}

TEST(ConfigYaml, ValidateConfigBuiltInCode) {
  Config c;
  c.model.expand_ratio = 16;
  c.model.vocab_size = 128;
  EXPECT_NO_THROW(validate_config(c));
  c.training.lr = 0;
  EXPECT_THROW(validate_config(c), ConfigError);
}

// ---- the shipped configs ----

std::vector<std::filesystem::path> shipped_configs() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HGRN_SOURCE_DIR) + "/configs"))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

int64_t param_total(const ModelConfig& m) {
  int64_t total = 0;
  for (const ParamSpec& spec : model_param_specs(m)) total += shape_numel(spec.shape);
  return total;
}

TEST(ConfigFiles, EveryShippedConfigParsesAndRoundTrips) {
  const auto files = shipped_configs();
  ASSERT_GE(files.size(), 4u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    Config c;
    ASSERT_NO_THROW(c = load_config(path.string()));
    EXPECT_EQ(c.source, path.string());
    EXPECT_EQ(parse_config(config_to_yaml(c), c.source), c);
  }
}

TEST(ConfigFiles, DefaultConfigNeedsNoDownloadAndFitsACpu) {
  // The README's main command trains this config on any machine: a built-in task, any device, a small model.
  const Config c = load_config(std::string(HGRN_SOURCE_DIR) + "/configs/mqar-tiny.yaml");
  EXPECT_EQ(c.data.task, "mqar");
  EXPECT_EQ(c.training.device, "auto");
  EXPECT_EQ(c.training.precision, "fp32");
  int64_t params = 0;
  for (const ParamSpec& spec : model_param_specs(c.model)) params += shape_numel(spec.shape);
  EXPECT_LT(params, 2'000'000);
  EXPECT_LT(c.training.max_steps * c.training.micro_batch_size * c.data.seq_len, 10'000'000);  // tokens
}

TEST(ConfigFiles, PeerBaselineShapesHaveThePeerParameterCounts) {
  // docs/peer-baseline.md: 183.5M, 437.1M and 1131.0M parameters (fla, vocab 50304, untied).
  const std::vector<std::tuple<std::string, int64_t, int64_t, int64_t, double>> expected = {
      {"hgrn2-150m.yaml", 15, 768, 16, 183.5e6}, {"hgrn2-385m.yaml", 26, 1024, 16, 437.1e6},
      {"hgrn2-1b.yaml", 18, 2048, 8, 1131.0e6}};
  for (const auto& [file, layers, hidden, batch, params] : expected) {
    SCOPED_TRACE(file);
    const Config c = load_config(std::string(HGRN_SOURCE_DIR) + "/configs/" + file);
    EXPECT_EQ(c.model.num_hidden_layers, layers);
    EXPECT_EQ(c.model.hidden_size, hidden);
    EXPECT_EQ(c.model.expand_ratio, 128);
    EXPECT_EQ(c.model.vocab_size, 50304);
    EXPECT_EQ(c.data.seq_len, 2048);
    EXPECT_EQ(c.training.micro_batch_size, batch);
    EXPECT_NEAR(static_cast<double>(param_total(c.model)), params, 0.05e6);
  }
}

// ---- did-you-mean ----

TEST(ConfigSuggest, ClosestNameNeedsToBeClose) {
  EXPECT_EQ(edit_distance("hidden", "hiddne"), 1);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(closest_name("trian", {"train", "info"}), "train");
  EXPECT_EQ(closest_name("Train", {"train", "info"}), "train");
  EXPECT_EQ(closest_name("optimizer", {"train", "info"}), "");
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

TEST(ConfigErrors, InitFromNeedsAHuggingFaceDirectory) {
  const std::string missing = ::testing::TempDir() + "/no-hf-model";
  const std::string message = error_of(base_yaml(), {"checkpoint.init_from=" + missing});
  EXPECT_NE(message.find("checkpoint.init_from: expected a Hugging Face model directory"), std::string::npos)
      << message;
  EXPECT_NE(message.find(missing + "/config.json"), std::string::npos) << message;
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

const std::string kModel = "model: {hidden_size: 64, expand_ratio: 16}\n";

TEST(ConfigBatch, GlobalBatchSizeDerivesTheAccumulationStepsPerWorldSize) {
  const std::string text = kModel + "training: {micro_batch_size: 4, global_batch_size: 32}\n";
  const Config c = parse_config(text, "batch.yaml");
  EXPECT_EQ(resolve_batch_for_world(c.training, 1).grad_accum_steps, 8);
  EXPECT_EQ(resolve_batch_for_world(c.training, 2).grad_accum_steps, 4);
  EXPECT_EQ(resolve_batch_for_world(c.training, 8).grad_accum_steps, 1);
  try {
    resolve_batch_for_world(c.training, 3);  // 32 sequences do not split over 3 ranks x 4
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not split into micro_batch_size (4) x ranks (3)"), std::string::npos)
        << e.what();
  }
  // Unset (0): the accumulation steps are the config's own.
  EXPECT_EQ(resolve_batch_for_world(parse_config(kModel + "training: {grad_accum_steps: 3}\n", "b.yaml").training, 4)
                .grad_accum_steps,
            3);
}

TEST(ConfigBatch, GlobalBatchSizeWithAccumulationStepsOrNotAMultipleIsRejected) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {kModel + "training: {global_batch_size: 32, grad_accum_steps: 2}\n", "set either global_batch_size"},
           {kModel + "training: {micro_batch_size: 5, global_batch_size: 32}\n", "expected a multiple of training.micro_batch_size = 5"},
           {kModel + "training: {global_batch_size: -8}\n", "expected 0 or a positive integer, got -8"}}) {
    try {
      parse_config(text, "batch.yaml");
      FAIL() << "expected a ConfigError for " << text;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("training.global_batch_size"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

TEST(ConfigModelTypes, EachMemberIsAcceptedAndAnUnknownTypeListsThem) {
  EXPECT_EQ(parse_config(base_yaml(), kSource).model.type, "hgrn2");  // the default: configs without a type
  EXPECT_EQ(parse_config(base_yaml(), kSource, {"model.type=hgrn", "model.expand_ratio=2"}).model.type, "hgrn");
  const std::string message = error_of(base_yaml(), {"model.type=hgrn3"});
  EXPECT_NE(message.find("model.type: expected one of hgrn2 | hgrn | gla | retnet, got 'hgrn3'"), std::string::npos) << message;
}

TEST(ConfigModelTypes, AKeyOfAnotherMemberIsRefusedNamingItsType) {
  const Edited edited = with_value("model.type", "hgrn");
  std::string text = edited.text + "";
  // num_heads, which HGRN1 has not: set in an HGRN1 config, the message says whose key it is and points at it.
  const std::string heads = error_of(text, {"model.num_heads=4"});
  EXPECT_NE(heads.find("model.num_heads: belongs to model.type hgrn2 (HGRN2), gla (GLA) or retnet (RetNet); this "
                       "config's model.type is hgrn"),
            std::string::npos)
      << heads;
  EXPECT_NE(heads.find("--set 'model.num_heads=4'"), std::string::npos) << heads;
  const std::string states = error_of(text, {"model.memory.keep_recurrence_states=3"});
  EXPECT_NE(states.find("model.memory.keep_recurrence_states: belongs to model.type hgrn2"), std::string::npos)
      << states;
}

// GLA: fla's layout keys (num_heads, expand_k, expand_v; null takes GLAConfig's default), none of HGRN's (nor does
// RetNet take them).
TEST(ConfigModelTypes, GlaTakesItsHeadLayoutAndRefusesTheHgrnKeys) {
  const std::vector<std::string> gla{"model.type=gla", "model.expand_ratio=null"};
  const Config defaults = parse_config(base_yaml(), kSource, gla);
  EXPECT_EQ(defaults.model.type, "gla");
  EXPECT_FALSE(defaults.model.expand_k.has_value());
  EXPECT_FALSE(lower_bounded(defaults.model));  // use_lower_bound stays at its default, and means nothing here
  std::vector<std::string> set = gla;
  set.insert(set.end(), {"model.num_heads=2", "model.expand_k=1", "model.expand_v=0.5"});
  const Config c = parse_config(base_yaml(), kSource, set);
  EXPECT_EQ(c.model.num_heads, std::optional<int64_t>(2));
  EXPECT_EQ(c.model.expand_k, std::optional<double>(1.0));
  EXPECT_EQ(c.model.expand_v, std::optional<double>(0.5));
  // The resolved YAML keeps GLA's keys, drops HGRN's, and reads back as the same config.
  const std::string yaml = config_to_yaml(c);
  EXPECT_NE(yaml.find("expand_k: 1.0"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("expand_ratio"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("use_lower_bound"), std::string::npos) << yaml;
  EXPECT_EQ(parse_config(yaml, kSource), c);

  for (const std::string type : {"gla", "retnet"}) {
    for (const auto& [key, owners] : std::vector<std::pair<std::string, std::string>>{
             {"model.expand_ratio=16", "hgrn2 (HGRN2) or hgrn (HGRN1)"},
             {"model.use_lower_bound=false", "hgrn2 (HGRN2) or hgrn (HGRN1)"},
             {"model.complex=true", "hgrn (HGRN1)"}}) {
      const std::string message = error_of(base_yaml(), {"model.type=" + type, "model.expand_ratio=null", key});
      EXPECT_NE(message.find(key.substr(0, key.find('=')) + ": belongs to model.type " + owners +
                             "; this config's model.type is " + type),
                std::string::npos)
          << message;
    }
  }
  // expand_k and expand_v are not HGRN2's.
  const std::string hgrn2 = error_of(base_yaml(), {"model.expand_k=0.5"});
  EXPECT_NE(hgrn2.find("model.expand_k: belongs to model.type gla (GLA) or retnet (RetNet); this config's model.type "
                       "is hgrn2"),
            std::string::npos)
      << hgrn2;
}

TEST(ConfigModelTypes, GlaHeadLayoutsFlaWouldRejectAreRefused) {
  const std::vector<std::string> gla{"model.type=gla", "model.expand_ratio=null"};  // hidden_size 64
  for (const auto& [extra, expected] : std::vector<std::pair<std::string, std::string>>{
           {"model.num_heads=0", "model.num_heads: expected a positive integer, got 0"},
           {"model.num_heads=3", "model.expand_k: hidden_size x expand_k = 32 must be divisible by num_heads = 3"},
           {"model.expand_k=0.3", "model.expand_k: expected a positive number that makes hidden_size x expand_k an "
                                  "integer (64 x 0.3 is not)"},
           {"model.expand_v=-1", "model.expand_v: expected a positive number"},
           {"model.expand_k='half'", "model.expand_k: expected a number or null"}}) {
    std::vector<std::string> overrides = gla;
    overrides.push_back(extra);
    const std::string message = error_of(base_yaml(), overrides);
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
}

TEST(ConfigModelTypes, ComplexIsHgrnsOwnOnEitherDevice) {
  // model.complex (the HGRN1 paper's complex HGRU) is HGRN1's key: refused for hgrn2, taken for hgrn on the CPU and
  // on the GPU (its ops have CUDA kernels).
  const std::string refused = error_of(base_yaml(), {"model.complex=true"});
  EXPECT_NE(refused.find("model.complex: belongs to model.type hgrn (HGRN1); this config's model.type is hgrn2"),
            std::string::npos)
      << refused;
  EXPECT_FALSE(parse_config(base_yaml(), kSource, {"model.complex=false"}).model.complex);  // the default is fine
  const std::vector<std::string> complex_hgrn{"model.type=hgrn", "model.expand_ratio=1", "model.complex=true"};
  std::vector<std::string> on_cpu = complex_hgrn;
  on_cpu.push_back("training.device=cpu");
  EXPECT_TRUE(parse_config(base_yaml(), kSource, on_cpu).model.complex);
  std::vector<std::string> on_gpu = complex_hgrn;
  on_gpu.push_back("training.device=cuda");
  EXPECT_TRUE(parse_config(base_yaml(), kSource, on_gpu).model.complex);
  EXPECT_EQ(model_family("hgrn").cuda_refusal(parse_config(base_yaml(), kSource, on_gpu).model), "");
}

TEST(ConfigModelTypes, MovedMemoryKnobsNameTheirNewPlace) {
  const std::string text = base_yaml() + "";
  // In the file: the training section gains an old key.
  std::string old_file = text;
  old_file.replace(old_file.find("training:\n"), 10, "training:\n  recompute_gates: false\n");
  const std::string in_file = error_of(old_file);
  EXPECT_NE(in_file.find("training.recompute_gates: this key has moved to model.memory.recompute_gates"),
            std::string::npos)
      << in_file;
  EXPECT_NE(in_file.find(std::string(kSource) + ":"), std::string::npos) << in_file;
  const std::string in_set = error_of(text, {"training.keep_recurrence_states=2"});
  EXPECT_NE(in_set.find("has moved to model.memory.keep_recurrence_states"), std::string::npos) << in_set;
  // The new place takes them.
  const Config c = parse_config(text, kSource, {"model.memory.recompute_gates=false",
                                                "model.memory.keep_recurrence_states=2"});
  EXPECT_FALSE(c.model.memory.recompute_gates);
  EXPECT_EQ(c.model.memory.keep_recurrence_states, 2);
  // A checkpoint's stored config from before the move reads them at their new place.
  const Config stored = parse_stored_config(old_file, "stored");
  EXPECT_FALSE(stored.model.memory.recompute_gates);
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

TEST(ConfigOverrides, AShorterMaxStepsCutsTheFilesWarmupWithANote) {
  // base_yaml() sets warmup_steps to 100 in the file; a quick run's --set max_steps=3 cuts it to 3 and says so.
  const Config quick = parse_config(base_yaml(), kSource, {"training.max_steps=3"});
  EXPECT_EQ(quick.training.warmup_steps, 3);
  ASSERT_EQ(quick.notes.size(), 1u);
  EXPECT_NE(quick.notes[0].find("training.warmup_steps cut from 100 to 3"), std::string::npos) << quick.notes[0];
  // Both set on the command line, or both in the file: a contradiction the user wrote, refused as before.
  const std::string both = error_of(base_yaml(), {"training.max_steps=3", "training.warmup_steps=10"});
  EXPECT_NE(both.find("training.warmup_steps: expected at most training.max_steps = 3, got 10"), std::string::npos)
      << both;
  EXPECT_EQ(error_of(with_value("training.max_steps", "3").text).find("cut"), std::string::npos);
  EXPECT_TRUE(parse_config(base_yaml(), kSource).notes.empty());
}

}  // namespace
}  // namespace hgrn
