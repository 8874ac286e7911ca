// test_linear_attention_models.cpp: GLA and RetNet as whole models: their fla parameter layouts and initialisation,
// and the forward of a tiny model against a plain fp64 reference written here from the papers' and fla's maths
// (step-by-step recurrences over vectors, none of hgrn's ops), over more than one 64-step chunk.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model_fixtures.h"
#include "models/decoder_lm.h"
#include "models/registry.h"

namespace hgrn {
namespace {

using testing::tiny_config;
using testing::token_ids;
using Vec = std::vector<double>;

// ---------------------------------------------------------------------------------------------------------------
// The reference: vectors of doubles and loops.

Vec param(const DecoderLM& model, const std::string& name) { return model.parameter(name)->value.to_double_vector(); }

// y = W x for W [rows, cols] row-major.
Vec matvec(const Vec& W, const Vec& x) {
  const size_t cols = x.size(), rows = W.size() / cols;
  Vec y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) y[r] += W[r * cols + c] * x[c];
  return y;
}

// RMSNorm of x[begin, begin + w.size()) with weight w.
Vec rms_norm(const Vec& x, size_t begin, const Vec& w, double eps) {
  double mean_square = 0;
  for (size_t i = 0; i < w.size(); ++i) mean_square += x[begin + i] * x[begin + i];
  mean_square /= static_cast<double>(w.size());
  Vec y(w.size());
  for (size_t i = 0; i < w.size(); ++i) y[i] = x[begin + i] / std::sqrt(mean_square + eps) * w[i];
  return y;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }

// The mixer of layer `layer` on one sequence: its normed inputs x_t in, o_proj's outputs out (without the residual).
using ReferenceMixer = std::function<std::vector<Vec>(const DecoderLM&, int64_t layer, const std::vector<Vec>& x)>;

// fla's *ForCausalLM forward: embedding; per layer h += Mixer(RMSNorm(h)), h += GatedMLP(RMSNorm(h)); final RMSNorm
// and the LM head. Logits [B][T][vocab] flattened.
Vec reference_logits(const DecoderLM& model, const Tensor& ids, const ReferenceMixer& mixer) {
  const ModelConfig& c = model.config();
  const int64_t B = ids.size(0), T = ids.size(1), D = c.hidden_size;
  const Vec embeddings = param(model, "model.embeddings.weight");
  const Vec head = param(model, c.tie_word_embeddings ? "model.embeddings.weight" : "lm_head.weight");
  Vec logits;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Vec> h(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t id = ids.data<int32_t>()[b * T + t];
      h[t] = Vec(embeddings.begin() + id * D, embeddings.begin() + (id + 1) * D);
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<Vec> x(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) x[t] = rms_norm(h[t], 0, param(model, p + "attn_norm.weight"), c.norm_eps);
      const std::vector<Vec> mixed = mixer(model, l, x);
      const Vec gate_w = param(model, p + "mlp.gate_proj.weight"), up_w = param(model, p + "mlp.up_proj.weight");
      const Vec down_w = param(model, p + "mlp.down_proj.weight"), mlp_norm = param(model, p + "mlp_norm.weight");
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < D; ++i) h[t][i] += mixed[t][i];
        const Vec y = rms_norm(h[t], 0, mlp_norm, c.norm_eps);
        const Vec gate = matvec(gate_w, y), up = matvec(up_w, y);
        Vec hidden(gate.size());
        for (size_t i = 0; i < gate.size(); ++i) hidden[i] = silu(gate[i]) * up[i];
        const Vec down = matvec(down_w, hidden);
        for (int64_t i = 0; i < D; ++i) h[t][i] += down[i];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      const Vec out = matvec(head, rms_norm(h[t], 0, param(model, "model.norm.weight"), c.norm_eps));
      logits.insert(logits.end(), out.begin(), out.end());
    }
  }
  return logits;
}

