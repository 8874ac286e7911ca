// test_fused_decoding.cpp: the fused decoding path on the CPU (models/fused_decoder.h; on the GPU:
// test_fused_decoding_cuda.cpp): its steps give decode_step's logits and states for every member that has a fused
// step, generate() gives the op-by-op path's tokens (greedy and sampled), greedy steps queued ahead of the host give
// the host-fed steps' tokens, the complex HGRU falls back to op by op,
// bad options are refused; and the ops it adds: two in-place steps of lower_bounded_gla_step and
// lower_bounded_gated_scan_step equal the sequence ops over two positions (which take another path: the chunkwise
// form), and row_argmax on hand-made rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "model_fixtures.h"
#include "models/fused_decoder.h"
#include "models/generation.h"
#include "ops/activations.h"
#include "ops/gla_recurrence.h"
#include "ops/hgrn2_gates.h"
#include "ops/lower_bounded_gated_scan.h"
#include "ops/lower_bounded_gla_step.h"
#include "ops/rmsnorm.h"
#include "ops/row_argmax.h"

namespace hgrn {
namespace {

using testing::max_abs;
using testing::random_tensor;
using testing::randomise_lower_bounds;
using testing::tiny_config;
using testing::token_ids;

double max_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(shape_str(a.shape()), shape_str(b.shape()));
  const std::vector<double> x = a.to_double_vector(), y = b.to_double_vector();
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  return worst;
}

// ---- the decoder ----

class FusedDecodingOfEveryModelType : public ::testing::TestWithParam<std::string> {};

// The tiny model with random lower bounds and norm weights (not all ones, so that a norm applied in the wrong place
// shows).
DecoderLM random_model(const std::string& type, uint64_t seed) {
  Rng rng(seed);
  DecoderLM model(tiny_config(type), rng, DType::F64);
  randomise_lower_bounds(model, rng);
  for (const auto& [spec, var] : model.parameters())
    if (spec.group == ParamGroup::Norm)
      for (int64_t i = 0; i < var->value.numel(); ++i) var->value.set_item(i, 1.0 + 0.5 * rng.normal());
  return model;
}

// fp64: the fused steps run the same ops as decode_step on the same values (its mixer steps are the ops' CPU
// references, which are the op-by-op compositions), so only the GEMMs' blocking may differ: 1e-12 on logits of
// order 1..10 and on states.
TEST_P(FusedDecodingOfEveryModelType, StepsGiveTheOpByOpLogitsAndStates) {
  const ModelConfig c = tiny_config(GetParam());
  Rng rng_ids(82);
  DecoderLM model = random_model(GetParam(), 81);
  if (!model.fused_decoding_refusal().empty()) {
    // HGRN2 and HGRN1 have fused steps; a member without one (the complex HGRU, GLA, RetNet) says so, and making
    // one is refused with that reason.
    EXPECT_TRUE(GetParam() != "hgrn2" && GetParam() != "hgrn") << model.fused_decoding_refusal();
    FusedDecoderOptions options;
    options.dtype = DType::F64;
    try {
      model.make_fused_decoder(options);
      ADD_FAILURE() << "a fused decoder was made for a mixer without a fused step";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("op by op"), std::string::npos) << e.what();
    }
    return;
  }
  constexpr int64_t kBatch = 3, kNewTokens = 5;
  for (int64_t prompt_length : {1, 5, 70}) {  // a lone token, the step-by-step prefill, the chunkwise one
    SCOPED_TRACE(prompt_length);
    const Tensor ids = token_ids(rng_ids, kBatch, prompt_length + kNewTokens, c.vocab_size);
    FusedDecoderOptions options;
    options.batch = kBatch;
    options.dtype = DType::F64;
    const std::unique_ptr<FusedDecoder> fused = model.make_fused_decoder(options);
    EXPECT_FALSE(fused->uses_graph());  // no CUDA graph on the CPU: the same steps run eagerly
    std::vector<RecurrentState> states;
    const Tensor first = prefill(model, id_columns(ids, 0, prompt_length), states);
    prefill(*fused, model, id_columns(ids, 0, prompt_length));
    EXPECT_LE(max_difference(fused->logits(), first), 1e-12);
    for (int64_t t = prompt_length; t < prompt_length + kNewTokens; ++t) {
      const Tensor next = id_columns(ids, t, 1).reshape({kBatch});
      const Tensor want = model.decode_step(next, states);
      fused->step(next);
      ASSERT_LE(max_difference(fused->logits(), want), 1e-12) << "token " << t;
      // The greedy choice is the argmax of the logits.
      const std::vector<double> rows = want.to_double_vector();
      const std::vector<int32_t> greedy = fused->greedy_tokens();
      for (int64_t b = 0; b < kBatch; ++b) {
        const auto row = rows.begin() + b * c.vocab_size;
        EXPECT_EQ(greedy[b], std::max_element(row, row + c.vocab_size) - row) << "sequence " << b;
      }
    }
    const std::vector<RecurrentState> fused_states = fused->states();
    ASSERT_EQ(fused_states.size(), states.size());
    for (size_t l = 0; l < states.size(); ++l)
      EXPECT_LE(max_difference(fused_states[l].tensor, states[l].tensor), 1e-12) << "layer " << l;
  }
}

