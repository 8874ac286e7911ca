// generation.cpp: prefill, then the decode loop with per-sequence sampling on the host (greedy choices on the device
// on the fused path, the steps queued ahead of the host), op by op or on the fused path.
#include "models/generation.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <span>

#include "core/allocator.h"
#include "core/check.h"
#include "models/fused_decoder.h"

namespace hgrn {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

Tensor id_columns(const Tensor& ids, int64_t begin, int64_t count) {
  const int64_t batch = ids.size(0), length = ids.size(1);
  Tensor out = Tensor::empty({batch, count}, DType::I32);
  for (int64_t b = 0; b < batch; ++b)
    std::copy_n(ids.data<int32_t>() + b * length + begin, count, out.data<int32_t>() + b * count);
  return out;
}

void check_prompt(const std::vector<int32_t>& prompt, int64_t vocab_size) {
  HGRN_CHECK(!prompt.empty(), "the prompt is empty: generation continues a text of at least one token");
  for (size_t i = 0; i < prompt.size(); ++i)
    HGRN_CHECK(prompt[i] >= 0 && prompt[i] < vocab_size, "prompt token ", i, " is id ", prompt[i],
               ", outside the model's vocabulary [0, ", vocab_size, ")");
}

namespace {

// The layers' states after all but the last prompt token (zero states for a prompt of one), through the forward.
std::vector<RecurrentState> states_before_last(const CausalLM& model, const Tensor& prompt_ids) {
  HGRN_CHECK(prompt_ids.dim() == 2 && prompt_ids.dtype() == DType::I32 && prompt_ids.size(1) >= 1,
             "prefill takes int32 ids [batch, length >= 1], got ", shape_str(prompt_ids.shape()));
  const int64_t length = prompt_ids.size(1);
  std::vector<RecurrentState> states(static_cast<size_t>(model.config().num_hidden_layers));
  if (length > 1) {
    Tape no_grad;
    no_grad.set_enabled(false);
    std::vector<Var> carried;
    model.forward_hidden(no_grad, id_columns(prompt_ids, 0, length - 1), &carried);
    for (size_t l = 0; l < carried.size(); ++l) states[l].tensor = carried[l]->value;
  }
  return states;
}

Tensor last_column(const Tensor& prompt_ids) {
  return id_columns(prompt_ids, prompt_ids.size(1) - 1, 1).reshape({prompt_ids.size(0)});
}

}  // namespace

Tensor prefill(const CausalLM& model, const Tensor& prompt_ids, std::vector<RecurrentState>& states) {
  states = states_before_last(model, prompt_ids);
  return model.decode_step(last_column(prompt_ids), states);
}

void prefill(FusedDecoder& decoder, const CausalLM& model, const Tensor& prompt_ids) {
  decoder.set_states(states_before_last(model, prompt_ids));
  decoder.step(last_column(prompt_ids));
}

GenerationResult generate(const CausalLM& model, const std::vector<int32_t>& prompt, const GenerationOptions& options,
                          const std::function<void(const std::vector<int32_t>&)>& on_tokens) {
  const int64_t vocab = model.config().vocab_size;
  check_prompt(prompt, vocab);
  check_sampling_options(options.sampling);
  HGRN_CHECK(options.batch >= 1, "--batch: expected at least 1 sequence, got ", options.batch);
  HGRN_CHECK(options.max_new_tokens >= 0, "--max-new-tokens: expected a count >= 0, got ", options.max_new_tokens);
  HGRN_CHECK(options.vocab_limit >= 0 && options.vocab_limit <= vocab, "a tokenizer of ", options.vocab_limit,
             " ids does not fit the model's vocabulary of ", vocab);
  const size_t candidates = static_cast<size_t>(options.vocab_limit > 0 ? options.vocab_limit : vocab);
  const int64_t batch = options.batch, length = static_cast<int64_t>(prompt.size());

  GenerationResult result;
  result.sequences.resize(static_cast<size_t>(batch));
  result.prefill_tokens = length;
  if (options.max_new_tokens == 0) return result;

  std::vector<Rng> rngs;
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(batch), prompt);  // what the penalty looks at
  for (int64_t b = 0; b < batch; ++b) rngs.push_back(Rng(options.seed).fork(static_cast<uint64_t>(b)));