// The output both mixers share: per head RMSNorm(o_h) with the shared weight, times silu(g), then o_proj.
Vec gated_output(const DecoderLM& model, const std::string& p, const Vec& o, const Vec& g, int64_t heads,
                 double eps) {
  const Vec norm_w = param(model, p + "g_norm_swish_gate.weight");
  const size_t V = norm_w.size();
  Vec gated(o.size());
  for (int64_t h = 0; h < heads; ++h) {
    const Vec normed = rms_norm(o, h * V, norm_w, eps);
    for (size_t j = 0; j < V; ++j) gated[h * V + j] = normed[j] * silu(g[h * V + j]);
  }
  return matvec(param(model, p + "o_proj.weight"), gated);
}

// Per head S_t = Diag(decay_t) S_{t−1} + k_tᵀ v_t, o_t = scale · q_t S_t over one sequence (decay per key channel).
std::vector<Vec> linear_attention(const std::vector<Vec>& q, const std::vector<Vec>& k, const std::vector<Vec>& v,
                                  const std::vector<Vec>& decay, int64_t heads) {
  const size_t K = q[0].size() / heads, V = v[0].size() / heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  std::vector<Vec> o(q.size(), Vec(v[0].size(), 0.0));
  for (int64_t h = 0; h < heads; ++h) {
    Vec S(K * V, 0.0);
    for (size_t t = 0; t < q.size(); ++t) {
      for (size_t a = 0; a < K; ++a)
        for (size_t j = 0; j < V; ++j)
          S[a * V + j] = decay[t][h * K + a] * S[a * V + j] + k[t][h * K + a] * v[t][h * V + j];
      for (size_t j = 0; j < V; ++j)
        for (size_t a = 0; a < K; ++a) o[t][h * V + j] += scale * q[t][h * K + a] * S[a * V + j];
    }
  }
  return o;
}

// GLA (fla/layers/gla.py): gk = log σ(W₂ W₁ x + b) / 16, decay e^{gk}.
std::vector<Vec> gla_mixer(const DecoderLM& model, int64_t layer, const std::vector<Vec>& x) {
  const std::string p = "model.layers." + std::to_string(layer) + ".attn.";
  const int64_t heads = *model.config().num_heads;
  std::vector<Vec> q, k, v, g, decay;
  for (const Vec& xt : x) {
    q.push_back(matvec(param(model, p + "q_proj.weight"), xt));
    k.push_back(matvec(param(model, p + "k_proj.weight"), xt));
    v.push_back(matvec(param(model, p + "v_proj.weight"), xt));
    g.push_back(matvec(param(model, p + "g_proj.weight"), xt));
    Vec logits = matvec(param(model, p + "gk_proj.1.weight"), matvec(param(model, p + "gk_proj.0.weight"), xt));
    const Vec bias = param(model, p + "gk_proj.1.bias");
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::exp(std::log(sigmoid(logits[i] + bias[i])) / 16.0);
    decay.push_back(logits);
  }
  const std::vector<Vec> o = linear_attention(q, k, v, decay, heads);
  std::vector<Vec> out;
  for (size_t t = 0; t < x.size(); ++t) out.push_back(gated_output(model, p, o[t], g[t], heads, model.config().norm_eps));
  return out;
}

// RetNet (fla/layers/multiscale_retention.py): q and k rotated at their absolute positions (RoPE, base 10000, halves
// not interleaved), decay γ_h = 1 − 2^(−5−h) per head.
std::vector<Vec> retnet_mixer(const DecoderLM& model, int64_t layer, const std::vector<Vec>& x) {
  const std::string p = "model.layers." + std::to_string(layer) + ".attn.";
  const int64_t heads = *model.config().num_heads;
  std::vector<Vec> q, k, v, g, decay;
  const auto rotate = [heads](Vec u, size_t position) {
    const size_t K = u.size() / heads, half = K / 2;
    for (int64_t h = 0; h < heads; ++h)
      for (size_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(position) * std::pow(10000.0, -2.0 * static_cast<double>(i) / K);
        const double a = u[h * K + i], b = u[h * K + i + half];
        u[h * K + i] = a * std::cos(angle) - b * std::sin(angle);
        u[h * K + i + half] = a * std::sin(angle) + b * std::cos(angle);
      }
    return u;
  };
  for (size_t t = 0; t < x.size(); ++t) {
    q.push_back(rotate(matvec(param(model, p + "q_proj.weight"), x[t]), t));
    k.push_back(rotate(matvec(param(model, p + "k_proj.weight"), x[t]), t));
    v.push_back(matvec(param(model, p + "v_proj.weight"), x[t]));
    g.push_back(matvec(param(model, p + "g_proj.weight"), x[t]));
    Vec d(q.back().size());
    for (size_t i = 0; i < d.size(); ++i) d[i] = 1.0 - std::pow(2.0, -5.0 - static_cast<double>(i / (d.size() / heads)));
    decay.push_back(d);
  }
  const std::vector<Vec> o = linear_attention(q, k, v, decay, heads);
  std::vector<Vec> out;
  for (size_t t = 0; t < x.size(); ++t) out.push_back(gated_output(model, p, o[t], g[t], heads, model.config().norm_eps));
  return out;
}

