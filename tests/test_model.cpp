// test_model.cpp: the whole model of every family member (HGRN2, HGRN1, and HGRN1's complex-valued HGRU as
// "hgrn-complex"): fp64 finite-difference gradients of every parameter (lower bounds included), layer 0 giving no
// lower-bound gradient, chunkwise vs recurrent equality, carried states, recomputation, gradient groups, the
// forward asking for each group of parameters before reading it, and the parameter layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "gradcheck.h"
#include "model_fixtures.h"
#include "models/decoder_lm.h"
#include "models/registry.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"

namespace hgrn {
namespace {

class EveryModelType : public ::testing::TestWithParam<std::string> {};

using testing::expect_fused_projections_adjacent;
using testing::model_variants;
using testing::randomise_lower_bounds;
using testing::tiny_config;
using testing::set_knob;
using testing::model_loss;
using testing::token_ids;
using testing::parameter_vars;

// Layer 0's first token-mixer weight (the HGRN members' q_proj or i_proj, GLA's and RetNet's q_proj).
std::string first_mixer_weight(const ModelConfig& c) {
  return "model.layers.0.attn." + model_family(c.type).mixer_param_specs(c).front().name;
}

TEST_P(EveryModelType, EveryParameterGradientMatchesFiniteDifferences) {
  for (const char* mode : {"chunk", "fused_recurrent"}) {
    SCOPED_TRACE(mode);
    ModelConfig c = tiny_config(GetParam());
    c.attn_mode = mode;
    Rng rng(42);
    DecoderLM model(c, rng, DType::F64);
    randomise_lower_bounds(model, rng);
    // The model takes the chunkwise path only above 64 tokens (fla's rule): 66 tokens give a partial 2nd chunk.
    const bool chunked = std::string(mode) == "chunk";
    Tensor ids = token_ids(rng, chunked ? 1 : 2, chunked ? 66 : 5, c.vocab_size);
    // fp64 central differences with h = 1e-6 are accurate to ~1e-9 here; 1e-6 leaves room for the deeper graph.
    testing::expect_gradients_match(
        [&](Tape& tape, const std::vector<Var>&) { return model_loss(model, tape, ids); }, parameter_vars(model), 7,
        1e-6, 1e-6);
  }
}

TEST_P(EveryModelType, RecomputationGivesTheSameLossAndGradientsBitForBit) {
  // model.memory.recompute runs each token mixer and MLP again in the backward, model.memory.recompute_elementwise the
  // gates, norms and SwiGLU, model.memory.recompute_mlp_projections the MLP's gate and up GEMMs: the same ops on the same
  // inputs, so the same bits as keeping every activation. Passes: everything kept; elementwise recomputation (the
  // default); elementwise and MLP projections; MLP projections alone; all three; elementwise without the gates;
  // elementwise with the gates kept but in the last layer (model.memory.recompute_gates_layers); elementwise but in
  // the first layer (model.memory.keep_elementwise_layers).
  for (int64_t seq : {5, 66}) {
    Rng rng(8);
    DecoderLM model(tiny_config(GetParam()), rng, DType::F64);
    randomise_lower_bounds(model, rng);
    Tensor ids = token_ids(rng, 2, seq, tiny_config(GetParam()).vocab_size);
    constexpr int kPasses = 8;
    std::vector<std::vector<double>> grads[kPasses];
    double losses[kPasses];
    for (int pass = 0; pass < kPasses; ++pass) {
      set_knob(model, &ModelMemoryConfig::recompute, pass == 4);
      set_knob(model, &ModelMemoryConfig::recompute_elementwise, pass == 1 || pass == 2 || pass == 4 || pass >= 5);
      set_knob(model, &ModelMemoryConfig::keep_elementwise_layers, pass == 7 ? 1 : 0);
      set_knob(model, &ModelMemoryConfig::recompute_mlp_projections, pass >= 2 && pass <= 4);
      set_knob(model, &ModelMemoryConfig::recompute_gates, pass < 5 || pass == 7);
      set_knob(model, &ModelMemoryConfig::recompute_gates_layers, pass == 6 ? 1 : 0);
      for (const Var& v : parameter_vars(model)) v->grad = Tensor();
      Tape tape;
      Var loss = model_loss(model, tape, ids);
      tape.backward(loss);
      losses[pass] = loss->value.item();
      for (const Var& v : parameter_vars(model)) grads[pass].push_back(v->grad.to_double_vector());
    }
    for (int pass = 1; pass < kPasses; ++pass) {
      EXPECT_EQ(losses[0], losses[pass]) << "pass " << pass;
      for (size_t p = 0; p < grads[0].size(); ++p)
        EXPECT_EQ(grads[0][p], grads[pass][p]) << "pass " << pass << ", parameter " << p;
    }
  }
}

// Data parallelism starts reducing a group's gradients when the backward reports the group complete: a gradient
// written after its group's report would be reduced half-done. Snapshot each group's gradients at the report and
// compare them with the gradients at the end of the backward: they must be equal bit for bit. Also: groups are
// reported once each, in index order but for layer 0's after the embedding's (its weight gradients deferred), and
// cover every parameter exactly once.
TEST_P(EveryModelType, GradientReadyGroupsAreCompleteWhenReported) {
  for (int variant = 0; variant < 4; ++variant) {
    ModelConfig c = tiny_config(GetParam());
    c.tie_word_embeddings = variant == 1;
    c.num_hidden_layers = variant == 2 ? 1 : 3;
    const bool recompute = variant == 3;
    SCOPED_TRACE(detail::concat("tied ", c.tie_word_embeddings, ", layers ", c.num_hidden_layers, ", recompute ",
                                recompute));
    Rng rng(21);
    DecoderLM model(c, rng, DType::F64);
    set_knob(model, &ModelMemoryConfig::recompute, recompute);
    randomise_lower_bounds(model, rng);
    const std::vector<std::vector<Var>> groups = model.gradient_ready_groups();
    ASSERT_EQ(groups.size(), static_cast<size_t>(c.num_hidden_layers) + 2);
    std::map<const Variable*, int> seen;
    for (const auto& group : groups)
      for (const Var& v : group) ++seen[v.get()];
    EXPECT_EQ(seen.size(), model.parameters().size());
    for (const auto& [spec, var] : model.parameters()) EXPECT_EQ(seen[var.get()], 1) << spec.name;

    std::vector<size_t> reported;
    std::map<const Variable*, std::vector<double>> at_report;
    model.set_gradient_ready_hook([&](size_t g) {
      reported.push_back(g);
      for (const Var& v : groups.at(g))
        at_report[v.get()] = v->grad.defined() ? v->grad.to_double_vector() : std::vector<double>{};
    });
    for (int pass = 0; pass < 2; ++pass) {  // the second pass accumulates onto the first one's gradients
      reported.clear();
      Tape tape;
      tape.backward(model_loss(model, tape, token_ids(rng, 2, 66, c.vocab_size)));
      ASSERT_EQ(reported.size(), groups.size());
      const size_t last = groups.size() - 1;
      for (size_t i = 0; i + 2 < reported.size(); ++i) EXPECT_EQ(reported[i], i);
      EXPECT_EQ(reported[last - 1], last) << "the embedding's group, before layer 0's";
      EXPECT_EQ(reported[last], last - 1) << "layer 0's group, after its deferred weight gradients";
      for (const auto& [spec, var] : model.parameters())
        EXPECT_EQ(at_report.at(var.get()), var->grad.defined() ? var->grad.to_double_vector() : std::vector<double>{})
            << spec.name << " changed after its group was reported complete";
    }
    model.set_gradient_ready_hook(nullptr);
    Tape eval;
    eval.set_enabled(false);
    model.forward(eval, token_ids(rng, 1, 3, c.vocab_size));
    EXPECT_EQ(eval.size(), 0u) << "no markers without a hook or with the tape off";
  }
}

// Under data parallelism (a gradient-ready hook set) layer 0's weight gradients run after the embedding's backward:
// the same GEMMs on the same operands, so the same loss and gradients bit for bit as without a hook, also when a
// second backward accumulates onto the first one's gradients, and under each way of recomputing activations.
TEST_P(EveryModelType, DeferredLayerZeroWeightGradientsChangeNoBits) {
  for (int variant = 0; variant < 5; ++variant) {
    ModelConfig c = tiny_config(GetParam());
    c.tie_word_embeddings = variant == 1;
    c.num_hidden_layers = variant == 2 ? 1 : 2;
    SCOPED_TRACE(detail::concat("variant ", variant));
    Rng rng(23);
    DecoderLM model(c, rng, DType::F64);
    set_knob(model, &ModelMemoryConfig::recompute, variant == 3);
    set_knob(model, &ModelMemoryConfig::recompute_mlp_projections, variant == 4);
    set_knob(model, &ModelMemoryConfig::recompute_elementwise, variant != 4);
    randomise_lower_bounds(model, rng);
    const Tensor ids = token_ids(rng, 2, 66, c.vocab_size);
    const std::vector<std::vector<Var>> groups = model.gradient_ready_groups();
    const size_t embedding_group = groups.size() - 1;
    std::vector<std::vector<double>> grads[2];
    double losses[2][2];
    for (int deferred = 0; deferred < 2; ++deferred) {
      int pass = 0;
      // Layer 0's weight matrices get their first gradients only after the embedding's report.
      model.set_gradient_ready_hook(!deferred ? std::function<void(size_t)>() : [&](size_t g) {
        if (g != embedding_group || pass > 0) return;
        for (const Var& v : groups[embedding_group - 1])
          if (v->value.dim() == 2) EXPECT_FALSE(v->grad.defined()) << v->name << " before the embedding's report";
      });
      for (const Var& v : parameter_vars(model)) v->grad = Tensor();
      for (pass = 0; pass < 2; ++pass) {
        Tape tape;
        const Var loss = model_loss(model, tape, ids);
        tape.backward(loss);
        losses[deferred][pass] = loss->value.item();
      }
      for (const Var& v : parameter_vars(model))
        grads[deferred].push_back(v->grad.defined() ? v->grad.to_double_vector() : std::vector<double>{});
    }
    model.set_gradient_ready_hook(nullptr);
    for (int pass = 0; pass < 2; ++pass) EXPECT_EQ(losses[0][pass], losses[1][pass]);
    for (size_t p = 0; p < grads[0].size(); ++p) EXPECT_EQ(grads[0][p], grads[1][p]) << "parameter " << p;
  }
}

// ZeRO-1 lets the weights' all-gather run on into the next forward, which must not read a group's parameters before
// it has asked for the group. Every parameter is NaN until the hook restores its group: the loss must be the
// untouched model's, bit for bit, and the groups asked for once each, from the last to the first.
TEST_P(EveryModelType, ParametersNeededHookComesBeforeEveryRead) {
  for (int variant = 0; variant < 4; ++variant) {
    ModelConfig c = tiny_config(GetParam());
    c.tie_word_embeddings = variant == 1;
    c.num_hidden_layers = variant == 2 ? 1 : 3;
    SCOPED_TRACE(detail::concat("tied ", c.tie_word_embeddings, ", layers ", c.num_hidden_layers, ", recompute ",
                                variant == 3));
    Rng rng(22);
    DecoderLM model(c, rng, DType::F64);
    set_knob(model, &ModelMemoryConfig::recompute, variant == 3);
    randomise_lower_bounds(model, rng);
    const Tensor ids = token_ids(rng, 2, 66, c.vocab_size);
    double expected = 0;
    {
      Tape tape;
      expected = model_loss(model, tape, ids)->value.item();
    }
    ASSERT_TRUE(std::isfinite(expected));
    const std::vector<std::vector<Var>> groups = model.gradient_ready_groups();
    std::map<const Variable*, Tensor> saved;
    for (const auto& [spec, var] : model.parameters()) {
      saved[var.get()] = var->value.clone();
      var->value.fill(std::nan(""));
    }
    std::vector<size_t> asked;
    model.set_parameters_needed_hook([&](size_t g) {
      asked.push_back(g);
      for (const Var& v : groups.at(g)) v->value.copy_from(saved.at(v.get()));
    });
    Tape tape;
    const double loss = model_loss(model, tape, ids)->value.item();
    model.set_parameters_needed_hook(nullptr);
    EXPECT_EQ(loss, expected) << "a parameter was read before its group was asked for";
    ASSERT_EQ(asked.size(), groups.size());
    for (size_t i = 0; i < asked.size(); ++i) EXPECT_EQ(asked[i], groups.size() - 1 - i);
  }
}

TEST_P(EveryModelType, TiedEmbeddingsGradientMatchesFiniteDifferences) {
  ModelConfig c = tiny_config(GetParam());
  c.tie_word_embeddings = true;
  c.num_hidden_layers = 2;
  Rng rng(43);
  DecoderLM model(c, rng, DType::F64);
  EXPECT_THROW(model.parameter("lm_head.weight"), Error);
  Tensor ids = token_ids(rng, 2, 4, c.vocab_size);
  testing::expect_gradients_match(
      [&](Tape& tape, const std::vector<Var>&) { return model_loss(model, tape, ids); }, parameter_vars(model), 8,
      1e-6, 1e-6);
}

TEST_P(EveryModelType, SingleLayerGetsNoLowerBoundGradient) {
  // With one layer, gamma_0 = 0 whatever Γ is: layer 0 skips the bound, so dΓ must be exactly zero.
  ModelConfig c = tiny_config(GetParam());
  c.num_hidden_layers = 1;
  Rng rng(44);
  DecoderLM model(c, rng, DType::F64);
  if (!lower_bounded(c)) {  // GLA, RetNet: no bounds at all, whatever model.use_lower_bound says
    EXPECT_TRUE(c.use_lower_bound);
    EXPECT_THROW(model.parameter("model.lower_bounds"), Error);
    return;
  }
  randomise_lower_bounds(model, rng);
  Tape tape;
  model.parameter("model.lower_bounds")->grad = Tensor();
  tape.backward(model_loss(model, tape, token_ids(rng, 2, 6, c.vocab_size)));
  const Var& bounds = model.parameter("model.lower_bounds");
  if (bounds->grad.defined())
    for (int64_t i = 0; i < bounds->grad.numel(); ++i) EXPECT_EQ(bounds->grad.item(i), 0.0) << "element " << i;
  // ... while the other parameters do get gradients (the check above is not vacuous).
  EXPECT_TRUE(model.parameter(first_mixer_weight(c))->grad.defined());
}

TEST_P(EveryModelType, ChunkwiseAndRecurrentModesGiveTheSameLogits) {
  ModelConfig c = tiny_config(GetParam());
  Rng rng_a(45), rng_b(45), rng_ids(46);
  DecoderLM chunked(c, rng_a, DType::F64);
  c.attn_mode = "fused_recurrent";
  DecoderLM recurrent(c, rng_b, DType::F64);
  Tensor ids = token_ids(rng_ids, 2, 70, c.vocab_size);  // two chunks of 64, the second partial
  Tape tape;
  tape.set_enabled(false);
  std::vector<double> a = chunked.forward(tape, ids)->value.to_double_vector();
  std::vector<double> b = recurrent.forward(tape, ids)->value.to_double_vector();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-10) << "logit " << i;
}

TEST(Hgrn1Model, ParametersFollowFlaNamesAndShapes) {
  // fla's HGRNForCausalLM with expand_ratio 2: the mixer's projections are input_dim = 16 wide, as the lower bounds.
  Rng rng(47);
  DecoderLM model(tiny_config("hgrn"), rng, DType::F32);
  EXPECT_EQ(model.parameter("model.lower_bounds")->value.shape(), (Shape{3, 16}));
  for (const char* proj : {"i_proj", "f_proj", "g_proj"})
    EXPECT_EQ(model.parameter(std::string("model.layers.1.attn.") + proj + ".weight")->value.shape(), (Shape{16, 8}));
  EXPECT_EQ(model.parameter("model.layers.1.attn.g_norm.weight")->value.shape(), (Shape{16}));
  EXPECT_EQ(model.parameter("model.layers.1.attn.o_proj.weight")->value.shape(), (Shape{8, 16}));
  EXPECT_THROW(model.parameter("model.layers.1.attn.q_proj.weight"), Error);
  // fla registers i, f, g, g_norm, o: the same order here, so the same initial draws for the same seed.
  std::vector<std::string> mixer;
  for (const auto& [spec, var] : model.parameters())
    if (spec.name.rfind("model.layers.0.attn.", 0) == 0) mixer.push_back(spec.name.substr(20));
  EXPECT_EQ(mixer, (std::vector<std::string>{"i_proj.weight", "f_proj.weight", "g_proj.weight", "g_norm.weight",
                                             "o_proj.weight"}));
}

TEST(Hgrn1ComplexModel, ParametersHaveTheComplexHgruLayout) {
  // d = 16 (expand_ratio 2): the recurrence's real and imaginary parts make the output gate and norm 2d = 32 wide.
  Rng rng(47);
  DecoderLM model(tiny_config("hgrn-complex"), rng, DType::F64);
  EXPECT_EQ(model.parameter("model.lower_bounds")->value.shape(), (Shape{3, 16}));
  std::vector<std::string> mixer;
  for (const auto& [spec, var] : model.parameters())
    if (spec.name.rfind("model.layers.0.attn.", 0) == 0) mixer.push_back(spec.name.substr(20));
  EXPECT_EQ(mixer, (std::vector<std::string>{"cr_proj.weight", "ci_proj.weight", "f_proj.weight", "g_proj.weight",
                                             "cr_proj.bias", "ci_proj.bias", "f_proj.bias", "g_proj.bias", "theta",
                                             "out_norm.weight", "out_norm.bias", "o_proj.weight", "o_proj.bias"}));
  const std::string p = "model.layers.1.attn.";
  EXPECT_EQ(model.parameter(p + "cr_proj.weight")->value.shape(), (Shape{16, 8}));
  EXPECT_EQ(model.parameter(p + "g_proj.weight")->value.shape(), (Shape{32, 8}));
  EXPECT_EQ(model.parameter(p + "g_proj.bias")->value.shape(), (Shape{32}));
  EXPECT_EQ(model.parameter(p + "out_norm.bias")->value.shape(), (Shape{32}));
  EXPECT_EQ(model.parameter(p + "o_proj.weight")->value.shape(), (Shape{8, 32}));
  EXPECT_EQ(model.parameter(p + "o_proj.bias")->value.shape(), (Shape{8}));
  // Biases zero, the norm's weight one, θ_j = 10000^(−2j/d).
  EXPECT_EQ(model.parameter(p + "f_proj.bias")->value.item(3), 0.0);
  EXPECT_EQ(model.parameter(p + "out_norm.weight")->value.item(3), 1.0);
  const Tensor& theta = model.parameter(p + "theta")->value;
  for (int64_t j = 0; j < 16; ++j) EXPECT_DOUBLE_EQ(theta.item(j), std::pow(10000.0, -2.0 * j / 16.0)) << j;
}

TEST(Hgrn2Model, ParametersFollowFlaNamesAndShapes) {
  ModelConfig c = tiny_config();
  Rng rng(47);
  DecoderLM model(c, rng, DType::F32);
  EXPECT_EQ(model.parameter("model.embeddings.weight")->value.shape(), (Shape{11, 8}));
  EXPECT_EQ(model.parameter("model.lower_bounds")->value.shape(), (Shape{3, 8}));
  EXPECT_EQ(model.parameter("model.layers.2.attn.q_proj.weight")->value.shape(), (Shape{8, 8}));
  EXPECT_EQ(model.parameter("model.layers.0.mlp.down_proj.weight")->value.shape(), (Shape{8, 12}));
  EXPECT_EQ(model.parameter("lm_head.weight")->value.shape(), (Shape{11, 8}));
  // fla initialisation: norms ones, lower bounds zeros, projections N(0, initializer_range).
  EXPECT_EQ(model.parameter("model.layers.1.attn.g_norm.weight")->value.item(3), 1.0);
  EXPECT_EQ(model.parameter("model.lower_bounds")->value.item(5), 0.0);
  const Tensor& w = model.parameter("model.layers.1.attn.i_proj.weight")->value;
  double sum_sq = 0;
  for (int64_t i = 0; i < w.numel(); ++i) sum_sq += w.item(i) * w.item(i);
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w.numel())), 0.5, 0.15);  // 64 draws: std within ~30%
}