// generate() on the fused path gives the op-by-op path's tokens, greedy (chosen by row_argmax) and sampled (on the
// host from the fused logits, with a penalty and cuts); the complex HGRU falls back to op by op and says why.
TEST_P(FusedDecodingOfEveryModelType, GenerationGivesTheOpByOpTokens) {
  const ModelConfig c = tiny_config(GetParam());
  DecoderLM model = random_model(GetParam(), 83);
  const std::vector<int32_t> prompt = {2, 7, 1, 8, 2, 8};
  for (bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "sampled");
    GenerationOptions options;
    options.max_new_tokens = 14;
    options.batch = 3;
    options.seed = 5;
    options.vocab_limit = c.vocab_size - 1;  // the last id is never chosen
    if (greedy) {
      options.sampling.temperature = 0;
    } else {
      options.sampling.temperature = 0.8;
      options.sampling.top_k = 6;
      options.sampling.top_p = 0.9;
      options.sampling.repetition_penalty = 1.3;
    }
    const GenerationResult ops = generate(model, prompt, options);
    options.decode = DecodePath::Fused;
    const GenerationResult fused = generate(model, prompt, options);
    const bool has_fused_step = model.fused_decoding_refusal().empty();
    EXPECT_EQ(fused.fused, has_fused_step);
    EXPECT_EQ(fused.fallback_reason.empty(), has_fused_step) << fused.fallback_reason;
    EXPECT_FALSE(fused.graph);
    ASSERT_EQ(fused.sequences.size(), ops.sequences.size());
    for (size_t b = 0; b < ops.sequences.size(); ++b) {
      EXPECT_EQ(fused.sequences[b].ids, ops.sequences[b].ids) << "sequence " << b;
      EXPECT_EQ(fused.sequences[b].ids.size(), 14u);
      for (int32_t id : fused.sequences[b].ids) EXPECT_LT(id, c.vocab_size - 1);
    }
  }
}

// Greedy steps queued ahead of the host feed each other their choices: the tokens of steps the host feeds one at a
// time (step(greedy_tokens())), read in order with kQueuedGreedySteps queued; a ticket no longer (or not yet) in
// flight is refused. generate() on this path stops at EOS with the tokens before it (the steps queued past it are
// collected, not read).
TEST(FusedDecoding, QueuedGreedyStepsGiveTheHostFedSteps) {
  const ModelConfig c = tiny_config("hgrn2");
  DecoderLM model = random_model("hgrn2", 86);
  Rng rng_ids(87);
  constexpr int64_t kBatch = 2, kSteps = 7, kQueued = FusedDecoder::kQueuedGreedySteps;
  const Tensor prompt = token_ids(rng_ids, kBatch, 5, c.vocab_size);
  FusedDecoderOptions options;
  options.batch = kBatch;
  options.dtype = DType::F64;
  const std::unique_ptr<FusedDecoder> fed = model.make_fused_decoder(options);
  const std::unique_ptr<FusedDecoder> queued = model.make_fused_decoder(options);
  prefill(*fed, model, prompt);
  prefill(*queued, model, prompt);
  std::vector<std::vector<int32_t>> want;
  for (int64_t t = 0; t < kSteps; ++t) {
    const std::vector<int32_t> ids = fed->greedy_tokens();
    Tensor next = Tensor::empty({kBatch}, DType::I32);
    std::copy(ids.begin(), ids.end(), next.data<int32_t>());
    fed->step(next);
    want.push_back(fed->greedy_tokens());
  }
  std::vector<int64_t> tickets;
  for (int64_t t = 0; t < kQueued; ++t) tickets.push_back(queued->queue_greedy_step());
  for (int64_t t = 0; t < kSteps; ++t) {
    EXPECT_EQ(queued->queued_greedy_tokens(tickets[t]), want[t]) << "step " << t;
    if (t + kQueued < kSteps) tickets.push_back(queued->queue_greedy_step());
  }
  EXPECT_THROW(queued->queued_greedy_tokens(tickets[kSteps - kQueued - 1]), Error);
  EXPECT_THROW(queued->queued_greedy_tokens(kSteps), Error);

  GenerationOptions generation;
  generation.max_new_tokens = 12;
  generation.sampling.temperature = 0;
  generation.decode = DecodePath::Fused;
  const GenerationResult all = generate(model, {2, 7, 1}, generation);
  ASSERT_TRUE(all.fused);
  generation.eos_id = all.sequences[0].ids[4];
  const GenerationResult stopped = generate(model, {2, 7, 1}, generation);
  EXPECT_TRUE(stopped.sequences[0].stopped_at_eos);
  const auto first = std::find(all.sequences[0].ids.begin(), all.sequences[0].ids.end(), *generation.eos_id);
  EXPECT_EQ(stopped.sequences[0].ids, std::vector<int32_t>(all.sequences[0].ids.begin(), first));
}

