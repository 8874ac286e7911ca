// config.cpp: reading, validating and writing the run configuration (config.h): the YAML file, `--set` overrides,
// fla's HGRN2Config head/width rules, and error messages that name the file, line, key and what was expected.
#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <variant>

#include "config/suggest.h"
#include "core/checked_math.h"
#include "models/registry.h"

namespace hgrn {

// ------------------------------------------------------------------------------------------------------------------
// Derived model sizes.

int64_t ModelConfig::heads() const {
  if (expand_ratio) {
    if (*expand_ratio <= 0) throw ConfigError("model.expand_ratio must be positive, got " + std::to_string(*expand_ratio));
    return hidden_size / *expand_ratio;
  }
  if (num_heads) {
    if (*num_heads <= 0) throw ConfigError("model.num_heads must be positive, got " + std::to_string(*num_heads));
    return *num_heads;
  }
  throw ConfigError("model: set model.expand_ratio or model.num_heads (fla's HGRN2Config needs one of them)");
}

int64_t ModelConfig::key_dim() const {
  if (expand_ratio) return *expand_ratio;
  return hidden_size / heads();
}

int64_t ModelConfig::value_dim() const { return hidden_size / heads(); }

int64_t ModelConfig::mlp_size() const {
  if (intermediate_size) return *intermediate_size;
  // fla: int(D * hidden_ratio * 2 / 3), rounded up to a multiple of 256 (all quantities positive: / is floor).
  const int64_t two_thirds =
      checked_mul(checked_mul(hidden_size, hidden_ratio, "model.hidden_size x model.hidden_ratio"), 2,
                  "the MLP width") / 3;
  return 256 * ((two_thirds + 255) / 256);
}

int64_t mqar_key_count(const Config& config) {
  if (config.data.mqar.num_keys > 0) return config.data.mqar.num_keys;
  return (config.model.vocab_size - 1) / 2;
}

int64_t mqar_value_count(const Config& config) { return config.model.vocab_size - 1 - mqar_key_count(config); }

namespace {

// The model.* keys that other family members own and `type` does not (several members may own a key).
std::set<std::string> foreign_model_keys(const std::string& type) {
  const std::vector<std::string> names = model_type_names();
  const bool known = std::find(names.begin(), names.end(), type) != names.end();
  const std::vector<std::string> own = known ? model_family(type).own_keys() : std::vector<std::string>{};
  std::set<std::string> foreign;
  for (const std::string& other : model_type_names())
    for (const std::string& key : model_family(other).own_keys())
      if (std::find(own.begin(), own.end(), key) == own.end()) foreign.insert(key);
  return foreign;
}

// ------------------------------------------------------------------------------------------------------------------
// The schema: every key, in file order, bound to the field it sets. Reading, --set and writing all walk this one
// table, which is what makes parse_config(config_to_yaml(c)) == c hold by construction.

using FieldRef = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::optional<int64_t>*,
                              std::optional<double>*>;

struct Field {
  std::string path;  // e.g. "data.mqar.num_kv_pairs"
  FieldRef ref;
};

std::vector<Field> config_fields(Config& c) {
  ModelConfig& m = c.model;
  DataConfig& d = c.data;
  TrainingConfig& t = c.training;
  CheckpointConfig& k = c.checkpoint;
  LoggingConfig& l = c.logging;
  return {
      {"model.type", &m.type},
      {"model.hidden_size", &m.hidden_size},
      {"model.num_hidden_layers", &m.num_hidden_layers},
      {"model.expand_ratio", &m.expand_ratio},
      {"model.num_heads", &m.num_heads},
      {"model.expand_k", &m.expand_k},
      {"model.expand_v", &m.expand_v},
      {"model.vocab_size", &m.vocab_size},
      {"model.hidden_ratio", &m.hidden_ratio},
      {"model.intermediate_size", &m.intermediate_size},
      {"model.use_lower_bound", &m.use_lower_bound},
      {"model.norm_eps", &m.norm_eps},
      {"model.tie_word_embeddings", &m.tie_word_embeddings},
      {"model.initializer_range", &m.initializer_range},
      {"model.attn_mode", &m.attn_mode},
      {"model.complex", &m.complex},
      {"model.memory.recompute", &m.memory.recompute},
      {"model.memory.recompute_elementwise", &m.memory.recompute_elementwise},
      {"model.memory.keep_elementwise_layers", &m.memory.keep_elementwise_layers},
      {"model.memory.recompute_mlp_projections", &m.memory.recompute_mlp_projections},
      {"model.memory.recompute_gates", &m.memory.recompute_gates},
      {"model.memory.recompute_weight_copies", &m.memory.recompute_weight_copies},
      {"model.memory.recompute_gates_layers", &m.memory.recompute_gates_layers},
      {"model.memory.keep_recurrence_states", &m.memory.keep_recurrence_states},
      {"data.task", &d.task},
      {"data.seq_len", &d.seq_len},
      {"data.train_data", &d.train_data},
      {"data.valid_data", &d.valid_data},
      {"data.shuffle", &d.shuffle},
      {"data.stateful", &d.stateful},
      {"data.reset_state_at_document", &d.reset_state_at_document},
      {"data.mqar.num_kv_pairs", &d.mqar.num_kv_pairs},
      {"data.mqar.num_keys", &d.mqar.num_keys},
      {"data.mqar.query_placement", &d.mqar.query_placement},
      {"data.mqar.power_a", &d.mqar.power_a},
      {"data.mqar.filler", &d.mqar.filler},
      {"data.mqar.num_train_sequences", &d.mqar.num_train_sequences},
      {"training.device", &t.device},
      {"training.precision", &t.precision},
      {"training.fp8_lm_head", &t.fp8_lm_head},
      {"training.seed", &t.seed},
      {"training.micro_batch_size", &t.micro_batch_size},
      {"training.grad_accum_steps", &t.grad_accum_steps},
      {"training.global_batch_size", &t.global_batch_size},
      {"training.max_steps", &t.max_steps},
      {"training.lr", &t.lr},
      {"training.min_lr_ratio", &t.min_lr_ratio},
      {"training.schedule", &t.schedule},
      {"training.warmup_steps", &t.warmup_steps},
      {"training.decay_fraction", &t.decay_fraction},
      {"training.weight_decay", &t.weight_decay},
      {"training.decay_embeddings", &t.decay_embeddings},
      {"training.deterministic", &t.deterministic},
      {"training.zero1", &t.zero1},
      {"training.overlap_reductions", &t.overlap_reductions},
      {"training.grad_reduce_dtype", &t.grad_reduce_dtype},
      {"training.collective_timeout_s", &t.collective_timeout_s},
      {"training.beta1", &t.beta1},
      {"training.beta2", &t.beta2},
      {"training.adam_eps", &t.adam_eps},
      {"training.grad_clip", &t.grad_clip},
      {"training.max_nonfinite_steps", &t.max_nonfinite_steps},
      {"training.threads", &t.threads},
      {"training.eval_interval", &t.eval_interval},
      {"training.eval_batches", &t.eval_batches},
      {"checkpoint.interval", &k.interval},
      {"checkpoint.keep_last", &k.keep_last},
      {"checkpoint.keep_every", &k.keep_every},
      {"checkpoint.resume", &k.resume},
      {"checkpoint.init_from", &k.init_from},
      {"logging.run_dir", &l.run_dir},
      {"logging.log_interval", &l.log_interval},
      {"logging.metrics_file", &l.metrics_file},
  };
}

const std::vector<std::string>& section_paths() {
  static const std::vector<std::string> sections = {"model",    "model.memory", "data",   "data.mqar",
                                                     "training", "checkpoint",   "logging"};
  return sections;
}

// Keys that have moved: an old name is refused with its new place (a checkpoint's stored config is migrated).
const std::map<std::string, std::string>& moved_keys() {
  static const std::map<std::string, std::string> moved = [] {
    std::map<std::string, std::string> m;
    for (const char* knob : {"recompute", "recompute_elementwise", "recompute_mlp_projections", "recompute_gates",
                             "recompute_weight_copies", "recompute_gates_layers", "keep_recurrence_states"})
      m[std::string("training.") + knob] = std::string("model.memory.") + knob;
    return m;
  }();
  return moved;
}

std::string moved_key_problem(const std::string& old_path, const std::string& new_path) {
  return "this key has moved to " + new_path + " (the layer's memory and recompute knobs belong to the model: put it "
         "under model: memory:, or --set " + new_path + "=...)";
}

bool is_section(const std::string& path) {
  for (const std::string& s : section_paths())
    if (s == path) return true;
  return false;
}

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string parent_path(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

std::string leaf_name(const std::string& path) {
  const size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string join_list(const std::vector<std::string>& items, const std::string& separator = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

// The names (leaf only) of the keys and sections directly inside `prefix` ("" = the top level).
std::vector<std::string> child_names(const std::string& prefix) {
  Config scratch;
  std::vector<std::string> names;
  auto add = [&](const std::string& path) {
    if (parent_path(path) != prefix) return;
    const std::string name = leaf_name(path);
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  };
  for (const Field& f : config_fields(scratch)) add(f.path);
  for (const std::string& s : section_paths()) add(s);
  return names;
}

// Why `path` is unknown, with the most useful hint: a close sibling, the same key in another section, or the list.
std::string unknown_key_problem(const std::string& path) {
  const std::string prefix = parent_path(path);
  const std::string leaf = leaf_name(path);
  Config scratch;
  std::vector<std::string> all_paths = section_paths();
  for (const Field& f : config_fields(scratch)) all_paths.push_back(f.path);

  if (prefix.empty() || is_section(prefix)) {
    const std::string sibling = closest_name(leaf, child_names(prefix));
    if (!sibling.empty()) return "unknown key (did you mean " + join_path(prefix, sibling) + "?)";
    for (const std::string& candidate : all_paths)
      if (leaf_name(candidate) == leaf)
        return "unknown key (did you mean " + candidate + "? it belongs in the " + parent_path(candidate) +
               (parent_path(candidate).empty() ? "top level" : " section") + ")";
    if (prefix.empty())
      return "unknown section; expected one of: " + join_list(child_names(""));
    return "unknown key; the keys of " + prefix + " are: " + join_list(child_names(prefix));
  }
  // The section part itself is wrong (e.g. a --set of "modle.hidden_size"): compare whole paths.
  const std::string whole = closest_name(path, all_paths);
  if (!whole.empty()) return "unknown key (did you mean " + whole + "?)";
  for (const std::string& candidate : all_paths)
    if (leaf_name(candidate) == leaf) return "unknown key (did you mean " + candidate + "?)";
  return "unknown key; the sections are: " + join_list(child_names(""));
}

// ------------------------------------------------------------------------------------------------------------------
// Scalars. yaml-cpp tags plain scalars "?" and quoted ones "!": a quoted "64" is a string, not an integer, exactly as
// any other YAML reader would see it, so it is rejected for numeric keys rather than silently converted.

bool is_quoted(const YAML::Node& node) { return node.Tag() == "!"; }

bool is_integer_literal(const std::string& s) {
  static const std::regex pattern("[-+]?[0-9]+");
  return std::regex_match(s, pattern);
}

bool is_float_literal(const std::string& s) {
  static const std::regex pattern("[-+]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][-+]?[0-9]+)?");
  return std::regex_match(s, pattern);
}

bool is_bool_literal(const std::string& s, bool* value = nullptr) {
  if (s == "true" || s == "True" || s == "TRUE") {
    if (value) *value = true;
    return true;
  }
  if (s == "false" || s == "False" || s == "FALSE") {
    if (value) *value = false;
    return true;
  }
  return false;
}

// What a node holds, in words, for "expected X, got Y".
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "null (no value)";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Scalar: break;
    case YAML::NodeType::Undefined: return "nothing";
  }
  const std::string& s = node.Scalar();
  if (is_quoted(node)) return "the quoted string \"" + s + "\"";
  if (is_integer_literal(s)) return "the integer " + s;
  if (is_float_literal(s)) return "the number " + s + " (not an integer)";
  if (is_bool_literal(s)) return "the boolean " + s;
  return "the string '" + s + "'";
}

std::string expected_text(const FieldRef& ref) {
  struct Visitor {
    std::string operator()(int64_t*) const { return "an integer"; }
    std::string operator()(uint64_t*) const { return "a non-negative integer"; }
    std::string operator()(double*) const { return "a number"; }
    std::string operator()(bool*) const { return "true or false"; }
    std::string operator()(std::string*) const { return "a string"; }
    std::string operator()(std::optional<int64_t>*) const { return "an integer or null"; }
    std::string operator()(std::optional<double>*) const { return "a number or null"; }
  };
  return std::visit(Visitor{}, ref);
}

// Shortest text that reads back as the same double, always recognisable as a float (3 -> 3.0).
std::string format_double(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  std::string text(buffer, end);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // 'n': inf / nan never pass validation
  return text;
}

// A string as a YAML scalar: plain when every YAML reader keeps it a string, else double-quoted.
std::string format_string(const std::string& s) {
  static const std::regex plain("[A-Za-z_./][A-Za-z0-9_./+-]*");
  bool bool_like = false;
  for (const char* word : {"yes", "no", "on", "off", "y", "n", "null", "true", "false", ".inf", ".nan"}) {
    std::string lowered = s;
    for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lowered == word) bool_like = true;
  }
  if (!bool_like && std::regex_match(s, plain) && !is_float_literal(s)) return s;
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "\\x%02x", c);
          out += hex;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string format_value(const FieldRef& ref) {
  struct Visitor {
    std::string operator()(int64_t* v) const { return std::to_string(*v); }
    std::string operator()(uint64_t* v) const { return std::to_string(*v); }
    std::string operator()(double* v) const { return format_double(*v); }
    std::string operator()(bool* v) const { return *v ? "true" : "false"; }
    std::string operator()(std::string* v) const { return format_string(*v); }
    std::string operator()(std::optional<int64_t>* v) const { return *v ? std::to_string(**v) : "null"; }
    std::string operator()(std::optional<double>* v) const { return *v ? format_double(**v) : "null"; }
  };
  return std::visit(Visitor{}, ref);
}

std::string mark_text(const std::string& source, const YAML::Mark& mark) {
  if (mark.line < 0) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// ------------------------------------------------------------------------------------------------------------------
// The reader: fills a Config from the YAML tree and the overrides, remembering where each key was set, so that a
// check involving several keys (hidden_size vs expand_ratio) can still point at a line.

class ConfigReader : public ConfigChecker {
 public:
  explicit ConfigReader(std::string source, bool migrate_moved_keys = false)
      : source_(std::move(source)), migrate_moved_keys_(migrate_moved_keys) {
    config_.source = source_;
  }
  ConfigReader(Config config, std::string source) : config_(std::move(config)), source_(std::move(source)) {}

  void read_document(const YAML::Node& root) {
    if (!root.IsMap())
      fail(mark_text(source_, root.Mark()), "(top level)",
           "expected a mapping with the sections " + join_list(child_names("")) + ", got " + describe(root));
    read_mapping(root, "");
  }

  void apply_override(const std::string& text) {
    const std::string where = source_ + ": --set '" + text + "'";
    const size_t equals = text.find('=');
    if (equals == std::string::npos || equals == 0)
      fail(where, text, "expected section.key=value (e.g. model.hidden_size=128 or data.mqar.num_kv_pairs=16)");
    std::string key = text.substr(0, equals);
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.front()))) key.erase(key.begin());
    const std::string value_text = text.substr(equals + 1);
    if (is_section(key))
      fail(where, key, "is a section; --set takes one key inside it, e.g. " + key + "." + child_names(key).front() +
                           "=...");
    if (auto moved = moved_keys().find(key); moved != moved_keys().end())
      fail(where, key, moved_key_problem(key, moved->second));
    Field* field = find_field(key);
    if (!field) fail(where, key, unknown_key_problem(key));
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      fail(where, key, "the value is not a valid YAML scalar (" + e.msg + ")");
    }
    assign(*field, value, where);
    origin_[key] = where;
  }

  void validate();

  // Keys whose default differs between fla's config classes, where the config leaves them unset: the member's.
  void apply_member_defaults() {
    const std::vector<std::string> names = model_type_names();
    if (std::find(names.begin(), names.end(), config_.model.type) == names.end()) return;  // validate refuses it
    if (!is_set("model.hidden_ratio"))
      config_.model.hidden_ratio = model_family(config_.model.type).default_hidden_ratio();
  }

  Config take() { return std::move(config_); }

  // A check on a key's final value: the message points where it was set, or says it is the default.
  [[noreturn]] void fail_key(const std::string& key, const std::string& problem) const override {
    auto it = origin_.find(key);
    if (it != origin_.end()) fail(it->second, key, problem);
    fail(source_, key, problem + " (this is the default value; set " + key + " to change it)");
  }
  bool is_set(const std::string& key) const override { return origin_.count(key) > 0; }
  // Whether a key holds its default value (the same text in the written config).
  bool at_default(const std::string& key) {
    Config defaults;
    for (const Field& f : config_fields(defaults))
      if (f.path == key) return format_value(f.ref) == format_value(find_field(key)->ref);
    return false;
  }

 private:
  [[noreturn]] void fail(const std::string& where, const std::string& key, const std::string& problem) const {
    throw ConfigError(where + ": " + key + ": " + problem);
  }

  Field* find_field(const std::string& path) {
    if (fields_.empty()) fields_ = config_fields(config_);
    for (Field& f : fields_)
      if (f.path == path) return &f;
    return nullptr;
  }

  void read_mapping(const YAML::Node& mapping, const std::string& prefix) {
    std::set<std::string> seen;
    for (auto it = mapping.begin(); it != mapping.end(); ++it) {
      // Copies, not references: the iterator's operator-> returns a temporary pair (cheap: Nodes are handles).
      const YAML::Node key = it->first;
      const YAML::Node value = it->second;
      const std::string key_where = mark_text(source_, key.Mark());
      if (!key.IsScalar())
        fail(key_where, prefix.empty() ? "(top level)" : prefix, "expected a key name, got " + describe(key));
      std::string path = join_path(prefix, key.Scalar());
      if (auto moved = moved_keys().find(path); moved != moved_keys().end()) {
        if (!migrate_moved_keys_) fail(key_where, path, moved_key_problem(path, moved->second));
        path = moved->second;
      }
      if (!seen.insert(path).second) fail(key_where, path, "duplicate key (it is already set earlier in this mapping)");
      // An empty value ("key:") carries the mark of whatever follows it, so such messages point at the key instead.
      const std::string value_where = value.IsNull() ? key_where : mark_text(source_, value.Mark());
      if (is_section(path)) {
        if (value.IsNull()) continue;  // "training:" with nothing under it: all defaults
        if (!value.IsMap())
          fail(value_where, path, "expected a section (a mapping of keys: " + join_list(child_names(path)) +
                                      "), got " + describe(value));
        read_mapping(value, path);
        continue;
      }
      Field* field = find_field(path);
      if (!field) fail(key_where, path, unknown_key_problem(path));
      assign(*field, value, value_where);
      origin_[path] = value_where;
    }
  }

  void assign(Field& field, const YAML::Node& node, const std::string& where) {
    const std::string& path = field.path;
    auto wrong_type = [&]() { fail(where, path, "expected " + expected_text(field.ref) + ", got " + describe(node)); };
    if (auto* target = std::get_if<std::optional<int64_t>*>(&field.ref)) {
      if (node.IsNull()) {
        **target = std::nullopt;
        return;
      }
      if (!node.IsScalar() || is_quoted(node) || !is_integer_literal(node.Scalar())) wrong_type();
      **target = parse_integer<int64_t>(node.Scalar(), where, path);
      return;
    }
    if (auto* target = std::get_if<std::optional<double>*>(&field.ref)) {
      if (node.IsNull()) {
        **target = std::nullopt;
        return;
      }
      if (!node.IsScalar() || is_quoted(node) || !is_float_literal(node.Scalar())) wrong_type();
      const double value = std::strtod(node.Scalar().c_str(), nullptr);
      if (!std::isfinite(value)) fail(where, path, "expected a finite number, got " + node.Scalar());
      **target = value;
      return;
    }
    if (!node.IsScalar()) wrong_type();
    const std::string& text = node.Scalar();
    if (auto* target = std::get_if<std::string*>(&field.ref)) {
      **target = text;
      return;
    }
    if (is_quoted(node)) wrong_type();
    if (auto* target = std::get_if<int64_t*>(&field.ref)) {
      if (!is_integer_literal(text)) wrong_type();
      **target = parse_integer<int64_t>(text, where, path);
    } else if (auto* target = std::get_if<uint64_t*>(&field.ref)) {
      if (!is_integer_literal(text) || text[0] == '-') wrong_type();
      **target = parse_integer<uint64_t>(text[0] == '+' ? text.substr(1) : text, where, path);
    } else if (auto* target = std::get_if<double*>(&field.ref)) {
      if (!is_float_literal(text)) wrong_type();
      const double value = std::strtod(text.c_str(), nullptr);
      if (!std::isfinite(value)) fail(where, path, "expected a finite number, got " + text);
      **target = value;
    } else if (auto* target = std::get_if<bool*>(&field.ref)) {
      if (!is_bool_literal(text, *target)) wrong_type();
    }
  }

  template <typename T>
  T parse_integer(const std::string& text, const std::string& where, const std::string& path) const {
    const std::string digits = (!text.empty() && text[0] == '+') ? text.substr(1) : text;
    T value{};
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size())
      fail(where, path, "the integer " + text + " is out of range");
    return value;
  }

  // Value checks shared by validate().
  void require_positive(const std::string& key, int64_t value) const {
    if (value <= 0) fail_key(key, "expected a positive integer, got " + std::to_string(value));
  }
  void require_positive_at_most(const std::string& key, int64_t value, int64_t high) const {
    require_positive(key, value);
    if (value > high)
      fail_key(key, "expected a positive integer of at most " + std::to_string(high) + ", got " +
                        std::to_string(value));
  }
  void require_non_negative(const std::string& key, int64_t value) const {
    if (value < 0) fail_key(key, "expected 0 or a positive integer, got " + std::to_string(value));
  }
  void require_positive(const std::string& key, double value) const {
    if (!(value > 0)) fail_key(key, "expected a positive number, got " + format_double(value));
  }
  void require_in(const std::string& key, double value, double low, bool low_open, double high, bool high_open) const {
    const bool ok = (low_open ? value > low : value >= low) && (high_open ? value < high : value <= high);
    if (!ok)
      fail_key(key, std::string("expected a number in ") + (low_open ? "(" : "[") + format_double(low) + ", " +
                        format_double(high) + (high_open ? ")" : "]") + ", got " + format_double(value));
  }
  void require_one_of(const std::string& key, const std::string& value, const std::vector<std::string>& allowed) const {
    for (const std::string& a : allowed)
      if (a == value) return;
    const std::string near = closest_name(value, allowed);
    fail_key(key, "expected one of " + join_list(allowed, " | ") + ", got '" + value + "'" +
                      (near.empty() ? "" : " (did you mean " + near + "?)"));
  }

  Config config_;
  std::string source_;
  bool migrate_moved_keys_ = false;
  std::vector<Field> fields_;
  std::map<std::string, std::string> origin_;  // key path -> "file:line:col" or the --set it came from
};

