// model_fixtures.h: what the whole-model tests share: the tiny model of every member, random token ids and the
// next-token loss over every position.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "models/decoder_lm.h"
#include "models/registry.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"

namespace hgrn::testing {

// HGRN2: H = 2 heads, K = 4, V = 4. HGRN1: a recurrence twice as wide as the model (fla's input_dim = D · 2), so
// that the mixer's and the model's widths differ. "hgrn-complex": HGRN1 with model.complex. GLA and RetNet: 2 heads
// at fla's expand_k and expand_v (GLA K = 2, V = 4; RetNet K = 4, V = 8).
inline ModelConfig tiny_config(const std::string& type = "hgrn2") {
  ModelConfig c;
  c.type = type == "hgrn-complex" ? "hgrn" : type;
  c.complex = type == "hgrn-complex";
  c.hidden_size = 8;
  c.num_hidden_layers = 3;
  if (type == "gla" || type == "retnet")
    c.num_heads = 2;
  else
    c.expand_ratio = type == "hgrn2" ? 4 : 2;
  c.vocab_size = 11;
  c.intermediate_size = 12;
  c.initializer_range = 0.5;  // large weights make every path matter for the gradient check
  return c;
}

// Every registered member, and HGRN1's complex HGRU as "hgrn-complex": what the EveryModelType suites run over.
inline std::vector<std::string> model_variants() {
  std::vector<std::string> v = model_type_names();
  v.push_back("hgrn-complex");
  return v;
}

// A variant's name as a gtest parameter name ("hgrn-complex" -> "hgrn_complex").
inline std::string variant_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
}

// The variants that may run on the GPU (a member whose ModelFamily::cuda_refusal is not empty trains on the CPU
// only): what the GPU suites run over.
inline std::vector<std::string> gpu_model_variants() {
  std::vector<std::string> v;
  for (const std::string& type : model_variants())
    if (model_family(tiny_config(type).type).cuda_refusal(tiny_config(type)).empty()) v.push_back(type);
  return v;
}

// Gives `cpu` (an fp64 model of the same config) exactly the weights of `gpu` (fp32, so exact in fp64), then moves
// `gpu` to the GPU with `act` activations: the pair the GPU tests compare.
inline void mirror_on_cpu_then_move_to_gpu(DecoderLM& gpu, DecoderLM& cpu, DType act) {
  std::vector<std::pair<std::string, Tensor>> weights;
  for (const auto& [spec, var] : gpu.parameters()) weights.emplace_back(spec.name, var->value.to(DType::F64));
  cpu.load_parameters(weights, "the GPU model");
  gpu.to_device(Device::CUDA, act);
}

// Lower bounds start at zero (gamma_l = l/L); random ones exercise the softmax/cumsum backward more fully. (A member
// without lower bounds is left as it is.)
inline void randomise_lower_bounds(const DecoderLM& model, Rng& rng) {
  if (!lower_bounded(model.config())) return;
  Tensor& gamma = model.parameter("model.lower_bounds")->value;
  for (int64_t i = 0; i < gamma.numel(); ++i) gamma.set_item(i, rng.normal());
}

// int32 ids [batch, seq], uniform over the vocabulary, drawn from rng (on the CPU; the model copies them over).
inline Tensor token_ids(Rng& rng, int64_t batch, int64_t seq, int64_t vocab) {
  Tensor ids = Tensor::empty({batch, seq}, DType::I32);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(rng.below(vocab));
  return ids;
}

// Sets one of the model's memory knobs (ModelMemoryConfig), leaving the others as they are.
template <typename Knob, typename Value>
void set_knob(DecoderLM& model, Knob ModelMemoryConfig::*knob, Value value) {
  ModelMemoryConfig memory = model.memory();
  memory.*knob = static_cast<Knob>(value);
  model.set_memory(memory);
}

// The model's parameters as variables, in parameter order.
inline std::vector<Var> parameter_vars(const CausalLM& model) {
  std::vector<Var> vars;
  for (const auto& [spec, var] : model.parameters()) vars.push_back(var);
  return vars;
}

// Loss of the model over every position (targets: the next token, last position ignored), on the model's device.
// recurrent_states: as CausalLM::forward's (null: zero states).
inline Var model_loss(const CausalLM& model, Tape& tape, const Tensor& ids,
                      std::vector<Var>* recurrent_states = nullptr) {
  const int64_t batch = ids.size(0), seq = ids.size(1), vocab = model.config().vocab_size;
  Tensor targets = Tensor::full({batch * seq}, -100, DType::I32);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t + 1 < seq; ++t) targets.data<int32_t>()[b * seq + t] = ids.data<int32_t>()[b * seq + t + 1];
  Var logits = model.forward(tape, ids, recurrent_states);
  return cross_entropy(tape, reshape(tape, logits, {batch * seq, vocab}), on_device(targets, model.device())).loss;
}

// The projections the model runs as one GEMM each way (ParamSpec::adjacent_to_previous: q/f/i, gate/up) lie one
// after another in memory: their values, their gradients and, where asked, their bf16 copies. Without that the model
// still computes the same, one GEMM per weight, so only this check notices the fused path being lost.
inline void expect_fused_projections_adjacent(const DecoderLM& model, bool grads, bool copies) {
  const auto& params = model.parameters();
  for (size_t i = 0; i < params.size();) {
    size_t end = i + 1;
    while (end < params.size() && params[end].first.adjacent_to_previous) ++end;
    if (end - i > 1) {
      std::vector<Tensor> values, grad_parts, copy_parts;
      for (size_t j = i; j < end; ++j) {
        values.push_back(params[j].second->value);
        grad_parts.push_back(params[j].second->grad);
        copy_parts.push_back(params[j].second->compute_copy);
      }
      EXPECT_TRUE(Tensor::adjacent_rows(values).defined()) << params[i].first.name << ": values apart";
      if (grads) EXPECT_TRUE(Tensor::adjacent_rows(grad_parts).defined()) << params[i].first.name << ": gradients apart";
      if (copies) EXPECT_TRUE(Tensor::adjacent_rows(copy_parts).defined()) << params[i].first.name << ": copies apart";
    }
    i = end;
  }
}

}  // namespace hgrn::testing
