// linear_attention.cpp: GLA's and RetNet's shared head layout, parameters and gated output (linear_attention.h).
#include "models/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "io/hf_config_reader.h"
#include "kernels/rotary_embedding.h"
#include "models/cost.h"
#include "models/token_mixer.h"
#include "ops/swiglu_linear.h"

namespace hgrn {
namespace {

// fla's RotaryEmbedding asserts head_k_dim <= 256; the GPU's takes the same.
constexpr int64_t kMaxRotaryKeyDim = 2 * kMaxRotaryPairs;

struct LayoutProblem {
  std::string field;    // "num_heads", "expand_k" or "expand_v" (model.<field> in a config, <field> in config.json)
  std::string problem;  // empty: none
};

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// hidden_size · ratio as fla computes it: round(D · ratio), which must equal D · ratio (math.isclose's 1e-9).
std::optional<int64_t> width_of(int64_t hidden_size, double ratio) {
  const double exact = static_cast<double>(hidden_size) * ratio;
  const double rounded = std::round(exact);
  if (!(rounded >= 1) || std::abs(exact - rounded) > 1e-9 * std::max(std::abs(exact), std::abs(rounded)))
    return std::nullopt;
  return static_cast<int64_t>(rounded);
}

// The first problem of the layout the config's fields (or the defaults) give, in the order fla's layer asserts them.
LayoutProblem layout_problem(const ModelConfig& c, const HeadDefaults& d, bool rotary_keys) {
  const int64_t heads = c.num_heads.value_or(d.num_heads);
  if (heads <= 0) return {"num_heads", "expected a positive integer, got " + std::to_string(heads)};
  const std::string D = std::to_string(c.hidden_size);
  for (const auto& [field, ratio] : {std::pair<const char*, double>{"expand_k", c.expand_k.value_or(d.expand_k)},
                                     {"expand_v", c.expand_v.value_or(d.expand_v)}}) {
    const std::optional<int64_t> width = width_of(c.hidden_size, ratio);
    if (!width)
      return {field, "expected a positive number that makes hidden_size x " + std::string(field) + " an integer (" +
                         D + " x " + number_text(ratio) + " is not)"};
    if (*width % heads != 0)
      return {field, "hidden_size x " + std::string(field) + " = " + std::to_string(*width) +
                         " must be divisible by num_heads = " + std::to_string(heads)};
  }
  const int64_t key_dim = *width_of(c.hidden_size, c.expand_k.value_or(d.expand_k)) / heads;
  if (rotary_keys && (key_dim % 2 != 0 || key_dim > kMaxRotaryKeyDim))
    return {"expand_k", "the key width per head, hidden_size x expand_k / num_heads = " + std::to_string(key_dim) +
                            ", must be even and at most " + std::to_string(kMaxRotaryKeyDim) +
                            " (the rotary embedding rotates pairs of key features; fla's takes heads up to " +
                            std::to_string(kMaxRotaryKeyDim) + " wide)"};
  return {};
}

}  // namespace

double HeadLayout::recurrence_flops_per_token(int64_t seq_len) const {
  return gla_recurrence_flops_per_token(static_cast<double>(heads), static_cast<double>(key_dim),
                                        static_cast<double>(value_dim), static_cast<double>(gla_chunk_size(seq_len)));
}

double HeadLayout::query_scale() const { return 1.0 / std::sqrt(static_cast<double>(key_dim)); }

HeadLayout head_layout(const ModelConfig& c, const HeadDefaults& d) {
  const LayoutProblem bad = layout_problem(c, d, /*rotary_keys=*/false);
  HGRN_CHECK(bad.problem.empty(), "model.", bad.field, ": ", bad.problem);
  HeadLayout layout;
  layout.heads = c.num_heads.value_or(d.num_heads);
  layout.key_dim = *width_of(c.hidden_size, c.expand_k.value_or(d.expand_k)) / layout.heads;
  layout.value_dim = *width_of(c.hidden_size, c.expand_v.value_or(d.expand_v)) / layout.heads;
  return layout;
}

void validate_head_layout(const ModelConfig& c, const HeadDefaults& d, bool rotary_keys,
                          const ConfigChecker& checker) {
  const LayoutProblem bad = layout_problem(c, d, rotary_keys);
  if (!bad.problem.empty()) checker.fail_key("model." + bad.field, bad.problem);
}

std::vector<std::string> linear_attention_keys() {
  return {"model.num_heads", "model.expand_k", "model.expand_v", "model.memory.keep_recurrence_states"};
}

std::string linear_attention_signature(const std::string& type, const ModelConfig& m, const HeadDefaults& d) {
  const HeadLayout h = head_layout(m, d);
  return detail::concat(type, " L=", m.num_hidden_layers, " D=", m.hidden_size, " H=", h.heads, " K=", h.key_dim,
                        " V=", h.value_dim, " I=", m.mlp_size(), " vocab=", m.vocab_size,
                        " tied=", m.tie_word_embeddings);
}

std::vector<ParamSpec> linear_attention_param_specs(const ModelConfig& c, const HeadDefaults& d,
                                                    const std::vector<ParamSpec>& gate) {
  const HeadLayout h = head_layout(c, d);
  const int64_t D = c.hidden_size, Fk = h.keys(), Fv = h.values();
  std::vector<ParamSpec> specs = {
      {"q_proj.weight", {Fk, D}, ParamGroup::Mixer, ParamInit::Normal},
      {"k_proj.weight", {Fk, D}, ParamGroup::Mixer, ParamInit::Normal, true},
      {"v_proj.weight", {Fv, D}, ParamGroup::Mixer, ParamInit::Normal, true},
      {"g_proj.weight", {Fv, D}, ParamGroup::Mixer, ParamInit::Normal, true},
  };
  specs.insert(specs.end(), gate.begin(), gate.end());
  specs.push_back({"o_proj.weight", {D, Fv}, ParamGroup::Mixer, ParamInit::Normal});
  specs.push_back({"g_norm_swish_gate.weight", {h.value_dim}, ParamGroup::Norm, ParamInit::Ones});
  return specs;
}

void write_head_layout(const ModelConfig& c, const HeadDefaults& d, nlohmann::json& out) {
  out["num_heads"] = c.num_heads.value_or(d.num_heads);
  out["num_kv_heads"] = nullptr;
  out["expand_k"] = c.expand_k.value_or(d.expand_k);
  out["expand_v"] = c.expand_v.value_or(d.expand_v);
  out["feature_map"] = nullptr;
  out["use_output_gate"] = true;
}

void read_head_layout(const HfConfigReader& in, const HeadDefaults& d, bool rotary_keys, ModelConfig& c) {
  c.num_heads = in.integer("num_heads", d.num_heads);
  c.expand_k = in.number("expand_k", d.expand_k);
  c.expand_v = in.number("expand_v", d.expand_v);
  const std::optional<int64_t> kv_heads = in.optional_int("num_kv_heads", std::nullopt);
  if (kv_heads && *kv_heads != *c.num_heads)
    in.fail("num_kv_heads", "grouped keys and values are not part of hgrn's models; expected null or num_heads = " +
                                std::to_string(*c.num_heads) + ", got " + std::to_string(*kv_heads));
  if (in.has_non_null("feature_map"))
    in.fail("feature_map", "a feature map on queries and keys is not part of hgrn's models; expected null");
  if (!in.boolean("use_output_gate", true))
    in.fail("use_output_gate", "hgrn's mixers always gate their output (g_proj); expected true");
  // Otherwise fla's layer names the output norm g_norm instead (the same function, other weight names).
  if (in.string("hidden_act", "swish") != "swish")
    in.fail("hidden_act", "expected \"swish\": fla's layer fuses the output norm and gate (g_norm_swish_gate) only "
                          "for swish");
  if (!in.boolean("fuse_norm", true))
    in.fail("fuse_norm", "expected true: fla's layer names its output norm g_norm_swish_gate only when it is fused");
  const LayoutProblem bad = layout_problem(c, d, rotary_keys);
  if (!bad.problem.empty()) in.fail(bad.field, bad.problem);
}

Var gated_head_norm_output(Tape& tape, const Var& o, const Var& g, const Var& norm_weight, const Var& o_proj,
                           int64_t value_dim, double eps, const ModelMemoryConfig& memory, const Var& residual) {
  const UpNorm norm{norm_weight, eps, value_dim};
  return swiglu_linear(tape, g, o, o_proj, /*keep_hidden=*/!memory.recompute_elementwise, residual, &norm);
}

}  // namespace hgrn
