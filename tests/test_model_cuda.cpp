// test_model_cuda.cpp: a whole tiny model of every family member (HGRN2, HGRN1, and HGRN1's complex-valued HGRU as
// "hgrn-complex") on the GPU against the CPU reference in fp64: the loss and the gradient of every parameter (lower
// bounds included), for fp32 and for bf16 mixed-precision activations, over a sequence with a partial last chunk; the
// GPU forward + backward giving the same bits on a second run, with recomputation and with layer 0's weight gradients
// deferred (data parallelism); generation's prefill and decode steps on the GPU against the CPU forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu_test.h"
#include "gradcheck.h"
#include "model_fixtures.h"
#include "models/decoder_lm.h"
#include "models/generation.h"
#include "models/registry.h"

namespace hgrn {
namespace {

using testing::expect_close;
using testing::set_knob;

// HGRN2: H = 3 heads, K = V = 32. HGRN1 (real or complex): a recurrence 96 channels wide (an odd number of
// 32-channel groups). "hgrn-complex": HGRN1 with model.complex. GLA and RetNet: 3 heads at fla's expand_k and
// expand_v (GLA K = 16, V = 32; RetNet K = 32, V = 64).
class ModelCudaEveryType : public ::testing::TestWithParam<std::string> {};

ModelConfig small_config(const std::string& type) {
  ModelConfig c;
  c.type = type == "hgrn-complex" ? "hgrn" : type;
  c.complex = type == "hgrn-complex";
  c.hidden_size = 96;
  c.num_hidden_layers = 3;
  if (type == "gla" || type == "retnet")
    c.num_heads = 3;
  else
    c.expand_ratio = type == "hgrn2" ? 32 : 1;
  c.vocab_size = 41;
  c.intermediate_size = 100;  // not a power of two
  c.initializer_range = 0.1;
  return c;
}

struct LossAndGrads {
  double loss;
  std::vector<Tensor> grads;  // in parameter order
};

// Loss and every parameter gradient; ids on the CPU. initial_states (host fp64, one per layer; empty: zero states):
// each layer's carried state, copied to the model's device in fp32 (the states' dtype there) or kept fp64 on the CPU.
LossAndGrads loss_and_grads(const DecoderLM& model, const Tensor& ids, const std::vector<Tensor>& initial_states = {}) {
  for (const auto& [spec, var] : model.parameters()) var->grad = Tensor();
  std::vector<Var> states;
  for (const Tensor& s : initial_states)
    states.push_back(make_var(model.device() == Device::CUDA ? testing::to_gpu(s, DType::F32) : s.clone()));
  Tape tape;
  Var loss = testing::model_loss(model, tape, ids, states.empty() ? nullptr : &states);
  tape.backward(loss, on_device(Tensor::full({}, 1.0, loss->value.dtype()), model.device()));
  LossAndGrads r{loss->value.item(), {}};
  for (const auto& [spec, var] : model.parameters()) r.grads.push_back(var->grad.to(Device::CPU));
  return r;
}

// Random carried states (fp32-representable, fp64 on the host) of every layer for a batch of `batch`: the shapes
// of the states a forward leaves.
std::vector<Tensor> random_states(const DecoderLM& cpu_model, int64_t batch, uint64_t seed) {
  std::vector<Var> shapes;
  Tape tape;
  tape.set_enabled(false);
  cpu_model.forward(tape, Tensor::zeros({batch, 1}, DType::I32), &shapes);
  Rng rng(seed);
  std::vector<Tensor> states;
  for (const Var& s : shapes)
    states.push_back(testing::round_through(testing::random_tensor(rng, s->value.shape()), DType::F32));
  return states;
}

struct Models {
  DecoderLM gpu, cpu;
};

// The GPU model (fp32 master weights) and a CPU fp64 model holding exactly the same (fp32-representable) weights.
Models make_models(const std::string& type, DType act) {
  const ModelConfig c = small_config(type);
  Rng rng_a(21), rng_b(21);
  Models m{DecoderLM(c, rng_a, DType::F32), DecoderLM(c, rng_b, DType::F64)};
  Rng lb(4);  // random lower bounds exercise the softmax/cumsum backward
  testing::randomise_lower_bounds(m.gpu, lb);
  testing::mirror_on_cpu_then_move_to_gpu(m.gpu, m.cpu, act);
  return m;
}

Tensor random_ids(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  return testing::token_ids(rng, batch, seq, vocab);
}

void check_model(const std::string& type, DType act, double loss_tol, double grad_tol) {
  for (int64_t seq : {33, 130}) {  // step-by-step and chunked forms on the CPU; 130 = two full chunks + 2 tokens
    SCOPED_TRACE(::testing::Message() << dtype_name(act) << " activations, T = " << seq);
    Models m = make_models(type, act);
    const Tensor ids = random_ids(2, seq, small_config(type).vocab_size, 100 + seq);
    // From random carried states, not zero ones: from a zero state GLA's and RetNet's first output per head is
    // o_0 = K^-1/2 (q_0 . k_0) v_0, whose per-head norm does not depend on q_0 . k_0, so that the exact gradient
    // of q_0 and k_0 is 0 and the computed one is rounding noise scaled by 1 / |q_0 . k_0| (in any precision,
    // fla's included): a comparison of noise. A carried state keeps every position's output well conditioned.
    const std::vector<Tensor> states = random_states(m.cpu, 2, 200 + seq);
    const LossAndGrads gpu = loss_and_grads(m.gpu, ids, states), cpu = loss_and_grads(m.cpu, ids, states);
    EXPECT_NEAR(gpu.loss, cpu.loss, loss_tol * std::abs(cpu.loss));
    size_t p = 0;
    for (const auto& [spec, var] : m.gpu.parameters()) {
      ASSERT_EQ(gpu.grads[p].dtype(), DType::F32) << spec.name << ": master gradients are fp32";
      expect_close(gpu.grads[p], cpu.grads[p], grad_tol, 1e30, spec.name);
      ++p;
    }
  }
}

TEST_P(ModelCudaEveryType, Fp32LossAndEveryGradientMatchTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  // fp32 all the way (no TF32 GEMMs): only summation order differs from fp64; through 3 layers, 1e-4 relative.
  check_model(GetParam(), DType::F32, 1e-5, 1e-4);
}

TEST_P(ModelCudaEveryType, Bf16LossAndEveryGradientMatchTheCpuReference) {
  HGRN_SKIP_WITHOUT_GPU();
  // bf16 activations round every intermediate to 8 mantissa bits (2^-9 relative); after 3 layers of projections,
  // norms and the recurrence the gradients sit near 1% relative RMS: 5% bounds them without hiding a wrong formula
  // (a missing term or wrong sign gives errors of order 100%). GLA and RetNet round more often on the way (the
  // per-head gated norm; GLA's forget-gate gradient is a reverse cumulative sum of q⊙dq − k⊙dk, whose terms cancel):
  // 5-8% there, so 10%.
  const std::string type = GetParam();
  check_model(type, DType::BF16, 1e-2, type == "gla" || type == "retnet" ? 1e-1 : 5e-2);
}

// The fused projections' operands stay adjacent through to_device, the bf16 copies and the first gradients.
TEST_P(ModelCudaEveryType, FusedProjectionsStayAdjacentOnTheGpu) {
  HGRN_SKIP_WITHOUT_GPU();
  Models m = make_models(GetParam(), DType::BF16);
  testing::expect_fused_projections_adjacent(m.gpu, false, false);
  loss_and_grads(m.gpu, random_ids(2, 70, small_config(GetParam()).vocab_size, 5));
  testing::expect_fused_projections_adjacent(m.gpu, true, true);
}

TEST_P(ModelCudaEveryType, ForwardAndBackwardAreBitwiseDeterministic) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16}) {
    Models m = make_models(GetParam(), act);
    const Tensor ids = random_ids(3, 130, small_config(GetParam()).vocab_size, 9);
    const LossAndGrads a = loss_and_grads(m.gpu, ids), b = loss_and_grads(m.gpu, ids);
    EXPECT_EQ(a.loss, b.loss) << dtype_name(act);
    for (size_t p = 0; p < a.grads.size(); ++p)
      EXPECT_EQ(std::memcmp(a.grads[p].raw_data(), b.grads[p].raw_data(), a.grads[p].nbytes()), 0)
          << dtype_name(act) << " parameter " << p;
  }
}