TEST_P(EveryModelType, FusedProjectionsAreAdjacentAndStaySo) {
  Rng rng(50);
  DecoderLM model(tiny_config(GetParam()), rng, DType::F64);
  size_t runs = 0;
  for (const auto& [spec, var] : model.parameters()) runs += spec.adjacent_to_previous;
  // f, i and up in every layer; the complex HGRU's ci, f and g follow cr; GLA's k, v, g and gk_proj.0 follow q,
  // RetNet's k, v and g.
  const size_t per_layer = GetParam() == "gla" ? 5u : GetParam() == "hgrn-complex" || GetParam() == "retnet" ? 4u : 3u;
  EXPECT_EQ(runs, per_layer * static_cast<size_t>(tiny_config(GetParam()).num_hidden_layers));
  expect_fused_projections_adjacent(model, false, false);
  for (int step = 0; step < 2; ++step) {  // the first backward makes the gradients adjacent, the second adds to them
    Tape tape;
    tape.backward(model_loss(model, tape, token_ids(rng, 2, 9, tiny_config(GetParam()).vocab_size)));
    expect_fused_projections_adjacent(model, true, false);
  }
}

TEST_P(EveryModelType, SameSeedSameWeightsDifferentSeedDifferentWeights) {
  ModelConfig c = tiny_config(GetParam());
  Rng a(1), b(1), d(2);
  DecoderLM ma(c, a), mb(c, b), md(c, d);
  const std::string name = first_mixer_weight(c);
  EXPECT_EQ(ma.parameter(name)->value.to_double_vector(), mb.parameter(name)->value.to_double_vector());
  EXPECT_NE(ma.parameter(name)->value.to_double_vector(), md.parameter(name)->value.to_double_vector());
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {

TEST_P(EveryModelType, CarriedStateEqualsOneLongSequence) {
  // Reading a sequence in two pieces with the recurrent state carried over gives the logits of reading it whole:
  // the unlimited-context mode of `hgrn eval`. Both the step-by-step (<= 64 tokens) and chunkwise paths.
  ModelConfig c = tiny_config(GetParam());
  Rng rng(48), rng_ids(49);
  DecoderLM model(c, rng, DType::F64);
  randomise_lower_bounds(model, rng);
  for (int64_t first : {7, 70}) {
    SCOPED_TRACE(first);
    const int64_t second = 75, total = first + second;
    Tensor ids = token_ids(rng_ids, 2, total, c.vocab_size);
    Tensor part1 = Tensor::empty({2, first}, DType::I32), part2 = Tensor::empty({2, second}, DType::I32);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < total; ++t) {
        const int32_t id = ids.data<int32_t>()[b * total + t];
        if (t < first) part1.data<int32_t>()[b * first + t] = id;
        else part2.data<int32_t>()[b * second + t - first] = id;
      }
    Tape tape;
    tape.set_enabled(false);
    const std::vector<double> whole = model.forward(tape, ids)->value.to_double_vector();
    std::vector<Var> states;
    const std::vector<double> a = model.forward(tape, part1, &states)->value.to_double_vector();
    ASSERT_EQ(states.size(), 3u);
    const Shape state_shape = GetParam() == "hgrn2"          ? Shape{2, 2, 4, 4}
                              : GetParam() == "gla"          ? Shape{2, 2, 2, 4}
                              : GetParam() == "retnet"       ? Shape{2, 2, 4, 8}
                              : GetParam() == "hgrn-complex" ? Shape{2, 2, 16}
                                                             : Shape{2, 16};
    EXPECT_EQ(states[0]->value.shape(), state_shape);
    const std::vector<double> b = model.forward(tape, part2, &states)->value.to_double_vector();
    const int64_t v = c.vocab_size;
    for (int64_t bi = 0; bi < 2; ++bi)
      for (int64_t t = 0; t < total; ++t)
        for (int64_t j = 0; j < v; ++j) {
          const double got = t < first ? a[(bi * first + t) * v + j] : b[(bi * second + t - first) * v + j];
          ASSERT_NEAR(got, whole[(bi * total + t) * v + j], 1e-10) << "batch " << bi << " position " << t;
        }
  }
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {
INSTANTIATE_TEST_SUITE_P(Models, EveryModelType, ::testing::ValuesIn(model_variants()),
                         testing::variant_test_name);
}  // namespace
}  // namespace hgrn