  Tensor ids = Tensor::empty({batch, length}, DType::I32);
  for (int64_t b = 0; b < batch; ++b) std::copy(prompt.begin(), prompt.end(), ids.data<int32_t>() + b * length);
  std::unique_ptr<FusedDecoder> fused;
  Clock::time_point start = Clock::now();
  if (options.decode == DecodePath::Fused) {
    result.fallback_reason = model.fused_decoding_refusal();
    if (result.fallback_reason.empty()) {
      FusedDecoderOptions fused_options;
      fused_options.batch = batch;
      // The CPU decodes in the model's own dtype.
      fused_options.dtype = model.device() == Device::CUDA ? options.fused_dtype : model.lm_head()->value.dtype();
      fused_options.graph = options.fused_graph;
      fused_options.vocab_limit = static_cast<int64_t>(candidates);
      fused = model.make_fused_decoder(fused_options);
      result.fused = true;
      result.graph = fused->uses_graph();
      device_synchronize();
      result.setup_seconds = seconds_since(start);
    }
  }

  std::vector<RecurrentState> states;
  start = Clock::now();
  Tensor logits;
  if (fused)
    prefill(*fused, model, ids);
  else
    logits = prefill(model, ids, states);
  device_synchronize();
  result.prefill_seconds = seconds_since(start);

  // Greedy choices without a penalty are made on the device (row_argmax), and each step is fed the one before's there:
  // the host queues kAhead steps ahead and reads their ids back as they finish, so the GPU never waits for it.
  // (A sequence stopped at EOS keeps decoding its own choices; they are not read.)
  const bool greedy_on_device =
      fused && options.sampling.temperature == 0 && options.sampling.repetition_penalty == 1.0;
  constexpr int64_t kAhead = FusedDecoder::kQueuedGreedySteps - 1;
  std::deque<int64_t> queued;  // tickets of greedy steps queued and not yet read, oldest first
  int64_t steps_queued = 0;
  const auto queue_ahead = [&] {
    while (static_cast<int64_t>(queued.size()) < kAhead && steps_queued + 1 < options.max_new_tokens) {
      queued.push_back(fused->queue_greedy_step());
      ++steps_queued;
    }
  };
  start = Clock::now();
  Tensor next = Tensor::empty({batch}, DType::I32);
  std::vector<int32_t> greedy;
  if (greedy_on_device) {
    greedy = fused->greedy_tokens();  // the prompt's last token's choice, before a queued step overwrites it
    queue_ahead();
  }
  for (int64_t step = 0;; ++step) {
    std::vector<double> rows;
    if (!greedy_on_device) rows = on_device(fused ? fused->logits() : logits, Device::CPU).to_double_vector();
    std::vector<int32_t> taken(static_cast<size_t>(batch), -1);
    bool any_running = false;
    for (int64_t b = 0; b < batch; ++b) {
      GeneratedSequence& sequence = result.sequences[b];
      int32_t token = options.eos_id.value_or(0);  // what a stopped sequence is fed
      if (!sequence.stopped_at_eos) {
        token = greedy_on_device ? greedy[b]
                                 : sample_next_token(std::span<const double>(rows.data() + b * vocab, candidates),
                                                     history[b], options.sampling, rngs[b]);
        history[b].push_back(token);
        if (options.eos_id && token == *options.eos_id) {
          sequence.stopped_at_eos = true;
        } else {
          sequence.ids.push_back(token);
          taken[b] = token;
          any_running = true;
        }
      }
      next.data<int32_t>()[b] = token;
    }
    if (on_tokens) on_tokens(taken);
    if (!any_running || step + 1 == options.max_new_tokens) break;
    if (greedy_on_device) {
      greedy = fused->queued_greedy_tokens(queued.front());
      queued.pop_front();
      queue_ahead();
    } else if (fused) {
      fused->step(next);
    } else {
      logits = model.decode_step(next, states);
    }
    ++result.decode_steps;
  }
  result.decode_seconds = seconds_since(start);
  for (int64_t ticket : queued) fused->queued_greedy_tokens(ticket);  // steps queued past EOS: done before returning
  return result;
}

}  // namespace hgrn