TEST_P(ModelCudaEveryType, RecomputationGivesTheSameLossAndGradientsBitForBit) {
  HGRN_SKIP_WITHOUT_GPU();
  // model.memory.recompute re-runs each token mixer and MLP in the backward, model.memory.recompute_elementwise the gates,
  // norms and SwiGLU, model.memory.recompute_mlp_projections the MLP's gate and up GEMMs: the same deterministic kernels
  // on the same inputs, so the same bits as keeping everything (as on the CPU,
  // Hgrn2Model.RecomputationGivesTheSameLossAndGradientsBitForBit). Variants: elementwise; elementwise and full
  // blocks; elementwise and MLP projections; MLP projections alone; elementwise without the gates; the bf16 weight
  // copies dropped after each layer's forward and cast again in its backward (model.memory.recompute_weight_copies); the
  // recurrence's states kept from the forward by the first layer, or by every layer with full blocks recomputed
  // (model.memory.keep_recurrence_states: the backward's state pass skipped, its bits read instead); elementwise with the
  // gates kept but in the last layer (model.memory.recompute_gates_layers) and every layer's states kept.
  for (DType act : {DType::F32, DType::BF16}) {
    Models m = make_models(GetParam(), act);
    const Tensor ids = random_ids(2, 130, small_config(GetParam()).vocab_size, 17);
    set_knob(m.gpu, &ModelMemoryConfig::recompute_elementwise, false);
    const LossAndGrads plain = loss_and_grads(m.gpu, ids);
    for (int variant = 1; variant < 10; ++variant) {
      set_knob(m.gpu, &ModelMemoryConfig::recompute_elementwise, variant <= 3 || variant >= 5);
      set_knob(m.gpu, &ModelMemoryConfig::recompute, variant == 2 || variant == 8);
      set_knob(m.gpu, &ModelMemoryConfig::recompute_mlp_projections, variant == 3 || variant == 4);
      set_knob(m.gpu, &ModelMemoryConfig::recompute_gates, variant != 5 && variant != 9);
      set_knob(m.gpu, &ModelMemoryConfig::recompute_gates_layers, variant == 9 ? 1 : 0);
      set_knob(m.gpu, &ModelMemoryConfig::recompute_weight_copies, variant == 6);
      set_knob(m.gpu, &ModelMemoryConfig::keep_recurrence_states, variant == 7 ? 1 : variant >= 8 ? 1000 : 0);
      const LossAndGrads recomputed = loss_and_grads(m.gpu, ids);
      EXPECT_EQ(plain.loss, recomputed.loss) << dtype_name(act) << " variant " << variant;
      for (size_t p = 0; p < plain.grads.size(); ++p)
        EXPECT_EQ(std::memcmp(plain.grads[p].raw_data(), recomputed.grads[p].raw_data(), plain.grads[p].nbytes()), 0)
            << dtype_name(act) << " variant " << variant << " parameter " << p;
    }
  }
}

