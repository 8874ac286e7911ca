// fused_decoder.cpp: the fixed buffers, the token step (DecoderLM::decode_step's function: embedding, per layer the
// mixer's fused step and the gated MLP, each after its RMSNorm and added into h by its last GEMM, then the final norm,
// the LM head and the greedy choice) and, on the GPU, its CUDA graph.
#include "models/fused_decoder.h"

#include <algorithm>

#include "core/allocator.h"
#include "ops/embedding.h"
#include "ops/hgrn2_gates.h"
#include "ops/linear.h"
#include "ops/row_argmax.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cuda_graph.h"
#include "kernels/host_readback.h"
#else
namespace hgrn {
class CudaGraph {};     // never made without CUDA
class HostReadback {};  // never made without CUDA
}  // namespace hgrn
#endif

namespace hgrn {

FusedDecoder::FusedDecoder(const ModelConfig& config, const FusedDecoderWeights& weights, const TokenMixer& mixer,
                           Device device, const FusedDecoderOptions& options)
    : batch_(options.batch),
      vocab_(config.vocab_size),
      vocab_limit_(options.vocab_limit > 0 ? options.vocab_limit : config.vocab_size),
      mlp_width_(config.mlp_size()),
      norm_eps_(config.norm_eps),
      device_(device),
      dtype_(options.dtype) {
  const std::string refusal = mixer.fused_step_refusal();
  HGRN_CHECK(refusal.empty(), refusal, ": it decodes op by op (CausalLM::decode_step)");
  HGRN_CHECK(batch_ >= 1, "fused decoding: expected a batch of at least 1 sequence, got ", batch_);
  HGRN_CHECK(options.vocab_limit >= 0 && options.vocab_limit <= vocab_, "fused decoding: a vocabulary limit of ",
             options.vocab_limit, " does not fit the model's vocabulary of ", vocab_);
  const DType model_dtype = weights.embeddings->value.dtype();
  if (device_ == Device::CUDA)
    HGRN_CHECK(dtype_ == DType::BF16 || dtype_ == DType::F32, "fused decoding on the GPU runs in bf16 or fp32, not ",
               dtype_name(dtype_));
  else
    HGRN_CHECK(dtype_ == model_dtype, "fused decoding on the CPU runs in the model's dtype (", dtype_name(model_dtype),
               "), not ", dtype_name(dtype_), ": bf16 decoding needs the GPU");
  const DType fp = device_ == Device::CUDA ? DType::F32 : dtype_;  // norms' statistics, logits
  const int64_t D = config.hidden_size;
  ids_ = Tensor::zeros({batch_}, DType::I32, device_);
  h_ = Tensor::empty({batch_, D}, dtype_, device_);
  x_ = Tensor::empty({batch_, D}, dtype_, device_);
  rstd_ = Tensor::empty({batch_}, fp, device_);
  gate_up_ = Tensor::empty({batch_, 2 * mlp_width_}, dtype_, device_);
  hidden_ = Tensor::empty({batch_, mlp_width_}, dtype_, device_);
  logits_ = Tensor::empty({batch_, vocab_}, fp, device_);

  embeddings_ = weights.embeddings->value;
  final_norm_ = weights.final_norm->value;
  lm_head_ = weight_for_input(weights.lm_head, x_);
  if (weights.lower_bounds) {
    Tape untaped;
    untaped.set_enabled(false);
    gamma_ = lower_bound_transform(untaped, weights.lower_bounds)->value;
  }
  const int64_t num_layers = static_cast<int64_t>(weights.layers.size());
  for (int64_t l = 0; l < num_layers; ++l) {
    const FusedDecoderWeights::Layer& w = weights.layers[l];
    Layer layer;
    layer.attn_norm = w.attn_norm->value;
    layer.mlp_norm = w.mlp_norm->value;
    layer.gate_up = column_weights_for_input({w.gate_proj, w.up_proj}, x_);
    layer.down = weight_for_input(w.down_proj, hidden_);
    layer.mixer = mixer.make_fused_step(
        FusedStepSetup{l, num_layers, batch_, w.mixer, gamma_, x_, w.attn_norm->value, norm_eps_, rstd_});
    layers_.push_back(std::move(layer));
  }

#ifdef HGRN_WITH_CUDA
  if (device_ == Device::CUDA)  // made here, with the buffers: no allocation while decoding
    readback_ = std::make_unique<HostReadback>(static_cast<size_t>(batch_) * sizeof(int32_t), kQueuedGreedySteps);
#endif
  if (device_ == Device::CUDA && options.graph) {
#ifdef HGRN_WITH_CUDA
    // One eager step first: whatever the step's calls set up on first use (cuBLASLt's plans, a GEMM's autotuning)
    // happens outside the capture. It advances the states, which start from zero again after.
    enqueue_step();
    device_synchronize();
    graph_ = std::make_unique<CudaGraph>();
    graph_->capture([this] { enqueue_step(); });
    for (Layer& layer : layers_) layer.mixer->state().zero();
#endif
  }
}

FusedDecoder::~FusedDecoder() = default;

bool FusedDecoder::uses_graph() const { return graph_ != nullptr; }

void FusedDecoder::set_states(const std::vector<RecurrentState>& states) {
  HGRN_CHECK(states.size() == layers_.size(), "fused decoding: ", states.size(), " states for ", layers_.size(),
             " layers");
  for (size_t l = 0; l < layers_.size(); ++l) {
    Tensor& mine = layers_[l].mixer->state();
    const Tensor& given = states[l].tensor;
    if (!given.defined()) {
      mine.zero();
      continue;
    }
    HGRN_CHECK(given.shape() == mine.shape() && given.device() == mine.device(), "fused decoding: layer ", l,
               "'s state is ", shape_str(given.shape()), " on ", device_name(given.device()), ", expected ",
               shape_str(mine.shape()), " on ", device_name(mine.device()));
    mine.copy_from(given.dtype() == mine.dtype() ? given : given.to(mine.dtype()));
  }
}

std::vector<RecurrentState> FusedDecoder::states() const {
  std::vector<RecurrentState> out;
  for (const Layer& layer : layers_) out.push_back(RecurrentState{layer.mixer->state().clone()});
  return out;
}

void FusedDecoder::step(const Tensor& token_ids) {
  HGRN_CHECK(token_ids.device() == Device::CPU && token_ids.dtype() == DType::I32 &&
                 token_ids.shape() == Shape({batch_}) && token_ids.is_contiguous(),
             "fused decoding: expected int32 token ids [", batch_, "] on the host, got ",
             dtype_name(token_ids.dtype()), " ", shape_str(token_ids.shape()), " on ",
             device_name(token_ids.device()));
  // Checked here: the GPU's embedding lookup reads them unchecked.
  for (int64_t b = 0; b < batch_; ++b) {
    const int32_t id = token_ids.data<int32_t>()[b];
    HGRN_CHECK(id >= 0 && id < vocab_, "fused decoding: token id ", id, " of sequence ", b,
               " is outside the vocabulary [0, ", vocab_, ")");
  }
  ids_.copy_from(token_ids);
#ifdef HGRN_WITH_CUDA
  if (graph_) {
    graph_->replay();
    return;
  }
#endif
  enqueue_step();
}

std::vector<int32_t> FusedDecoder::greedy_tokens() const {
  const Tensor host = ids_.to(Device::CPU);
  return std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + batch_);
}

