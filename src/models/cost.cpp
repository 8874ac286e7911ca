// cost.cpp: the cost model behind `hgrn info`: parameter counts (from model_param_specs), FLOPs per token and the
// peak memory of a training step, counted from the decoder's structure (hgrn-spec.md section 4, models/decoder_lm.cpp)
// and the member's token mixer (ModelFamily::mixer_cost, ModelFamily::mixer_memory).
#include "models/cost.h"

#include <algorithm>
#include <cmath>

#include "core/checked_math.h"
#include "models/params.h"
#include "models/registry.h"
#include "models/token_mixer.h"
#include "ops/linear_cross_entropy.h"

namespace hgrn {

int64_t gla_chunk_size(int64_t seq_len) {
  int64_t pow2 = 1;
  while (pow2 < seq_len) pow2 *= 2;
  return std::min<int64_t>(64, std::max<int64_t>(16, pow2));
}

// Counting multiply-adds as 2 FLOPs:
//   state terms  2·H·K·V·2: the chunk's contribution Σ_t k̃_tᵀ v_t to the next state (2·K·V per token and head)
//                and the inter-chunk output (q_t ⊙ e^{G_t}) S (another 2·K·V);
//   intra-chunk  2·C·H·(K+V): the scores A = Q̃ K̃ᵀ (2·C·K per token and head) and A·V (2·C·V); counted over the
//                whole C×C block, an upper bound, because the kernels skip only the sub-blocks above the diagonal.
// Element-wise work (gates, exponentials, the decay of S) is O(H·K) per token and left out.
double gla_recurrence_flops_per_token(double H, double K, double V, double C) {
  return 2.0 * H * K * V * 2.0 + 2.0 * C * H * (K + V);
}

// Per layer, kept for the backward: the projections' outputs, q and k where they are tensors of their own (activation
// dtype) and any key-wide gate unless recomputed, the recurrence's output o (H·V) and scores A (H·C per token), the
// tensors made from o only without recompute_elementwise, and the final state; on the GPU the per-chunk states (H·K·V
// per 64 tokens) in the first keep_recurrence_states layers. The backward adds o's and the projections' gradients,
// the gate's share, the fp32 gradients of the states and scores on the GPU (three key-wide gradients on the CPU), and
// whatever was not kept.
MixerMemory gla_mixer_memory(const ModelConfig& c, const GlaMixerTensors& tensors, int64_t layer, int64_t seq_len,
                             const MemoryTarget& target) {
  const ModelMemoryConfig knobs = layer_memory(c.memory, layer);
  const double T = static_cast<double>(seq_len), b = static_cast<double>(target.bytes_per_activation);
  const double H = static_cast<double>(tensors.heads), Fk = H * static_cast<double>(tensors.key_dim);
  const double Fv = H * static_cast<double>(tensors.value_dim);
  const double state = Fk * static_cast<double>(tensors.value_dim);
  const double chunk = target.gpu ? 64.0 : static_cast<double>(gla_chunk_size(seq_len));
  const double chunks = std::ceil(T / chunk);
  const double fp32 = target.gpu ? 4.0 : b;  // the gate and the final state: fp32 on the GPU, the one dtype on the CPU
  const double projections = b * tensors.projection_width * T, output = b * Fv * T;
  const double final_state = fp32 * state;
  const double gates = ((tensors.own_query_key ? 2.0 * b : 0.0) + (tensors.key_wide_gate ? fp32 : 0.0)) * Fk * T;
  const double scores = b * H * chunks * chunk * chunk;
  const double chunk_states = target.gpu ? b * chunks * state : 0.0;
  const double normed = static_cast<double>(tensors.normed_outputs) * output;
  const bool gates_recomputed = recomputes_gates(knobs, layer, c.num_hidden_layers);
  const bool states_kept = target.gpu && layer < knobs.keep_recurrence_states;
  const double gradients = output + projections + tensors.gate_backward_bytes * Fk * T +
                           (target.gpu ? 4.0 * chunks * (state + H * chunk * chunk) : b * 3.0 * Fk * T);
  MixerMemory memory;
  if (knobs.recompute) {  // the replay keeps everything, the per-chunk states made again included
    memory.replayed = projections + gates + scores + chunk_states +
                      static_cast<double>(1 + tensors.normed_outputs) * output + final_state;
    memory.backward = gradients;
    return memory;
  }
  memory.states = final_state + (states_kept ? chunk_states : 0.0);
  memory.activations = projections + (gates_recomputed ? 0.0 : gates) + scores + output +
                       (knobs.recompute_elementwise ? 0.0 : normed);
  memory.backward = gradients + (states_kept ? 0.0 : chunk_states) + (gates_recomputed ? gates : 0.0);
  return memory;
}

namespace {

// The parameters that are the weight of a matmul: every projection and the lm_head. The embedding is a row lookup,
// the norms and lower bounds are element-wise. A tied lm_head multiplies by the embedding matrix, which then counts
// as the head.
struct MatmulWeights {
  int64_t all = 0, head = 0;
};

MatmulWeights matmul_weights(const std::vector<ParamSpec>& specs) {
  MatmulWeights w;
  int64_t embedding = 0;
  for (const ParamSpec& spec : specs) {
    const int64_t count = shape_numel(spec.shape);
    if (spec.group == ParamGroup::Mixer || spec.group == ParamGroup::Mlp || spec.group == ParamGroup::LmHead)
      w.all += count;
    if (spec.group == ParamGroup::LmHead) w.head += count;
    if (spec.group == ParamGroup::Embedding) embedding += count;
  }
  if (w.head == 0) w.all += embedding, w.head = embedding;
  return w;
}

}  // namespace

ModelCost model_cost(const ModelConfig& config, int64_t seq_len) {
  ModelCost cost{};
  const std::vector<ParamSpec> specs = model_param_specs(config);

  for (const ParamSpec& spec : specs) {
    const int64_t count = shape_numel(spec.shape);
    cost.params_total = checked_add(cost.params_total, count, "the parameter count");
    const std::string group = param_group_name(spec.group);
    auto it = std::find_if(cost.params_by_group.begin(), cost.params_by_group.end(),
                           [&](const auto& entry) { return entry.first == group; });
    if (it == cost.params_by_group.end())
      cost.params_by_group.emplace_back(group, count);
    else
      it->second = checked_add(it->second, count, "the parameter count of group ", group);
  }

  const double L = static_cast<double>(config.num_hidden_layers);
  const MixerCost mixer = model_family(config.type).mixer_cost(config, seq_len);

  // Two FLOPs per matmul weight and token, and the token mixers' own arithmetic (the recurrence) per token and layer.
  // Other element-wise work (norms, SiLU, the loss's softmax) is O(D) per token and left out: small next to the
  // O(D²) projections.
  cost.flops_per_token_fwd = 2.0 * static_cast<double>(matmul_weights(specs).all) + L * mixer.flops_per_token;
  // The backward computes two products per forward product (input gradient and weight gradient): 3x in all.
  // A chunk backward also recomputes the states, which this convention leaves out.
  cost.flops_per_token_train = 3.0 * cost.flops_per_token_fwd;
  return cost;
}

MemoryTarget memory_target(const Config& config) {
  const std::string& device = config.training.device;
  MemoryTarget target;
  target.gpu = device == "cuda" ||
               (device == "auto" && model_family(config.model.type).cuda_refusal(config.model).empty());
  target.bytes_per_activation = config.training.precision == "fp32" ? 4 : 2;
  target.fp8 = target.gpu && config.training.precision == "fp8";
  return target;
}

// The tensors a step holds, as decoder_lm.cpp, the ops' backward closures and the trainer make them. The peak lies
// where all the forward's activations are still held: in the loss (its fp32 dx and dW sums with a chunk of logits,
// then the head's gradients), or in the last layer's backward, before it frees that layer's activations. Later
// layers' backwards free more activations than they add gradients. The allocator's 512-byte rounding is left out.
TrainingMemory training_memory(const ModelConfig& config, int64_t micro_batch, int64_t seq_len,
                               const MemoryTarget& target) {
  const ModelFamily& family = model_family(config.type);
  const ModelMemoryConfig& knobs = config.memory;
  const std::vector<ParamSpec> specs = model_param_specs(config);
  double params = 0;
  for (const ParamSpec& spec : specs) params += static_cast<double>(shape_numel(spec.shape));
  const MatmulWeights matmul = matmul_weights(specs);
  const double head_weights = static_cast<double>(matmul.head);

  const double b = static_cast<double>(target.bytes_per_activation);
  const double tokens = static_cast<double>(micro_batch * seq_len), batch = static_cast<double>(micro_batch);
  const double D = static_cast<double>(config.hidden_size), I = static_cast<double>(config.mlp_size());
  const double vocab = static_cast<double>(config.vocab_size);
  const double width = b * D * tokens;          // one D-wide activation: the residual stream, a norm's output
  const double mlp_width = b * I * tokens;      // one of the MLP's gate, up and silu(gate)·up
  const double norm_stats = (target.gpu ? 4.0 : b) * tokens;  // an RMSNorm's reciprocal RMS per row

  TrainingMemory m;
  // fp32 weights and AdamW's two moments persist. So do the gradients on the CPU; on the GPU each step frees them
  // (mark_grad_zero) and the backward makes them anew, so only those made by the peak count (below).
  m.weights_and_optimizer = (target.gpu ? 12.0 : 16.0) * params;
  const double new_gradient = target.gpu ? 4.0 : 0.0;  // bytes of a gradient made in the backward, per weight
  // bf16 copies of the matmul weights, kept between steps; recompute_weight_copies drops the layers' ones from their
  // forward to their backward, leaving the head's. Under fp8 the layers' weights have no bf16 copies but their E4M3
  // codes, 1 byte each, kept through the step (ops/fp8_linear.h); the head keeps its bf16 copy.
  if (target.gpu && b == 2) {
    const double all_weights = static_cast<double>(matmul.all), layer_weights = all_weights - head_weights;
    m.weight_copies = target.fp8 ? 2.0 * head_weights + layer_weights
                                 : 2.0 * (knobs.recompute_weight_copies ? head_weights : all_weights);
  }

  // Kept per layer by the decoder: the residual stream entering the layer and after its mixer (the inputs of
  // attn_norm and mlp_norm, which the norms' backwards read) and those norms' statistics. Outside model.memory.
  // recompute, also the norms' outputs without recompute_elementwise, the MLP's gate and up without
  // recompute_mlp_projections, and silu(gate)·up without recompute_elementwise. After the layers: the last layer's
  // output and the final norm's output (the head's input).
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const MixerMemory mixer = family.mixer_memory(config, l, seq_len, target);
    m.states += batch * mixer.states;
    m.activations += batch * mixer.activations + 2.0 * width + 2.0 * norm_stats;
    if (knobs.recompute) continue;
    if (!layer_memory(knobs, l).recompute_elementwise) m.activations += 2.0 * width + mlp_width;
    if (!knobs.recompute_mlp_projections) m.activations += 2.0 * mlp_width;
  }
  m.activations += 2.0 * width + norm_stats;