void ConfigReader::validate() {
  const ModelConfig& m = config_.model;
  require_one_of("model.type", m.type, model_type_names());
  // A key only other members have is refused rather than ignored (at its default it changes nothing).
  for (const std::string& key : foreign_model_keys(m.type)) {
    if (!is_set(key) || at_default(key)) continue;
    std::vector<std::string> owners;
    for (const std::string& type : model_type_names())
      for (const std::string& own : model_family(type).own_keys())
        if (own == key) owners.push_back(type + " (" + model_family(type).display_name() + ")");
    std::string listed = owners.front();
    for (size_t i = 1; i < owners.size(); ++i) listed += (i + 1 == owners.size() ? " or " : ", ") + owners[i];
    fail_key(key, "belongs to model.type " + listed + "; this config's model.type is " + m.type);
  }
  // Upper bounds far above any model hgrn can train, so that every size derived from them fits 64 bits and a
  // mistyped value is refused here rather than by the allocator.
  require_positive_at_most("model.hidden_size", m.hidden_size, int64_t{1} << 16);
  require_positive_at_most("model.num_hidden_layers", m.num_hidden_layers, 1024);
  require_positive_at_most("model.vocab_size", m.vocab_size, int64_t{1} << 31);  // token ids are int32
  require_positive_at_most("model.hidden_ratio", m.hidden_ratio, 64);
  if (m.intermediate_size)
    require_positive_at_most("model.intermediate_size", *m.intermediate_size, int64_t{1} << 20);
  require_positive("model.norm_eps", m.norm_eps);
  require_positive("model.initializer_range", m.initializer_range);
  require_one_of("model.attn_mode", m.attn_mode, {"chunk", "fused_recurrent"});
  require_non_negative("model.memory.keep_recurrence_states", m.memory.keep_recurrence_states);
  require_non_negative("model.memory.keep_elementwise_layers", m.memory.keep_elementwise_layers);
  require_non_negative("model.memory.recompute_gates_layers", m.memory.recompute_gates_layers);
  model_family(m.type).validate(m, *this);

  const DataConfig& d = config_.data;
  require_one_of("data.task", d.task, {"mqar", "tokens"});
  if (d.task == "tokens") {
    if (d.train_data.empty())
      fail_key("data.train_data", "expected the path prefix of shards written by `hgrn prepare` (PREFIX.bin and "
                                  "PREFIX.idx) with data.task = tokens, got nothing");
    // Whether the shards exist is checked where they are opened (data/data_sources.cpp), so that `hgrn info`
    // works on a config before its data is prepared.
  }
  require_positive("data.seq_len", d.seq_len);
  if (d.task == "mqar" && d.reset_state_at_document)
    fail_key("data.reset_state_at_document",
             "expected false with data.task = mqar: an MQAR sequence is one document with no EOS token, so there is "
             "no document start to restart the state at (use data.task = tokens for packed documents)");
  if (d.task == "mqar") {
    const int64_t pairs = d.mqar.num_kv_pairs;
    require_positive("data.mqar.num_kv_pairs", pairs);
    require_non_negative("data.mqar.num_keys", d.mqar.num_keys);
    if (d.seq_len < 4 * pairs)
      fail_key("data.seq_len", "too short for MQAR with data.mqar.num_kv_pairs = " + std::to_string(pairs) +
                                   ": expected at least 2*" + std::to_string(pairs) + " positions for the pairs plus 2*" +
                                   std::to_string(pairs) + " for the query-answer slots = " +
                                   std::to_string(4 * pairs) + ", got " + std::to_string(d.seq_len));
    // Each sequence draws num_kv_pairs distinct keys and distinct values (as Zoology), and token 0 is noise.
    if (m.vocab_size < 2 * pairs + 1)
      fail_key("model.vocab_size", "too small for MQAR with data.mqar.num_kv_pairs = " + std::to_string(pairs) +
                                       ": expected at least 1 noise token + " + std::to_string(pairs) + " keys + " +
                                       std::to_string(pairs) + " values = " + std::to_string(2 * pairs + 1) +
                                       ", got " + std::to_string(m.vocab_size));
    if (d.mqar.num_keys != 0 && (d.mqar.num_keys < pairs || d.mqar.num_keys > m.vocab_size - 1 - pairs))
      fail_key("data.mqar.num_keys",
               "expected 0 (half the vocabulary) or a count in [num_kv_pairs, vocab_size - 1 - num_kv_pairs] = [" +
                   std::to_string(pairs) + ", " + std::to_string(m.vocab_size - 1 - pairs) +
                   "] so that each sequence finds enough distinct keys and values, got " +
                   std::to_string(d.mqar.num_keys));
    require_one_of("data.mqar.query_placement", d.mqar.query_placement, {"uniform", "power_law"});
    require_in("data.mqar.power_a", d.mqar.power_a, 0, true, 1, false);
    if (d.mqar.query_placement != "power_law" && !at_default("data.mqar.power_a"))
      fail_key("data.mqar.power_a", "applies only with data.mqar.query_placement = power_law (this config's is " +
                                        d.mqar.query_placement + "): set that too, or leave power_a out");
    require_one_of("data.mqar.filler", d.mqar.filler, {"zero", "random"});
    require_non_negative("data.mqar.num_train_sequences", d.mqar.num_train_sequences);
    if (d.mqar.num_train_sequences > kMqarMaxTrainSequences)
      fail_key("data.mqar.num_train_sequences", "expected 0 (fresh sequences) or at most " +
                                                    std::to_string(kMqarMaxTrainSequences) + " sequences, got " +
                                                    std::to_string(d.mqar.num_train_sequences));
  }
  if (d.stateful) {
    if (d.task != "tokens")
      fail_key("data.stateful", "expected false with data.task = " + d.task + ": a carried state needs one "
                                "contiguous token stream per row (data.task: tokens); MQAR sequences are independent");
    // Each row reads its stream in order: the windows' shuffled order does not apply (and is off by default here).
    if (d.shuffle && is_set("data.shuffle"))
      fail_key("data.shuffle", "expected false with data.stateful = true: each row reads its stream's windows in "
                               "order (leave data.shuffle out, or set it to false)");
    config_.data.shuffle = false;
  }

  const TrainingConfig& t = config_.training;
  require_one_of("training.device", t.device, {"auto", "cpu", "cuda"});
  require_one_of("training.precision", t.precision, {"fp32", "bf16", "fp8"});
  require_one_of("training.grad_reduce_dtype", t.grad_reduce_dtype, {"fp32", "bf16"});
  if (t.fp8_lm_head && t.precision != "fp8")
    fail_key("training.fp8_lm_head", "expected false with training.precision = " + t.precision +
                                         ": the LM head runs in FP8 only under precision fp8");
  if (t.fp8_lm_head && m.tie_word_embeddings)
    fail_key("training.fp8_lm_head", "expected false with model.tie_word_embeddings = true: a head tied to the "
                                     "embeddings stays in bf16");
  if (const std::string why = model_family(m.type).cuda_refusal(m); !why.empty() && t.device == "cuda")
    fail_key("training.device", "expected cpu or auto: " + why + " (set training.device to cpu)");
  if (t.precision != "fp32" && t.device == "cpu")
    fail_key("training.precision", "expected fp32 with training.device = cpu: " + t.precision +
                                       " training needs a GPU (set training.device to cuda or auto, or precision "
                                       "to fp32)");
  require_positive("training.micro_batch_size", t.micro_batch_size);
  require_positive("training.grad_accum_steps", t.grad_accum_steps);
  require_non_negative("training.global_batch_size", t.global_batch_size);
  if (t.global_batch_size > 0 && t.grad_accum_steps != 1)
    fail_key("training.global_batch_size", "set either global_batch_size (grad_accum_steps then follows from it and "
                                           "the number of ranks) or grad_accum_steps, not both");
  if (t.global_batch_size > 0 && t.global_batch_size % t.micro_batch_size != 0)
    fail_key("training.global_batch_size", "expected a multiple of training.micro_batch_size = " +
                                               std::to_string(t.micro_batch_size) + ", got " +
                                               std::to_string(t.global_batch_size));
  require_positive("training.collective_timeout_s", t.collective_timeout_s);
  require_positive("training.max_steps", t.max_steps);
  require_positive("training.lr", t.lr);
  require_in("training.min_lr_ratio", t.min_lr_ratio, 0.0, false, 1.0, false);
  require_one_of("training.schedule", t.schedule, {"cosine", "linear", "inverse_sqrt", "constant", "wsd"});
  require_non_negative("training.warmup_steps", t.warmup_steps);
  // A --set of a shorter max_steps (a quick run) cuts the file's warm-up to fit rather than failing.
  const auto from_override = [&](const std::string& key) {
    auto it = origin_.find(key);
    return it != origin_.end() && it->second.find(": --set '") != std::string::npos;
  };
  if (t.warmup_steps > t.max_steps && from_override("training.max_steps") && !from_override("training.warmup_steps")) {
    config_.notes.push_back("training.warmup_steps cut from " + std::to_string(t.warmup_steps) + " to " +
                            std::to_string(t.max_steps) + " to fit training.max_steps = " +
                            std::to_string(t.max_steps) + " (set by " + origin_.at("training.max_steps") + ")");
    config_.training.warmup_steps = t.max_steps;
  }
  if (t.warmup_steps > t.max_steps)
    fail_key("training.warmup_steps", "expected at most training.max_steps = " + std::to_string(t.max_steps) +
                                          ", got " + std::to_string(t.warmup_steps));
  require_in("training.decay_fraction", t.decay_fraction, 0.0, true, 1.0, false);
  if (t.weight_decay < 0)
    fail_key("training.weight_decay", "expected 0 or a positive number, got " + format_double(t.weight_decay));
  require_in("training.beta1", t.beta1, 0.0, false, 1.0, true);
  require_in("training.beta2", t.beta2, 0.0, false, 1.0, true);
  require_positive("training.adam_eps", t.adam_eps);
  if (t.grad_clip < 0)
    fail_key("training.grad_clip", "expected 0 (off) or a positive norm, got " + format_double(t.grad_clip));
  require_positive("training.max_nonfinite_steps", t.max_nonfinite_steps);
  require_non_negative("training.threads", t.threads);
  require_non_negative("training.eval_interval", t.eval_interval);
  if (t.eval_interval > 0) require_positive("training.eval_batches", t.eval_batches);
  require_non_negative("training.eval_batches", t.eval_batches);

  const CheckpointConfig& k = config_.checkpoint;
  require_non_negative("checkpoint.interval", k.interval);
  require_positive("checkpoint.keep_last", k.keep_last);
  require_non_negative("checkpoint.keep_every", k.keep_every);
  if (k.resume != "auto" && k.resume != "never") {
    std::error_code ec;
    if (k.resume.empty() || !std::filesystem::exists(k.resume, ec))
      fail_key("checkpoint.resume", "expected auto, never or the path of an existing checkpoint, got '" + k.resume +
                                        "' (no such file or directory)");
  }
  if (!k.init_from.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(k.init_from + "/config.json", ec))
      fail_key("checkpoint.init_from", "expected a Hugging Face model directory with a config.json, got '" +
                                           k.init_from + "' (no " + k.init_from + "/config.json)");
  }

  const LoggingConfig& l = config_.logging;
  if (l.run_dir.empty()) fail_key("logging.run_dir", "expected a directory path, got an empty string");
  require_positive("logging.log_interval", l.log_interval);
  if (l.metrics_file.empty()) fail_key("logging.metrics_file", "expected a file name, got an empty string");
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------