int64_t FusedDecoder::queue_greedy_step() {
  const int64_t ticket = queued_tickets_++;
#ifdef HGRN_WITH_CUDA
  if (device_ == Device::CUDA) {
    if (graph_)
      graph_->replay();
    else
      enqueue_step();
    const int64_t copy = readback_->queue(ids_.raw_data(), static_cast<size_t>(batch_) * sizeof(int32_t));
    HGRN_CHECK(copy == ticket, "fused decoding: greedy step ", ticket, " read back as ", copy);
    return ticket;
  }
#endif
  enqueue_step();
  queued_choices_.resize(static_cast<size_t>(kQueuedGreedySteps * batch_));
  std::copy(ids_.data<int32_t>(), ids_.data<int32_t>() + batch_,
            queued_choices_.begin() + (ticket % kQueuedGreedySteps) * batch_);
  return ticket;
}

std::vector<int32_t> FusedDecoder::queued_greedy_tokens(int64_t ticket) {
  HGRN_CHECK(ticket >= 0 && ticket < queued_tickets_ && ticket >= queued_tickets_ - kQueuedGreedySteps,
             "fused decoding: greedy step ", ticket, " is not among the last ", kQueuedGreedySteps, " queued (",
             queued_tickets_, " so far)");
#ifdef HGRN_WITH_CUDA
  if (device_ == Device::CUDA) {
    const int32_t* ids = static_cast<const int32_t*>(readback_->collect(ticket));
    return std::vector<int32_t>(ids, ids + batch_);
  }
#endif
  const auto row = queued_choices_.begin() + (ticket % kQueuedGreedySteps) * batch_;
  return std::vector<int32_t>(row, row + batch_);
}

void FusedDecoder::enqueue_step() {
  embedding_lookup_into(embeddings_, ids_, h_);
  const Tensor gate = gate_up_.columns(0, mlp_width_), up = gate_up_.columns(mlp_width_, mlp_width_);
  // The norms and SwiGLU are made inside the products that read them where the small-batch GEMV takes those
  // (ops/linear.h); the mixer's step normalises its own input (FusedStepSetup).
  for (Layer& layer : layers_) {
    layer.mixer->run(h_);
    normed_linear_product_into(h_, layer.mlp_norm, norm_eps_, x_, rstd_, layer.gate_up, gate_up_,
                               /*accumulate=*/false);
    swiglu_linear_product_into(gate, up, hidden_, {layer.down}, h_, /*accumulate=*/true);
  }
  normed_linear_product_into(h_, final_norm_, norm_eps_, x_, rstd_, {lm_head_}, logits_, /*accumulate=*/false);
  row_argmax(logits_, vocab_limit_, ids_);  // the choice is the next step's input where the host feeds none
}

}  // namespace hgrn
