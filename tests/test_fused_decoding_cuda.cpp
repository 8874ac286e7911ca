// test_fused_decoding_cuda.cpp: the fused decoding path on the GPU (models/fused_decoder.h). Its kernels against
// their CPU references in fp64 on fresh random inputs and odd shapes (lower_bounded_gla_step,
// lower_bounded_gated_scan_step, row_argmax), fp32 and bf16, computed from the very values the GPU sees; the CUDA graph (allocation refused during a
// capture, the stream usable after a failed one); and whole tiny models of every member: the fused steps' logits and
// states against the CPU fp64 model's decode_step (fp32 and bf16), the graph's replay against the same kernels
// launched one by one (bit for bit), greedy decoding repeating and following the op-by-op GPU path wherever the
// logits' margin is wider than the two paths' difference, and memory flat in the generated length. The complex HGRU
// has no fused step: generation falls back to op by op there. Skipped (never passed) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gpu_test.h"
#include "gradcheck.h"
#include "model_fixtures.h"
#include "models/fused_decoder.h"
#include "models/generation.h"
#include "ops/hgrn2_gates.h"
#include "ops/lower_bounded_gated_scan.h"
#include "ops/lower_bounded_gla_step.h"
#include "ops/row_argmax.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cuda_graph.h"
#endif

