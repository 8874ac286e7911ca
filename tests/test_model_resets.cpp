// test_model_resets.cpp: a whole model of every family member (and HGRN1's complex HGRU) reading a packed
// window with per-token resets at its document starts (CausalLM::forward's resets): the same logits, and the same
// gradient of every parameter, as its documents run one by one (fp64 on the CPU, with the chunked form in the packed
// window and mostly the step-by-step one in the short documents); the language-model loss of a packed batch with
// resets counts every position, the EOS positions' predictions of the next document's first token included
// (docs/data.md); and on the GPU, the packed window with resets against the CPU reference (fp32, bf16).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "data/batch_source.h"
#include "gpu_test.h"
#include "gradcheck.h"
#include "model_fixtures.h"
#include "models/decoder_lm.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "reset_test_support.h"
#include "train/lm_loss.h"

namespace hgrn {
namespace {

using testing::model_variants;
using testing::randomise_lower_bounds;
using testing::tiny_config;
using testing::parameter_vars;

class ModelResets : public ::testing::TestWithParam<std::string> {};

// Documents per row of a packed window of 80 tokens (> 64: the packed window takes the chunked form): a row that
// starts mid-document and has a document start on the 64-step chunk boundary, one of single-token documents around a
// long one, and one document only.
const testing::ResetRows kDocumentStarts{{0, 9, 10, 64, 71}, {0, 1, 2, 3, 60, 79}, {0}};
constexpr int64_t kWindow = 80;

// Logits and every parameter gradient of L = <logits, cotangent>, over the whole batch with the resets (packed), or
// over each document alone (one by one, the gradients summed over the documents).
struct ModelRun {
  Tensor logits;
  std::vector<Tensor> grads;
};

ModelRun packed(const CausalLM& model, const Tensor& ids, const Tensor& resets, const Tensor& cotangent) {
  for (const Var& v : parameter_vars(model)) v->grad = Tensor();
  Tape tape;
  const Var logits = model.forward(tape, ids, nullptr, resets);
  tape.backward(logits, on_device(cotangent.to(logits->value.dtype()), model.device()));
  ModelRun r{testing::host_f64(logits->value), {}};
  for (const Var& v : parameter_vars(model)) r.grads.push_back(testing::host_f64(v->grad));
  return r;
}

ModelRun one_by_one(const CausalLM& model, const Tensor& ids, const testing::ResetRows& starts,
                    const Tensor& cotangent) {
  for (const Var& v : parameter_vars(model)) v->grad = Tensor();
  const int64_t B = ids.size(0), T = ids.size(1);
  ModelRun r{Tensor::zeros({B, T, model.config().vocab_size}, DType::F64), {}};
  for (int64_t b = 0; b < B; ++b)
    for (const auto& [begin, end] : testing::segments_of(starts[static_cast<size_t>(b)], T)) {
      Tensor doc = Tensor::empty({1, end - begin}, DType::I32);
      for (int64_t t = begin; t < end; ++t) doc.data<int32_t>()[t - begin] = ids.data<int32_t>()[b * T + t];
      Tape tape;
      const Var logits = model.forward(tape, doc);  // gradients add up across the documents' backwards
      tape.backward(logits, testing::time_slice(cotangent, b, begin, end).to(logits->value.dtype()));
      testing::paste_time(r.logits, testing::host_f64(logits->value), b, begin);
    }
  for (const Var& v : parameter_vars(model)) r.grads.push_back(testing::host_f64(v->grad));
  return r;
}

TEST_P(ModelResets, PackedWindowEqualsItsDocumentsRunOneByOne) {
  for (const char* mode : {"chunk", "fused_recurrent"}) {
    SCOPED_TRACE(mode);
    ModelConfig c = tiny_config(GetParam());
    c.attn_mode = mode;
    Rng rng(5);
    DecoderLM model(c, rng, DType::F64);
    randomise_lower_bounds(model, rng);
    const Tensor ids = testing::token_ids(rng, 3, kWindow, c.vocab_size);
    const Tensor cotangent = testing::random_tensor(rng, {3, kWindow, c.vocab_size});
    const ModelRun a = packed(model, ids, testing::reset_flags(kDocumentStarts, kWindow), cotangent);
    const ModelRun b = one_by_one(model, ids, kDocumentStarts, cotangent);
    // fp64: the two differ only in the grouping of sums (chunked vs step-by-step forms, chunk boundaries elsewhere);
    // a state leaking across a document start changes the logits and gradients at O(1).
    EXPECT_LE(testing::relative_error(a.logits, b.logits), 1e-10);
    size_t p = 0;
    for (const auto& [spec, var] : model.parameters()) {
      EXPECT_LE(testing::relative_error(a.grads[p], b.grads[p]), 1e-10) << spec.name;
      ++p;
    }
  }
}

TEST_P(ModelResets, RecomputationKeepsTheResets) {
  // model.memory.recompute replays each layer's mixer in the backward: with the same flags, so the same bits.
  const ModelConfig c = tiny_config(GetParam());
  Rng rng(11);
  DecoderLM model(c, rng, DType::F64);
  const Tensor ids = testing::token_ids(rng, 3, kWindow, c.vocab_size);
  const Tensor resets = testing::reset_flags(kDocumentStarts, kWindow);
  const Tensor cotangent = testing::random_tensor(rng, {3, kWindow, c.vocab_size});
  const ModelRun kept = packed(model, ids, resets, cotangent);
  testing::set_knob(model, &ModelMemoryConfig::recompute, true);
  const ModelRun replayed = packed(model, ids, resets, cotangent);
  EXPECT_EQ(replayed.logits.to_double_vector(), kept.logits.to_double_vector());
  for (size_t p = 0; p < kept.grads.size(); ++p)
    EXPECT_EQ(replayed.grads[p].to_double_vector(), kept.grads[p].to_double_vector()) << p;
}

TEST_P(ModelResets, WithoutResetsThePackedWindowDiffers) {
  // The check above has teeth: without the flags the documents read each other's states.
  const ModelConfig c = tiny_config(GetParam());
  Rng rng(6);
  DecoderLM model(c, rng, DType::F64);
  const Tensor ids = testing::token_ids(rng, 3, kWindow, c.vocab_size);
  const Tensor cotangent = testing::random_tensor(rng, {3, kWindow, c.vocab_size});
  EXPECT_GT(testing::relative_error(packed(model, ids, Tensor(), cotangent).logits,
                                    one_by_one(model, ids, kDocumentStarts, cotangent).logits),
            1e-3);
}

TEST_P(ModelResets, EosPositionsCarryTheirLoss) {
  // docs/data.md: with resets the loss still counts every position. The EOS closing a document predicts the next
  // document's first token from the closing document alone (as fla and flame train): the packed batch's mean loss
  // is the sum over the documents run alone of their losses, each document's last target being the next one's first
  // token, over all B·T targets.
  const ModelConfig c = tiny_config(GetParam());
  Rng rng(7);
  DecoderLM model(c, rng, DType::F64);
  TokenBatch batch{testing::token_ids(rng, 3, kWindow, c.vocab_size), testing::token_ids(rng, 3, kWindow, c.vocab_size),
                   testing::reset_flags(kDocumentStarts, kWindow)};
  Tape no_grad;
  no_grad.set_enabled(false);
  const CrossEntropyResult whole = language_model_loss(model, no_grad, batch);
  EXPECT_EQ(whole.num_targets, 3 * kWindow);
  double total = 0;
  for (int64_t b = 0; b < 3; ++b)
    for (const auto& [begin, end] : testing::segments_of(kDocumentStarts[static_cast<size_t>(b)], kWindow)) {
      Tensor doc = Tensor::empty({1, end - begin}, DType::I32), targets = Tensor::empty({end - begin}, DType::I32);
      for (int64_t t = begin; t < end; ++t) {
        doc.data<int32_t>()[t - begin] = batch.inputs.data<int32_t>()[b * kWindow + t];
        targets.data<int32_t>()[t - begin] = batch.targets.data<int32_t>()[b * kWindow + t];
      }
      const Var logits = model.forward(no_grad, doc);
      const CrossEntropyResult part =
          cross_entropy(no_grad, reshape(no_grad, logits, {end - begin, c.vocab_size}), targets);
      total += part.loss->value.item() * static_cast<double>(part.num_targets);
    }
  EXPECT_NEAR(whole.loss->value.item(), total / static_cast<double>(3 * kWindow), 1e-12);
}

TEST_P(ModelResets, RefusesMismatchedFlags) {
  const ModelConfig c = tiny_config(GetParam());
  Rng rng(8);
  DecoderLM model(c, rng, DType::F64);
  const Tensor ids = testing::token_ids(rng, 2, 6, c.vocab_size);
  Tape tape;
  EXPECT_THROW(model.forward(tape, ids, nullptr, Tensor::zeros({2, 5}, DType::I32)), Error);
  EXPECT_THROW(model.forward(tape, ids, nullptr, Tensor::zeros({2, 6}, DType::F32)), Error);
}

// On the GPU: the packed window with resets against the CPU fp64 model with the same weights and resets. fp32 differs
// from fp64 by summation order only: 1e-4 relative over 3 layers, as test_model_cuda.cpp. In bf16 this tiny model
// (D = 8) amplifies the 2^-9 rounding to 5-15% relative RMS in the gradients with or without resets, and more at
// positions where a state restarts (there a per-head norm's output o_t = (q_t . k_t) v_t / K^1/2 gives q_t and k_t
// a gradient that is rounding noise); so in bf16 the resets are held to the error of the same window without them:
// logits within 1.5x (+1e-3) of it and the gradients' mean relative RMS within 2x. A reset the kernels missed
// changes every later output of its row by O(1), far outside either bound.
TEST_P(ModelResets, GpuPackedWindowMatchesTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  if (const std::string why = model_family(tiny_config(GetParam()).type).cuda_refusal(tiny_config(GetParam()));
      !why.empty())
    GTEST_SKIP() << why;
  for (DType act : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(act));
    ModelConfig c = tiny_config(GetParam());
    c.initializer_range = 0.1;
    Rng rng_a(9), rng_b(9);
    DecoderLM gpu(c, rng_a, DType::F32), cpu(c, rng_b, DType::F64);
    Rng lb(4);
    randomise_lower_bounds(gpu, lb);
    testing::mirror_on_cpu_then_move_to_gpu(gpu, cpu, act);
    for (int64_t window : {kWindow, int64_t{200}}) {
      SCOPED_TRACE(::testing::Message() << "window " << window);
      Rng rng(10 + window);
      const Tensor ids = testing::token_ids(rng, 6, window, c.vocab_size);
      const Tensor resets = testing::reset_flags(testing::reset_patterns(rng, 6, window), window);
      const Tensor cotangent = testing::round_through(testing::random_tensor(rng, {6, window, c.vocab_size}), act);
      const ModelRun got = packed(gpu, ids, resets, cotangent), want = packed(cpu, ids, resets, cotangent);
      if (act == DType::F32) {
        testing::expect_close(got.logits, want.logits, 1e-4, 1e30, "logits");
        size_t p = 0;
        for (const auto& [spec, var] : gpu.parameters()) {
          testing::expect_close(got.grads[p], want.grads[p], 1e-4, 1e30, spec.name);
          ++p;
        }
        continue;
      }
      const ModelRun got_plain = packed(gpu, ids, Tensor(), cotangent), want_plain = packed(cpu, ids, Tensor(), cotangent);
      const auto mean_grad_error = [](const ModelRun& a, const ModelRun& b) {
        double sum = 0;
        for (size_t p = 0; p < a.grads.size(); ++p) sum += testing::compare(a.grads[p], b.grads[p]).rel_rms;
        return sum / static_cast<double>(a.grads.size());
      };
      const double logits_error = testing::compare(got.logits, want.logits).rel_rms;
      const double plain_logits_error = testing::compare(got_plain.logits, want_plain.logits).rel_rms;
      EXPECT_LE(logits_error, 1.5 * plain_logits_error + 1e-3) << "bf16 logits, with resets against without";
      const double grad_error = mean_grad_error(got, want), plain_grad_error = mean_grad_error(got_plain, want_plain);
      EXPECT_LE(grad_error, 2.0 * plain_grad_error) << "bf16 gradients' mean relative RMS, with resets against without";
      EXPECT_LT(plain_grad_error, 0.3) << "bf16 without resets: the baseline itself";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelResets, ::testing::ValuesIn(model_variants()),
                         testing::variant_test_name);

}  // namespace
}  // namespace hgrn