// With a gradient-ready hook set (data parallelism), layer 0's weight-gradient GEMMs run after the embedding's
// backward: the same bits as without a hook (as on the CPU, test_model.cpp), also with full blocks recomputed and
// with the bf16 weight copies cast again in the backward.
TEST_P(ModelCudaEveryType, DeferredLayerZeroWeightGradientsChangeNoBits) {
  HGRN_SKIP_WITHOUT_GPU();
  for (DType act : {DType::F32, DType::BF16}) {
    Models m = make_models(GetParam(), act);
    const Tensor ids = random_ids(2, 130, small_config(GetParam()).vocab_size, 19);
    for (int variant = 0; variant < 3; ++variant) {
      set_knob(m.gpu, &ModelMemoryConfig::recompute, variant == 1);
      set_knob(m.gpu, &ModelMemoryConfig::recompute_weight_copies, variant == 2);
      m.gpu.set_gradient_ready_hook(nullptr);
      const LossAndGrads plain = loss_and_grads(m.gpu, ids);
      m.gpu.set_gradient_ready_hook([](size_t) {});
      const LossAndGrads deferred = loss_and_grads(m.gpu, ids);
      m.gpu.set_gradient_ready_hook(nullptr);
      EXPECT_EQ(plain.loss, deferred.loss) << dtype_name(act) << " variant " << variant;
      for (size_t p = 0; p < plain.grads.size(); ++p)
        EXPECT_EQ(std::memcmp(plain.grads[p].raw_data(), deferred.grads[p].raw_data(), plain.grads[p].nbytes()), 0)
            << dtype_name(act) << " variant " << variant << " parameter " << p;
    }
  }
}

}  // namespace
}  // namespace hgrn

namespace hgrn {
namespace {
// Generation on the GPU: prefill and decode steps in fp32 give the logits of the CPU fp64 model's full forward on the
// same tokens (prompts of 5 and 70 tokens: the step-by-step and the chunked prefill). fp32 arithmetic through 3
// layers on logits of order 1: 1e-4 of the largest logit.
TEST_P(ModelCudaEveryType, PrefillAndDecodeStepsMatchTheCpuForward) {
  HGRN_SKIP_WITHOUT_GPU();
  Models m = make_models(GetParam(), DType::F32);
  constexpr int64_t kNewTokens = 4;
  for (int64_t prompt_length : {5, 70}) {
    SCOPED_TRACE(::testing::Message() << "prompt of " << prompt_length);
    const int64_t length = prompt_length + kNewTokens, vocab = m.cpu.config().vocab_size;
    const Tensor ids = random_ids(2, length, vocab, 31);
    Tape tape;
    tape.set_enabled(false);
    const Tensor full = m.cpu.forward(tape, ids)->value;
    double scale = 0;
    for (int64_t i = 0; i < full.numel(); ++i) scale = std::max(scale, std::fabs(full.item(i)));
    const auto expect_at = [&](const Tensor& logits, int64_t position) {
      const Tensor got = logits.to(Device::CPU).to(DType::F64);
      ASSERT_EQ(got.shape(), Shape({2, vocab}));
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t j = 0; j < vocab; ++j)
          ASSERT_NEAR(got.item(b * vocab + j), full.item((b * length + position) * vocab + j), 1e-4 * scale)
              << "sequence " << b << ", position " << position << ", logit " << j;
    };
    std::vector<RecurrentState> states;
    expect_at(prefill(m.gpu, id_columns(ids, 0, prompt_length), states), prompt_length - 1);
    for (int64_t t = prompt_length; t < length; ++t)
      expect_at(m.gpu.decode_step(id_columns(ids, t, 1).reshape({2}), states), t);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelCudaEveryType, ::testing::ValuesIn(testing::gpu_model_variants()),
                         testing::variant_test_name);
}  // namespace
}  // namespace hgrn