namespace hgrn {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::round_through;
using testing::to_gpu;

// The layers' lower bounds γ [layers, width] (fp64) of random Γ.
Tensor random_gamma(Rng& rng, int64_t layers, int64_t width) {
  Tape tape;
  tape.set_enabled(false);
  return lower_bound_transform(tape, make_var(random_tensor(rng, {layers, width})))->value;
}

// ---- the kernels ----

struct GlaStepShape {
  int64_t B, H, K, V;
};

// out and the new state against the CPU fp64 step on the same (rounded) inputs. The inputs are column blocks of one
// wider tensor (three spare columns: row-strided, as the fused projection's output is). Tolerances: fp32 arithmetic
// over K-term sums, 1e-5 relative RMS (1e-6 for the state, one multiply-add per element); bf16 adds the output's
// rounding to 8 mantissa bits (2^-9 relative per element), which 6e-3 relative RMS bounds (and 0.1 absolute, half an
// ulp of outputs up to 25), while a wrong gate or a missing term gives errors of order 1.
TEST(LowerBoundedGlaStepCuda, MatchesTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  constexpr int64_t L = 3;
  Rng rng(91);
  for (const GlaStepShape s : {GlaStepShape{5, 3, 20, 33}, GlaStepShape{2, 2, 128, 128}, GlaStepShape{1, 1, 1, 1},
                               GlaStepShape{3, 2, 300, 40}}) {
    const int64_t F = s.H * s.K, W = 2 * F + s.H * s.V + 3;
    const Tensor gamma = round_through(random_gamma(rng, L, F), DType::F32);
    for (DType act : {DType::F32, DType::BF16})
      for (int64_t layer : {0, 2}) {
        SCOPED_TRACE(::testing::Message() << "B=" << s.B << " H=" << s.H << " K=" << s.K << " V=" << s.V << " "
                                          << dtype_name(act) << " layer " << layer);
        const Tensor qfv = round_through(random_tensor(rng, {s.B, W}, 1.5), act);
        const Tensor initial = round_through(random_tensor(rng, {s.B, s.H, s.K, s.V}), DType::F32);
        const double scale = 1.0 / std::sqrt(static_cast<double>(s.K));
        Tensor state = initial.clone(), out = Tensor::empty({s.B, s.H * s.V}, DType::F64);
        lower_bounded_gla_step(qfv.columns(0, F), qfv.columns(F, F), qfv.columns(2 * F, s.H * s.V), gamma, layer,
                               s.H, scale, state, out);
        const Tensor qfv_gpu = to_gpu(qfv, act), gamma_gpu = to_gpu(gamma, DType::F32);
        Tensor state_gpu = to_gpu(initial, DType::F32), out_gpu = Tensor::empty({s.B, s.H * s.V}, act, Device::CUDA);
        lower_bounded_gla_step(qfv_gpu.columns(0, F), qfv_gpu.columns(F, F), qfv_gpu.columns(2 * F, s.H * s.V),
                               gamma_gpu, layer, s.H, scale, state_gpu, out_gpu);
        expect_close(state_gpu, state, 1e-6, 1e-5, "state");
        expect_close(out_gpu, out, act == DType::F32 ? 1e-5 : 6e-3, act == DType::F32 ? 1e-4 : 1e-1, "out");
      }
  }
}

// As above for HGRN1's step: the state (fp32: 1e-6 relative RMS) and RMSNorm(h)·w·silu(ĝ) (fp32: 1e-5; bf16: the
// output's rounding, 6e-3), for widths of one warp's worth or less, of one pass and of several passes per thread.
TEST(LowerBoundedGatedScanStepCuda, MatchesTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  constexpr int64_t L = 2;
  constexpr double kEps = 1e-6;
  Rng rng(92);
  for (const auto [B, C] : {std::pair<int64_t, int64_t>{4, 7}, {2, 1000}, {1, 2048}, {3, 4100}}) {
    const Tensor gamma = round_through(random_gamma(rng, L, C), DType::F32);
    const Tensor norm_weight = round_through(random_tensor(rng, {C}), DType::F32);
    for (DType act : {DType::F32, DType::BF16})
      for (int64_t layer : {0, 1}) {
        SCOPED_TRACE(::testing::Message() << "B=" << B << " C=" << C << " " << dtype_name(act) << " layer " << layer);
        const Tensor ifg = round_through(random_tensor(rng, {B, 3 * C + 5}, 1.5), act);
        const Tensor initial = round_through(random_tensor(rng, {B, C}), DType::F32);
        Tensor state = initial.clone(), out = Tensor::empty({B, C}, DType::F64);
        lower_bounded_gated_scan_step(ifg.columns(0, C), ifg.columns(C, C), gamma, layer, state,
                                      ifg.columns(2 * C, C), norm_weight, kEps, out);
        const Tensor ifg_gpu = to_gpu(ifg, act);
        Tensor state_gpu = to_gpu(initial, DType::F32), out_gpu = Tensor::empty({B, C}, act, Device::CUDA);
        lower_bounded_gated_scan_step(ifg_gpu.columns(0, C), ifg_gpu.columns(C, C), to_gpu(gamma, DType::F32), layer,
                                      state_gpu, ifg_gpu.columns(2 * C, C), to_gpu(norm_weight, DType::F32), kEps,
                                      out_gpu);
        expect_close(state_gpu, state, 1e-6, 1e-5, "state");
        expect_close(out_gpu, out, act == DType::F32 ? 1e-5 : 6e-3, act == DType::F32 ? 1e-4 : 1e-1, "out");
      }
  }
}

// Exactly the CPU's choice, on rows the width of a GPT-2 vocabulary with ties planted at lower indices, NaNs
// scattered and one row all NaN (0), read below a limit through a row-strided view: rows 16-byte aligned (read as
// packs, the limit not a whole pack) and not; in bf16 many values tie by rounding.
TEST(RowArgmaxCuda, MatchesTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  constexpr int64_t kRows = 7, kWidth = 50304, kLimit = 50257;
  Rng rng(93);
  for (const int64_t stride : {kWidth + 2, kWidth + 8})
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", rows " + std::to_string(stride) + " apart");
      Tensor x = random_tensor(rng, {kRows, stride});
      for (int64_t r = 0; r < kRows; ++r) {
        x.set_item(r * stride + kLimit + 1, 100.0);  // the largest value lies past the limit
        if (r % 2) x.set_item(r * stride + static_cast<int64_t>(rng.below(kLimit)), std::nan(""));
      }
      for (int64_t c = 0; c < kLimit; ++c) x.set_item((kRows - 1) * stride + c, std::nan(""));
      x = round_through(x, dtype);
      // A tie with each row's maximum at a random lower index.
      Tensor want = Tensor::empty({kRows}, DType::I32);
      row_argmax(x.columns(0, kWidth), kLimit, want);
      for (int64_t r = 0; r < kRows; ++r) {
        const int32_t at = want.data<int32_t>()[r];
        if (at > 0)
          x.set_item(r * stride + static_cast<int64_t>(rng.below(static_cast<uint64_t>(at))), x.item(r * stride + at));
      }
      row_argmax(x.columns(0, kWidth), kLimit, want);
      EXPECT_EQ(want.data<int32_t>()[kRows - 1], 0);
      const Tensor x_gpu = to_gpu(x, dtype);
      Tensor got = Tensor::empty({kRows}, DType::I32, Device::CUDA);
      row_argmax(x_gpu.columns(0, kWidth), kLimit, got);
      const Tensor host = got.to(Device::CPU);
      for (int64_t r = 0; r < kRows; ++r) EXPECT_EQ(host.data<int32_t>()[r], want.data<int32_t>()[r]) << "row " << r;
    }
}