  // The moments where the peak may lie, each as the gradients made by then and the transient tensors held then.
  struct Moment {
    const char* name;
    double gradients, transient;
  };
  std::vector<Moment> moments;
  const double head_gradient = new_gradient * head_weights;
  if (target.gpu) {
    // linear_cross_entropy: the fp32 dx and dW sums live from the forward to the backward; the forward adds one
    // chunk of logits (and per-row statistics), the backward the head's input gradient and the head's gradient.
    const double sums = 4.0 * D * tokens + 4.0 * vocab * D;
    const double chunk_rows = static_cast<double>(
        linear_cross_entropy_chunk_rows(micro_batch * seq_len, config.vocab_size * target.bytes_per_activation));
    moments.push_back({"the loss's forward", 0.0, sums + chunk_rows * vocab * b + 8.0 * tokens});
    moments.push_back({"the loss's backward", head_gradient, sums + width});
  } else {
    // The CPU composition linear + cross_entropy: the whole logits and their gradient.
    moments.push_back({"the loss", 0.0, 2.0 * vocab * b * tokens + width});
  }
  // The last layer's MLP backward (the final norm's output freed, the stream's gradient made): silu(gate)·up's
  // gradient and gate's and up's; and whatever comes back for it: gate and up with their input under
  // recompute_mlp_projections, or the replayed MLP (its input, gate, up, output) under recompute.
  double mlp_back = 3.0 * mlp_width;
  if (knobs.recompute)
    mlp_back += 2.0 * width + 2.0 * mlp_width;
  else if (knobs.recompute_mlp_projections)
    mlp_back += width + 2.0 * mlp_width;
  moments.push_back({"the last MLP's backward", head_gradient + new_gradient * (D + D * I), mlp_back});
  // The last layer's mixer backward: the final norm's input and output are freed and the stream's gradient is
  // held (one width less), and the mixer's own backward buffers. Without recompute the layer's MLP activations and
  // the stream after the mixer are freed by then; under recompute the mixer's replay is held instead, with the
  // recomputed attn_norm output, the replay's output and its gradient.
  if (config.num_hidden_layers > 0) {
    const MixerMemory last = family.mixer_memory(config, config.num_hidden_layers - 1, seq_len, target);
    double mixer_back = batch * last.backward - width;
    if (knobs.recompute)
      mixer_back += 3.0 * width + batch * last.replayed;
    else
      mixer_back -= width + (knobs.recompute_mlp_projections ? 0.0 : 2.0 * mlp_width) +
                    (layer_memory(knobs, config.num_hidden_layers - 1).recompute_elementwise ? 0.0
                                                                                              : width + mlp_width);
    moments.push_back({"the last mixer's backward", head_gradient + new_gradient * (3.0 * D + 3.0 * D * I),
                       mixer_back});
  }

  const Moment& peak = *std::max_element(moments.begin(), moments.end(), [](const Moment& x, const Moment& y) {
    return x.gradients + x.transient < y.gradients + y.transient;
  });
  m.weights_and_optimizer += peak.gradients;
  m.working_set = peak.transient;
  m.peak_at = peak.name;
  return m;
}

}  // namespace hgrn