// Random values for every parameter (norms, biases and all), so that a swapped or ignored tensor shows.
void randomise_parameters(const DecoderLM& model, Rng& rng, double scale) {
  for (const auto& [spec, var] : model.parameters())
    for (int64_t i = 0; i < var->value.numel(); ++i) var->value.set_item(i, scale * rng.normal());
}

void expect_forward_matches_reference(const std::string& type, const ReferenceMixer& mixer) {
  for (const char* mode : {"chunk", "fused_recurrent"}) {
    SCOPED_TRACE(mode);
    ModelConfig c = tiny_config(type);
    c.attn_mode = mode;
    Rng rng(71);
    DecoderLM model(c, rng, DType::F64);
    randomise_parameters(model, rng, 0.5);
    const Tensor ids = token_ids(rng, 2, 70, c.vocab_size);  // past 64 tokens: the chunkwise form, two chunks
    Tape tape;
    tape.set_enabled(false);
    const Vec got = model.forward(tape, ids)->value.to_double_vector();
    const Vec want = reference_logits(model, ids, mixer);
    ASSERT_EQ(got.size(), want.size());
    // fp64 on both sides, differing only in the order of the arithmetic: 1e-10 on logits of order 1..10.
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-10) << "logit " << i;
  }
}

// ---------------------------------------------------------------------------------------------------------------

TEST(GlaModel, ForwardMatchesAPlainReferenceOfTheMaths) { expect_forward_matches_reference("gla", gla_mixer); }

TEST(GlaModel, ParametersFollowFlaNamesShapesAndInitialisation) {
  // fla's GLAForCausalLM at D = 8, 2 heads, expand_k 0.5, expand_v 1: keys 4 wide (2 a head), values 8 (4 a head).
  ModelConfig c = tiny_config("gla");
  Rng rng(72);
  DecoderLM model(c, rng, DType::F32);
  EXPECT_THROW(model.parameter("model.lower_bounds"), Error);
  std::vector<std::pair<std::string, Shape>> mixer;
  for (const auto& [spec, var] : model.parameters())
    if (spec.name.rfind("model.layers.1.attn.", 0) == 0) mixer.emplace_back(spec.name.substr(20), var->value.shape());
  // fla registers q, k, v, g, the gate's two linears, o_proj and the gated norm: the same order here.
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"q_proj.weight", {4, 8}},    {"k_proj.weight", {4, 8}},     {"v_proj.weight", {8, 8}},
      {"g_proj.weight", {8, 8}},    {"gk_proj.0.weight", {16, 8}}, {"gk_proj.1.weight", {4, 16}},
      {"gk_proj.1.bias", {4}},      {"o_proj.weight", {8, 8}},     {"g_norm_swish_gate.weight", {4}}};
  EXPECT_EQ(mixer, expected);
  const std::string p = "model.layers.1.attn.";
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(model.parameter(p + "gk_proj.1.bias")->value.item(i), 0.0);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(model.parameter(p + "g_norm_swish_gate.weight")->value.item(i), 1.0);
  const Tensor& w = model.parameter(p + "gk_proj.1.weight")->value;
  double sum_sq = 0;
  for (int64_t i = 0; i < w.numel(); ++i) sum_sq += w.item(i) * w.item(i);
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w.numel())), 0.5, 0.15);  // N(0, 0.5): 64 draws
}