#ifdef HGRN_WITH_CUDA
// A request for memory during a capture is refused with a message naming the capture; the failed capture leaves the
// stream usable, and a graph captured after it replays what it captured.
TEST(GraphCaptureCuda, RefusesAllocationAndReplaysWhatItCaptured) {
  HGRN_SKIP_WITHOUT_GPU();
  Tensor t = Tensor::zeros({1000}, DType::F32, Device::CUDA);
  {
    CudaGraph failed;
    try {
      failed.capture([] { Tensor::empty({16}, DType::F32, Device::CUDA); });
      ADD_FAILURE() << "an allocation during a capture was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("captured"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(failed.captured());
  }
  CudaGraph graph;
  graph.capture([&] { t.fill(3.0); });
  EXPECT_EQ(t.to(Device::CPU).item(999), 0.0);  // captured, not run
  graph.replay();
  const Tensor host = t.to(Device::CPU);
  for (int64_t i = 0; i < host.numel(); ++i) ASSERT_EQ(host.item(i), 3.0) << i;
}
#endif

// ---- whole models ----

class FusedDecodingCuda : public ::testing::TestWithParam<std::string> {};

// HGRN2: 3 heads of K = V = 32; HGRN1 (real or complex): a recurrence 96 channels wide; 3 layers, vocabulary 41.
ModelConfig small_config(const std::string& type) {
  ModelConfig c;
  c.type = type == "hgrn-complex" ? "hgrn" : type;
  c.complex = type == "hgrn-complex";
  c.hidden_size = 96;
  c.num_hidden_layers = 3;
  c.expand_ratio = type == "hgrn2" ? 32 : 1;
  c.vocab_size = 41;
  c.intermediate_size = 100;
  c.initializer_range = 0.1;
  return c;
}

struct Models {
  DecoderLM gpu, cpu;
};

// A GPU model (fp32 master weights, `act` activations) and a CPU fp64 model of the same weights, with random lower
// bounds and norm weights.
Models make_models(const std::string& type, DType act, double initializer_range = 0.1) {
  ModelConfig c = small_config(type);
  c.initializer_range = initializer_range;
  Rng rng_a(31), rng_b(31), extra(32);
  Models m{DecoderLM(c, rng_a, DType::F32), DecoderLM(c, rng_b, DType::F64)};
  for (const auto& [spec, var] : m.gpu.parameters()) {
    if (spec.group == ParamGroup::LowerBound)
      for (int64_t i = 0; i < var->value.numel(); ++i) var->value.set_item(i, extra.normal());
    if (spec.group == ParamGroup::Norm)
      for (int64_t i = 0; i < var->value.numel(); ++i) var->value.set_item(i, 1.0 + 0.3 * extra.normal());
  }
  testing::mirror_on_cpu_then_move_to_gpu(m.gpu, m.cpu, act);
  return m;
}

Tensor random_ids(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  return testing::token_ids(rng, batch, seq, vocab);
}

std::unique_ptr<FusedDecoder> fused_decoder(const DecoderLM& model, int64_t batch, DType dtype, bool graph) {
  FusedDecoderOptions options;
  options.batch = batch;
  options.dtype = dtype;
  options.graph = graph;
  return model.make_fused_decoder(options);
}

// The fused steps (with the CUDA graph) give the CPU fp64 model's decode_step logits after prompts of 5 and 70 tokens
// (the step-by-step and the chunked prefill) and 4 new tokens, and its states. fp32: only the order of the arithmetic
// differs, 1e-4 of the largest logit through 3 layers (as the op-by-op GPU decoding's test). bf16: weights and
// activations rounded to 8 mantissa bits (2^-9 relative) at every step of 3 layers: 3% relative RMS and 0.1 of the
// largest logit bound that, while a wrong norm, gate or state update gives errors of order 100%. States: fp32 5e-4,
// bf16 5e-2 relative RMS.
void expect_fused_steps_match_the_cpu(const std::string& type, DType dtype) {
  Models m = make_models(type, dtype);
  if (!m.gpu.fused_decoding_refusal().empty()) GTEST_SKIP() << m.gpu.fused_decoding_refusal();
  constexpr int64_t kBatch = 2, kNewTokens = 4;
  const int64_t vocab = m.cpu.config().vocab_size;
  const double logits_rms = dtype == DType::F32 ? 1e-4 : 3e-2, logits_max = dtype == DType::F32 ? 1e-4 : 1e-1;
  const double states_rms = dtype == DType::F32 ? 5e-4 : 5e-2;
  for (int64_t prompt_length : {5, 70}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", prompt of " << prompt_length);
    const Tensor ids = random_ids(kBatch, prompt_length + kNewTokens, vocab, 40 + prompt_length);
    const std::unique_ptr<FusedDecoder> fused = fused_decoder(m.gpu, kBatch, dtype, /*graph=*/true);
    EXPECT_TRUE(fused->uses_graph());
    std::vector<RecurrentState> states;
    Tensor want = prefill(m.cpu, id_columns(ids, 0, prompt_length), states);
    prefill(*fused, m.gpu, id_columns(ids, 0, prompt_length));
    double scale = 0;
    for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::fabs(want.item(i)));
    expect_close(fused->logits(), want, logits_rms, logits_max * scale, "logits after the prompt");
    for (int64_t t = prompt_length; t < prompt_length + kNewTokens; ++t) {
      const Tensor next = id_columns(ids, t, 1).reshape({kBatch});
      want = m.cpu.decode_step(next, states);
      fused->step(next);
      expect_close(fused->logits(), want, logits_rms, logits_max * scale, "logits at " + std::to_string(t));
    }
    const std::vector<RecurrentState> got = fused->states();
    for (size_t l = 0; l < states.size(); ++l)
      expect_close(got[l].tensor, states[l].tensor, states_rms, 1e30, "state of layer " + std::to_string(l));
  }
}