INSTANTIATE_TEST_SUITE_P(Models, FusedDecodingOfEveryModelType, ::testing::ValuesIn(testing::model_variants()),
                         testing::variant_test_name);

TEST(FusedDecoding, RefusesWhatDoesNotFit) {
  const ModelConfig c = tiny_config("hgrn2");
  Rng rng(84);
  DecoderLM model(c, rng, DType::F32);
  const auto refused = [&](const FusedDecoderOptions& options, const std::string& says) {
    try {
      model.make_fused_decoder(options);
      ADD_FAILURE() << "accepted; expected an error saying " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  FusedDecoderOptions options;
  options.dtype = DType::BF16;
  refused(options, "bf16 decoding needs the GPU");
  options.dtype = DType::F32;
  options.batch = 0;
  refused(options, "at least 1 sequence");
  options.batch = 2;
  options.vocab_limit = c.vocab_size + 1;
  refused(options, "does not fit the model's vocabulary");
  options.vocab_limit = 0;
  const std::unique_ptr<FusedDecoder> fused = model.make_fused_decoder(options);
  const int32_t outside = static_cast<int32_t>(c.vocab_size);
  EXPECT_THROW(fused->step(Tensor::from_vector<int32_t>({1, outside}, {2})), Error);       // an id outside
  EXPECT_THROW(fused->step(Tensor::from_vector<int32_t>({1, 2, 3}, {3})), Error);          // not the batch
  EXPECT_THROW(fused->set_states(std::vector<RecurrentState>(1)), Error);                  // not one per layer
  fused->set_states(std::vector<RecurrentState>(static_cast<size_t>(c.num_hidden_layers)));  // zero states
  fused->step(Tensor::from_vector<int32_t>({1, 2}, {2}));
}

// ---- the ops ----

// Position t of a [B, 2, W] tensor as a [B, W] tensor, and its columns [begin, begin + width) as a row-strided view
// (the layout the fused steps read: column blocks of one projection's output).
Tensor position(const Tensor& sequence, int64_t t) {
  const int64_t B = sequence.size(0), W = sequence.size(2);
  Tensor rows = Tensor::empty({B, W}, sequence.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < W; ++j) rows.set_item(b * W + j, sequence.item((b * 2 + t) * W + j));
  return rows;
}
Var columns_of(const Tensor& sequence, int64_t begin, int64_t width) {
  Tensor c = Tensor::empty({sequence.size(0), sequence.size(1), width}, sequence.dtype());
  c.copy_from(sequence.columns(begin, width));
  return make_var(c);
}

Tensor lower_bounds_gamma(Rng& rng, int64_t layers, int64_t width) {
  Tape tape;
  tape.set_enabled(false);
  return lower_bound_transform(tape, make_var(random_tensor(rng, {layers, width})))->value;
}

// Two in-place steps of lower_bounded_gla_step from a random state are the HGRN2 gates and the chunkwise recurrence
// over the two positions from that initial state (fp64: 1e-12); layer 0 (unbounded) and a bounded layer.
TEST(LowerBoundedGlaStep, TwoStepsAreTheRecurrenceOverTwoPositions) {
  constexpr int64_t B = 2, H = 3, K = 4, V = 5, L = 3, W = 2 * H * K + H * V;
  constexpr double kScale = 0.5;
  Rng rng(85);
  const Tensor gamma = lower_bounds_gamma(rng, L, H * K);
  for (int64_t layer : {0, 2}) {
    SCOPED_TRACE(layer);
    const Tensor qfv = random_tensor(rng, {B, 2, W});  // q̂ | f̂ | v per position
    const Tensor initial = random_tensor(rng, {B, H, K, V}, 0.5);
    Tensor state = initial.clone(), out = Tensor::empty({B, H * V}, DType::F64);
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < 2; ++t) {
      const Tensor rows = position(qfv, t);
      lower_bounded_gla_step(rows.columns(0, H * K), rows.columns(H * K, H * K), rows.columns(2 * H * K, H * V),
                             gamma, layer, H, kScale, state, out);
      outs.push_back(out.clone());
    }
    Tape tape;
    tape.set_enabled(false);
    const Hgrn2Gates gates =
        hgrn2_gates(tape, columns_of(qfv, 0, H * K), columns_of(qfv, H * K, H * K), make_var(gamma), layer);
    const GlaOutputs r = gla_recurrence(tape, gates.q, gates.k, columns_of(qfv, 2 * H * K, H * V), gates.g,
                                        make_var(initial.clone()), H, kScale, RecurrenceMode::Chunk, 16);
    for (int64_t t = 0; t < 2; ++t)
      EXPECT_LE(max_difference(outs[t], position(r.output->value, t)), 1e-12) << "position " << t;
    EXPECT_LE(max_difference(state, r.final_state->value), 1e-12);
    EXPECT_GT(max_difference(state, initial), 1e-2);  // the state was advanced in place
  }
}

// Two in-place steps of lower_bounded_gated_scan_step are the op over the two positions (its chunked form) from that
// initial state, then RMSNorm ⊙ w and silu(ĝ) (fp64: 1e-12); layer 0 and a bounded layer.
TEST(LowerBoundedGatedScanStep, TwoStepsAreTheScanAndGatedNormOverTwoPositions) {
  constexpr int64_t B = 3, C = 7, L = 2, W = 3 * C;
  constexpr double kEps = 1e-6;
  Rng rng(86);
  const Tensor gamma = lower_bounds_gamma(rng, L, C);
  const Tensor norm_weight = random_tensor(rng, {C});
  for (int64_t layer : {0, 1}) {
    SCOPED_TRACE(layer);
    const Tensor ifg = random_tensor(rng, {B, 2, W});  // î | f̂ | ĝ per position
    const Tensor initial = random_tensor(rng, {B, C}, 0.5);
    Tensor state = initial.clone(), out = Tensor::empty({B, C}, DType::F64);
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < 2; ++t) {
      const Tensor rows = position(ifg, t);
      lower_bounded_gated_scan_step(rows.columns(0, C), rows.columns(C, C), gamma, layer, state,
                                    rows.columns(2 * C, C), norm_weight, kEps, out);
      outs.push_back(out.clone());
    }
    Tape tape;
    tape.set_enabled(false);
    const GatedScanOutputs r = lower_bounded_gated_scan(tape, columns_of(ifg, 0, C), columns_of(ifg, C, C),
                                                        make_var(gamma), layer, make_var(initial.clone()),
                                                        ScanMode::Chunk);
    const Var gated = swiglu(tape, columns_of(ifg, 2 * C, C), rmsnorm(tape, r.output, make_var(norm_weight), kEps));
    for (int64_t t = 0; t < 2; ++t)
      EXPECT_LE(max_difference(outs[t], position(gated->value, t)), 1e-12) << "position " << t;
    EXPECT_LE(max_difference(state, r.final_state->value), 1e-12);
    EXPECT_GT(max_difference(state, initial), 1e-2);
  }
}