TEST(GlaModel, FlaDefaultsGiveFourHeadsAndTheNamesOfItsConfig) {
  // No num_heads, expand_k or expand_v: GLAConfig's 4 heads, keys D/2 and values D wide.
  ModelConfig c;
  c.type = "gla";
  c.hidden_size = 64;
  const ModelFamily& gla = model_family("gla");
  EXPECT_EQ(gla.signature(c).find("gla L=2 D=64 H=4 K=8 V=16"), 0u) << gla.signature(c);
  EXPECT_EQ(gla.hf_architecture(), "GLAForCausalLM");
  EXPECT_FALSE(gla.has_lower_bounds());
}

TEST(RetNetModel, ForwardMatchesAPlainReferenceOfTheMaths) { expect_forward_matches_reference("retnet", retnet_mixer); }

TEST(RetNetModel, ParametersFollowFlaNamesShapesAndInitialisation) {
  // fla's RetNetForCausalLM at D = 8, 2 heads, expand_k 1, expand_v 2: keys 8 wide (4 a head), values 16 (8 a head).
  ModelConfig c = tiny_config("retnet");
  Rng rng(73);
  DecoderLM model(c, rng, DType::F32);
  EXPECT_THROW(model.parameter("model.lower_bounds"), Error);
  std::vector<std::pair<std::string, Shape>> mixer;
  for (const auto& [spec, var] : model.parameters())
    if (spec.name.rfind("model.layers.2.attn.", 0) == 0) mixer.emplace_back(spec.name.substr(20), var->value.shape());
  // fla registers q, k, v, g, o_proj and the gated norm (the rotary embedding holds no parameters).
  const std::vector<std::pair<std::string, Shape>> expected = {
      {"q_proj.weight", {8, 8}},  {"k_proj.weight", {8, 8}},  {"v_proj.weight", {16, 8}},
      {"g_proj.weight", {16, 8}}, {"o_proj.weight", {8, 16}}, {"g_norm_swish_gate.weight", {8}}};
  EXPECT_EQ(mixer, expected);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(model.parameter("model.layers.2.attn.g_norm_swish_gate.weight")->value.item(i), 1.0);
}

TEST(RetNetModel, FlaDefaultsGiveEightHeadsAndAHiddenRatioOfTwo) {
  // No num_heads, expand_k, expand_v or hidden_ratio: RetNetConfig's 8 heads, keys D and values 2D wide, and its
  // MLP ratio 2 (GLA's and HGRN's is 4).
  const Config c = parse_config("model: {type: retnet, hidden_size: 128}\n", "retnet.yaml");
  EXPECT_EQ(c.model.hidden_ratio, 2);
  EXPECT_EQ(c.model.mlp_size(), 256);  // 256 · ceil(floor(128 · 2 · 2/3) / 256)
  const ModelFamily& retnet = model_family("retnet");
  EXPECT_EQ(retnet.signature(c.model).find("retnet L=2 D=128 H=8 K=16 V=32 I=256"), 0u) << retnet.signature(c.model);
  EXPECT_EQ(parse_config("model: {type: gla, hidden_size: 128}\n", "gla.yaml").model.hidden_ratio, 4);
  EXPECT_EQ(parse_config("model: {type: retnet, hidden_size: 128, hidden_ratio: 4}\n", "r.yaml").model.hidden_ratio, 4);
  EXPECT_EQ(retnet.hf_architecture(), "RetNetForCausalLM");
  EXPECT_FALSE(retnet.has_lower_bounds());
}

TEST(RetNetModel, OddOrOverWideKeyHeadsAreRefused) {
  // The rotary embedding rotates pairs of key features, at most 256 a head (fla's assert).
  for (const auto& [set, expected] : std::vector<std::pair<std::string, std::string>>{
           {"num_heads: 4, expand_k: 0.75", "hidden_size x expand_k / num_heads = 3, must be even"},
           {"num_heads: 1, expand_k: 33", "hidden_size x expand_k / num_heads = 528, must be even and at most 256"}}) {
    try {
      parse_config("model: {type: retnet, hidden_size: 16, " + set + "}\n", "retnet.yaml");
      ADD_FAILURE() << set << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.expand_k: the key width per head, " + expected), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace hgrn