TEST_P(FusedDecodingCuda, Fp32StepsMatchTheCpuDecoding) {
  HGRN_SKIP_WITHOUT_GPU();
  expect_fused_steps_match_the_cpu(GetParam(), DType::F32);
}

TEST_P(FusedDecodingCuda, Bf16StepsMatchTheCpuDecoding) {
  HGRN_SKIP_WITHOUT_GPU();
  expect_fused_steps_match_the_cpu(GetParam(), DType::BF16);
}

// Replaying the graph is launching the same kernels one by one: the same bits, logits at every step and the states.
TEST_P(FusedDecodingCuda, GraphReplayGivesTheBitsOfTheStepsLaunchedOneByOne) {
  HGRN_SKIP_WITHOUT_GPU();
  Models m = make_models(GetParam(), DType::BF16);
  if (!m.gpu.fused_decoding_refusal().empty()) GTEST_SKIP() << m.gpu.fused_decoding_refusal();
  constexpr int64_t kBatch = 3;
  const Tensor ids = random_ids(kBatch, 30, m.gpu.config().vocab_size, 51);
  const std::unique_ptr<FusedDecoder> replayed = fused_decoder(m.gpu, kBatch, DType::BF16, true);
  const std::unique_ptr<FusedDecoder> launched = fused_decoder(m.gpu, kBatch, DType::BF16, false);
  EXPECT_TRUE(replayed->uses_graph());
  EXPECT_FALSE(launched->uses_graph());
  prefill(*replayed, m.gpu, id_columns(ids, 0, 20));
  prefill(*launched, m.gpu, id_columns(ids, 0, 20));
  for (int64_t t = 20; t < 30; ++t) {
    const Tensor a = replayed->logits().to(Device::CPU), b = launched->logits().to(Device::CPU);
    ASSERT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "logits before token " << t;
    EXPECT_EQ(replayed->greedy_tokens(), launched->greedy_tokens());
    const Tensor next = id_columns(ids, t, 1).reshape({kBatch});
    replayed->step(next);
    launched->step(next);
  }
  const std::vector<RecurrentState> a = replayed->states(), b = launched->states();
  for (size_t l = 0; l < a.size(); ++l) {
    const Tensor x = a[l].tensor.to(Device::CPU), y = b[l].tensor.to(Device::CPU);
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << "state of layer " << l;
  }
}