namespace {

// The one YAML document of a config text. Refused: invalid YAML; a text with no mapping in it at all (empty, only
// comments or blank lines, NUL bytes), which would otherwise leave every key at its default and fail on the first
// required one with a misleading message; and a second document after `---`, which yaml-cpp's Load would ignore.
YAML::Node load_config_document(const std::string& yaml_text, const std::string& source_name) {
  if (const size_t nul = yaml_text.find('\0'); nul != std::string::npos)
    throw ConfigError(source_name + ": (file): expected a YAML text, got a NUL byte at offset " + std::to_string(nul) +
                      " (the file is binary, truncated or zero-filled)");
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(mark_text(source_name, e.mark) + ": invalid YAML: " + e.msg);
  }
  if (documents.size() > 1)
    throw ConfigError(mark_text(source_name, documents[1].Mark()) + ": (top level): expected one YAML document, got " +
                      std::to_string(documents.size()) + " (separated by ---): put every key into one document");
  if (documents.empty() || documents[0].IsNull())
    throw ConfigError(source_name + ": (file): the config is empty or unreadable (no keys, only comments or blank "
                      "lines): expected a YAML mapping with the sections " + join_list(child_names("")));
  return documents[0];
}

Config read_config(const std::string& yaml_text, const std::string& source_name,
                   const std::vector<std::string>& overrides, bool migrate_moved_keys) {
  const YAML::Node root = load_config_document(yaml_text, source_name);
  ConfigReader reader(source_name, migrate_moved_keys);
  reader.read_document(root);
  for (const std::string& text : overrides) reader.apply_override(text);
  reader.apply_member_defaults();
  reader.validate();
  return reader.take();
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  return read_config(yaml_text, source_name, overrides, /*migrate_moved_keys=*/false);
}