TEST(RowArgmax, TakesTheLowestIndexOfTheLargestValueBelowTheLimit) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  // Rows of 6 (the limit 5 leaves the last column out), read through a row-strided view of width 6 in 8.
  const std::vector<std::vector<double>> rows = {
      {1, 3, 2, 3, 0, 9},           // a tie: the lower index; the 9 is beyond the limit
      {nan, -1, nan, -0.5, -2, 9},  // NaN is never chosen
      {nan, nan, nan, nan, nan, 1},  // all NaN below the limit: 0
      {-inf, -inf, -inf, -inf, -inf, 1},  // all -inf: the first
      {-5, -4, -3, -2, -1, 0},      // the last one below the limit
  };
  for (DType dtype : {DType::F32, DType::F64}) {
    Tensor wide = Tensor::zeros({5, 8}, dtype);
    for (int64_t r = 0; r < 5; ++r)
      for (int64_t c = 0; c < 6; ++c) wide.set_item(r * 8 + c, rows[r][c]);
    Tensor out = Tensor::empty({5}, DType::I32);
    row_argmax(wide.columns(0, 6), 5, out);
    EXPECT_EQ(std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + 5), (std::vector<int32_t>{1, 3, 0, 0, 4}))
        << dtype_name(dtype);
  }
  Tensor out = Tensor::empty({2}, DType::I32);
  EXPECT_THROW(row_argmax(Tensor::zeros({2, 4}, DType::F32), 5, out), Error);  // a limit past the row
  EXPECT_THROW(row_argmax(Tensor::zeros({3, 4}, DType::F32), 4, out), Error);  // not one output per row
}

}  // namespace
}  // namespace hgrn