// The first position where two token sequences differ (their common length if none).
size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Greedy decoding on the fused path repeats exactly, and gives the op-by-op GPU path's tokens (fp32) wherever the
// reference's logits leave a margin between the best and the second best token wider than the two paths may differ
// by: where the two first part, the op-by-op path's logits at that position (fed the same tokens before it) must
// have a margin below that bound (fp32 fused: 2e-4 of the largest logit, twice the steps' tolerance above; bf16
// fused: 0.2, likewise). Weights of range 0.5 make peaked logits, so that the paths agree over many tokens. The
// complex HGRU falls back to op by op and says why.
TEST_P(FusedDecodingCuda, GreedyDecodingRepeatsAndFollowsTheOpByOpPath) {
  HGRN_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Models m = make_models(GetParam(), DType::F32, /*initializer_range=*/0.5);
    GenerationOptions options;
    options.max_new_tokens = 40;
    options.batch = 2;
    options.sampling.temperature = 0;
    const GenerationResult ops = generate(m.gpu, prompt, options);
    options.decode = DecodePath::Fused;
    options.fused_dtype = dtype;
    const GenerationResult fused = generate(m.gpu, prompt, options);
    if (!m.gpu.fused_decoding_refusal().empty()) {
      EXPECT_FALSE(fused.fused);
      EXPECT_EQ(fused.fallback_reason, m.gpu.fused_decoding_refusal());  // says why it fell back
      EXPECT_EQ(fused.sequences[0].ids, ops.sequences[0].ids);  // the same op-by-op decoding
      continue;
    }
    ASSERT_TRUE(fused.fused && fused.graph);
    EXPECT_EQ(generate(m.gpu, prompt, options).sequences[0].ids, fused.sequences[0].ids) << "not repeated";
    const std::vector<int32_t>& want = ops.sequences[0].ids;
    const size_t parted = first_difference(fused.sequences[0].ids, want);
    std::cout << "[ info ] " << dtype_name(dtype) << ": the fused and op-by-op paths agree on " << parted << " of "
              << want.size() << " tokens\n";
    if (parted == want.size()) continue;
    // The op-by-op logits at the parting position, fed the prompt and the tokens both chose before it.
    std::vector<int32_t> text = prompt;
    text.insert(text.end(), want.begin(), want.begin() + static_cast<std::ptrdiff_t>(parted));
    std::vector<RecurrentState> states;
    const Tensor logits = prefill(m.gpu, Tensor::from_vector(text, {1, static_cast<int64_t>(text.size())}), states)
                              .to(Device::CPU);
    std::vector<double> row = logits.to_double_vector();
    double scale = 0;
    for (double v : row) scale = std::max(scale, std::fabs(v));
    std::sort(row.begin(), row.end(), std::greater<double>());
    const double bound = (dtype == DType::F32 ? 2e-4 : 0.2) * scale;
    EXPECT_LT(row[0] - row[1], bound) << "the paths part at token " << parted << " where the margin is "
                                      << row[0] - row[1];
  }
}

// Nothing is allocated per token: after the set-up and the first steps, further steps leave the memory in use, its
// high-water mark and the driver's allocations where they were, through the decoder and through generate().
TEST_P(FusedDecodingCuda, MemoryStaysFlatInTheGeneratedLength) {
  HGRN_SKIP_WITHOUT_GPU();
  Models m = make_models(GetParam(), DType::BF16);
  if (!m.gpu.fused_decoding_refusal().empty()) GTEST_SKIP() << m.gpu.fused_decoding_refusal();
  constexpr int64_t kBatch = 3;
  const std::unique_ptr<FusedDecoder> fused = fused_decoder(m.gpu, kBatch, DType::BF16, true);
  prefill(*fused, m.gpu, random_ids(kBatch, 12, m.gpu.config().vocab_size, 61));
  const auto feed_back = [&](int64_t steps) {
    for (int64_t s = 0; s < steps; ++s) {
      const std::vector<int32_t> next = fused->greedy_tokens();
      fused->step(Tensor::from_vector(next, {kBatch}));
    }
    device_synchronize();
  };
  feed_back(8);
  const CudaMemoryStats before = cuda_memory_stats();
  cuda_reset_peak_memory();
  feed_back(300);
  const CudaMemoryStats after = cuda_memory_stats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.peak_in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.driver_allocations, before.driver_allocations);

  // generate()'s loop, greedy (chosen on the device) and sampled (the logits read on the host): from its 8th token to
  // its 400th the memory in use stays where it was and so does its high-water mark.
  for (bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "sampled");
    GenerationOptions options;
    options.batch = kBatch;
    options.max_new_tokens = 400;
    options.sampling.temperature = greedy ? 0.0 : 1.0;
    options.decode = DecodePath::Fused;
    int64_t calls = 0;
    CudaMemoryStats at_8th{}, at_last{};
    const GenerationResult r = generate(m.gpu, {1, 2, 3, 4, 5}, options, [&](const std::vector<int32_t>&) {
      ++calls;
      if (calls != 8 && calls != options.max_new_tokens) return;
      device_synchronize();
      if (calls == 8) {
        at_8th = cuda_memory_stats();
        cuda_reset_peak_memory();
      } else {
        at_last = cuda_memory_stats();
      }
    });
    ASSERT_TRUE(r.fused);
    ASSERT_EQ(calls, options.max_new_tokens);
    EXPECT_EQ(at_last.in_use_bytes, at_8th.in_use_bytes);
    EXPECT_EQ(at_last.peak_in_use_bytes, at_8th.in_use_bytes);
    EXPECT_EQ(at_last.driver_allocations, at_8th.driver_allocations);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FusedDecodingCuda, ::testing::ValuesIn(testing::gpu_model_variants()),
                         testing::variant_test_name);

}  // namespace
}  // namespace hgrn