Config parse_stored_config(const std::string& yaml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides) {
  return read_config(yaml_text, source_name, overrides, /*migrate_moved_keys=*/true);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ConfigError(path + ": cannot read the config file: no such file (expected a YAML file such as "
                             "configs/mqar-tiny.yaml)");
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(path + ": cannot read the config file: it is a directory (expected a YAML file)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot read the config file: permission denied or unreadable");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

void validate_config(const Config& config) {
  ConfigReader reader(config, config.source.empty() ? std::string("(config built in code)") : config.source);
  reader.validate();
}

std::string config_to_yaml(const Config& config) {
  Config copy = config;  // config_fields binds mutable pointers; writing only reads through them
  std::ostringstream out;
  out << "# hgrn config, every key with its resolved value";
  if (!config.source.empty()) out << " (from " << config.source << ")";
  out << "\n";
  // Keys only other family members have are left out: they mean nothing for this model.type.
  const std::set<std::string> foreign = foreign_model_keys(config.model.type);
  std::vector<std::string> open_sections;  // the sections of the previous key, outermost first
  for (const Field& field : config_fields(copy)) {
    if (foreign.count(field.path)) continue;
    std::vector<std::string> sections;
    for (std::string p = parent_path(field.path); !p.empty(); p = parent_path(p)) sections.insert(sections.begin(), p);
    size_t common = 0;
    while (common < sections.size() && common < open_sections.size() && sections[common] == open_sections[common])
      ++common;
    for (size_t i = common; i < sections.size(); ++i) {
      if (i == 0) out << "\n";
      out << std::string(2 * i, ' ') << leaf_name(sections[i]) << ":\n";
    }
    open_sections = sections;
    out << std::string(2 * sections.size(), ' ') << leaf_name(field.path) << ": " << format_value(field.ref) << "\n";
  }
  return out.str();
}

std::vector<ConfigChange> config_changes(const std::string& before_yaml, const std::string& before_source,
                                         const Config& after) {
  ConfigReader reader(before_source, /*migrate_moved_keys=*/true);
  reader.read_document(load_config_document(before_yaml, before_source));
  Config before = reader.take(), now = after;  // config_fields binds mutable pointers; only read here
  const std::vector<Field> old_fields = config_fields(before), new_fields = config_fields(now);
  std::vector<ConfigChange> changes;
  for (size_t i = 0; i < old_fields.size(); ++i) {
    const std::string a = format_value(old_fields[i].ref), b = format_value(new_fields[i].ref);
    if (a != b) changes.push_back({old_fields[i].path, a, b});
  }
  return changes;
}

TrainingConfig resolve_batch_for_world(const TrainingConfig& training, int64_t world_size) {
  TrainingConfig t = training;
  if (t.global_batch_size > 0) {
    const int64_t per_step = t.micro_batch_size * world_size;
    HGRN_CHECK(t.global_batch_size % per_step == 0, "training.global_batch_size = ", t.global_batch_size,
               " does not split into micro_batch_size (", t.micro_batch_size, ") x ranks (", world_size,
               ") x accumulation steps: choose a multiple of ", per_step, " or another micro_batch_size");
    t.grad_accum_steps = t.global_batch_size / per_step;
  }
  return t;
}

}  // namespace hgrn
