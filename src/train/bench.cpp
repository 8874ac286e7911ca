// bench.cpp: the timing loops of `hgrn bench` (bench.h). Step timings use the host clock around device-synchronised
// steps (what a user's wall clock sees, launch gaps included); the median is reported because the first steps after
// warm-up and the occasional allocator or clock hiccup make the mean drift.
#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/trace.h"
#include "dist/world.h"
#include "models/cost.h"
#include "models/registry.h"
#include "ops/gated_scan.h"
#include "ops/lower_bounded_gated_scan.h"
#include "ops/gla_recurrence.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#ifdef HGRN_WITH_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda_context.h"
#include "kernels/gemm.h"
#endif

namespace hgrn {

namespace {
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// The same batch every step: random ids drawn once (the peer's method), next-token targets, and with
// document_tokens > 0 reset flags at random document starts.
class RandomTokens : public BatchSource {
 public:
  RandomTokens(int64_t vocab, int64_t seq_len, int64_t batch, uint64_t seed, int64_t document_tokens) {
    Rng rng(seed);
    batch_ = TokenBatch{Tensor::empty({batch, seq_len}, DType::I32), Tensor::empty({batch, seq_len}, DType::I32)};
    std::vector<int32_t> stream(static_cast<size_t>(seq_len + 1));
    for (int64_t b = 0; b < batch; ++b) {
      for (auto& t : stream) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      for (int64_t t = 0; t < seq_len; ++t) {
        batch_.inputs.data<int32_t>()[b * seq_len + t] = stream[t];
        batch_.targets.data<int32_t>()[b * seq_len + t] = stream[t + 1];
      }
    }
    if (document_tokens > 0) batch_.resets = random_document_starts(rng, batch, seq_len, document_tokens);
  }
  TokenBatch next_batch(int64_t) override { return batch_; }
  uint64_t cursor() const override { return 0; }
  void set_cursor(uint64_t) override {}
  // data.stateful: every step's rows go on from the states of the step before.
  bool next_batch_continues_streams() const override { return true; }

 private:
  TokenBatch batch_;
};

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

Tensor random_document_starts(Rng& rng, int64_t batch, int64_t time, int64_t mean_tokens) {
  HGRN_CHECK(mean_tokens > 0, "random_document_starts: the mean document length must be positive, got ", mean_tokens);
  Tensor flags = Tensor::empty({batch, time}, DType::I32);
  int32_t* f = flags.data<int32_t>();
  for (int64_t i = 0; i < batch * time; ++i)
    f[i] = i % time == 0 || rng.below(static_cast<uint64_t>(mean_tokens)) == 0;
  return flags;
}

StepBench bench_training_steps(const Config& config, int64_t warmup, int64_t steps, std::ostream& log,
                               int64_t document_tokens) {
  const TrainingConfig& tc = config.training;
  set_peer_timeout(tc.collective_timeout_s);
  const Device device = resolve_device(tc.device);
  const DType act = activation_dtype(tc.precision, device);
  StepBench r;
  r.device_name = device == Device::CUDA ? cuda_device_name() : "cpu";
#ifdef HGRN_WITH_CUDA
  if (device == Device::CUDA) r.gpu_peak_tflops = measure_bf16_gemm_tflops();
#endif
  const auto setup = std::make_unique<TrainingModel>(config, tc.seed, device, act);
  const ModelCost cost = model_cost(config.model, config.data.seq_len);
  r.params = cost.params_total;
  // Under mpirun every rank runs the same steps on its own batch (data parallelism, as in training): the tokens
  // of a step are all ranks' and the GEMM peak is per GPU.
  r.ranks = world().size;
  r.tokens_per_step = r.ranks * tc.micro_batch_size * tc.grad_accum_steps * config.data.seq_len;
  r.warmup = warmup;
  r.steps = steps;
  RandomTokens data(config.model.vocab_size, config.data.seq_len, tc.micro_batch_size,
                    tc.seed + 1 + static_cast<uint64_t>(world().rank), document_tokens);
  log << "bench: " << r.params << " parameters, " << r.tokens_per_step << " tokens per step";
  if (r.ranks > 1) {
    const std::string options = describe(data_parallel_options(tc));
    log << " over " << r.ranks << " data-parallel ranks" << (options.empty() ? "" : " (" + options + ")");
  }
  log << ", " << dtype_name(act) << " activations on " << r.device_name
      << (setup->carried_states ? ", recurrent states carried from step to step (data.stateful)" : "") << "; "
      << warmup << " warm-up + " << steps << " timed steps";
  if (document_tokens > 0)
    log << "; packed documents of ~" << document_tokens << " tokens, the state restarted at each document start";
  log << "\n";
  std::vector<double> times;
  size_t driver_allocations_before = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      driver_allocations_before = cuda_memory_stats().driver_allocations;
      cuda_reset_peak_memory();
      trace_profile_reset();
    }
    const Clock::time_point t0 = Clock::now();
    const StepResult step = training_step(*setup, data, tc, tc.lr);
    device_synchronize();
    const double dt = seconds(t0);
    if (s == 0) r.first_loss = step.loss;
    r.last_loss = step.loss;
    if (s >= warmup) times.push_back(dt);
    if (s >= warmup && setup->data_parallel) {
      const DataParallel::ReductionTiming t = setup->data_parallel->last_reduction_timing();
      r.reduce_buckets = t.buckets;
      r.reduce_busy_ms += t.busy_ms / static_cast<double>(steps);
      r.reduce_tail_ms += t.tail_ms / static_cast<double>(steps);
    }
    log << "  step " << s + 1 << (s < warmup ? " (warm-up)" : "") << ": " << dt * 1e3 << " ms, loss " << step.loss
        << "\n";
  }
  r.median_ms = median(times) * 1e3;
  r.mean_ms = times.empty() ? 0 : std::accumulate(times.begin(), times.end(), 0.0) / times.size() * 1e3;
  r.min_ms = times.empty() ? 0 : *std::min_element(times.begin(), times.end()) * 1e3;
  r.max_ms = times.empty() ? 0 : *std::max_element(times.begin(), times.end()) * 1e3;
  const auto tokens_per_s_at = [&](double step_ms) {
    return step_ms > 0 ? static_cast<double>(r.tokens_per_step) / (step_ms * 1e-3) : 0.0;
  };
  r.tokens_per_s = tokens_per_s_at(r.median_ms);
  r.tokens_per_s_mean = tokens_per_s_at(r.mean_ms);
  const CudaMemoryStats memory = cuda_memory_stats();
  r.peak_memory_gib = static_cast<double>(memory.peak_in_use_bytes) / (1u << 30);
  r.reserved_memory_gib = static_cast<double>(memory.reserved_bytes) / (1u << 30);
  r.timed_driver_allocations = static_cast<int64_t>(memory.driver_allocations - driver_allocations_before);
  r.model_tflops = cost.flops_per_token_train * r.tokens_per_s / 1e12;
  r.mfu = r.gpu_peak_tflops > 0 ? r.model_tflops / (r.gpu_peak_tflops * r.ranks) : 0;
  return r;
}

RecurrenceBench bench_recurrence(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, DType dtype, Device device,
                                 int64_t warmup, int64_t iters, int64_t document_tokens) {
  RecurrenceBench r{B, T, H, K, V, dtype_name(dtype)};
  Rng rng(7);
  auto random = [&](const Shape& shape, double scale, double offset, DType d) {
    Tensor t = Tensor::empty(shape, DType::F32);
    for (int64_t i = 0; i < t.numel(); ++i) t.set_item(i, offset + scale * rng.normal());
    return on_device(d == DType::F32 ? t : t.to(d), device);
  };
  Tensor g_host = Tensor::empty({B, T, H * K}, DType::F32);  // log forget gates: logsigmoid of N(2, 1) logits
  for (int64_t i = 0; i < g_host.numel(); ++i) {
    const double u = 2.0 + rng.normal();
    g_host.set_item(i, -std::log1p(std::exp(-u)));
  }
  Var q = make_var(random({B, T, H * K}, 1.0, 0.0, dtype), true), k = make_var(random({B, T, H * K}, 0.1, 0.1, dtype), true);
  Var v = make_var(random({B, T, H * V}, 1.0, 0.0, dtype), true), g = make_var(on_device(g_host, device), true);
  Tensor d_out = random({B, T, H * V}, 1.0, 0.0, dtype);
  const Tensor resets =
      document_tokens > 0 ? on_device(random_document_starts(rng, B, T, document_tokens), device) : Tensor();
  const double scale = 1.0 / std::sqrt(static_cast<double>(K));
  auto time_calls = [&](bool backward) {
    std::vector<double> per_call;
    const int64_t group = std::max<int64_t>(1, iters / 5);
    for (int64_t i = 0; i < warmup + iters; i += (i < warmup ? 1 : group)) {
      const int64_t n = i < warmup ? 1 : group;
      device_synchronize();
      const Clock::time_point t0 = Clock::now();
      for (int64_t c = 0; c < n; ++c) {
        Tape tape;
        tape.set_enabled(backward);
        for (const Var& x : {q, k, v, g}) x->grad = Tensor();
        GlaOutputs o = gla_recurrence(tape, q, k, v, g, nullptr, H, scale, RecurrenceMode::Chunk, 0, nullptr, false,
                                      resets);
        if (backward) tape.backward(o.output, d_out);
      }
      device_synchronize();
      if (i >= warmup) per_call.push_back(seconds(t0) / static_cast<double>(n));
    }
    return median(per_call) * 1e3;
  };
  r.forward_ms = time_calls(false);
  r.forward_backward_ms = time_calls(true);
  const double act_bytes = static_cast<double>(dtype_size(dtype));
  r.bytes_forward = static_cast<double>(B * T * H) * ((2 * K + 2 * V) * act_bytes + K * 4.0);
  // The kernels' chunk is 64 steps on the GPU; the CPU op runs fla's automatic chunk size.
  const int64_t chunk = device == Device::CUDA ? 64 : gla_chunk_size(T);
  r.flops_forward = static_cast<double>(B * T) * gla_recurrence_flops_per_token(static_cast<double>(H),
                                                                            static_cast<double>(K),
                                                                            static_cast<double>(V),
                                                                            static_cast<double>(chunk));
#ifdef HGRN_WITH_CUDA
  if (device == Device::CUDA) {  // after the timing, so that the 1 GiB buffers do not linger in the allocator's way
    r.copy_gbps = measure_device_copy_gbps();
    r.gemm_tflops = measure_bf16_gemm_tflops();
  }
#endif
  return r;
}

ScanBench bench_scan(int64_t B, int64_t T, int64_t C, DType dtype, Device device, int64_t warmup, int64_t iters,
                     bool fused, int64_t document_tokens) {
  ScanBench r{B, T, C, dtype_name(dtype)};
  Rng rng(7);
  Tensor x_host = Tensor::empty({B, T, C}, DType::F32), g_host = Tensor::empty({B, T, C}, DType::F32);
  Tensor d_out_host = Tensor::empty({B, T, C}, DType::F32);
  for (int64_t i = 0; i < x_host.numel(); ++i) {
    x_host.set_item(i, rng.normal());
    g_host.set_item(i, -std::log1p(std::exp(-(2.0 + rng.normal()))));  // logsigmoid of N(2, 1) logits
    d_out_host.set_item(i, rng.normal());
  }
  auto put = [&](const Tensor& t, DType d) { return on_device(d == DType::F32 ? t : t.to(d), device); };
  Var x = make_var(put(x_host, dtype), true), g = make_var(put(g_host, DType::F32), true);
  const Tensor d_out = put(d_out_host, dtype);
  const Tensor resets =
      document_tokens > 0 ? on_device(random_document_starts(rng, B, T, document_tokens), device) : Tensor();
  // The fused op: î = x, f̂ ~ N(2, 1) logits in `dtype`, and layer 1 of a two-layer γ with bounds in [0.2, 0.8].
  Var f_hat, gamma;
  if (fused) {
    Tensor f_host = Tensor::empty({B, T, C}, DType::F32), gamma_host = Tensor::zeros({2, C}, DType::F32);
    for (int64_t i = 0; i < f_host.numel(); ++i) f_host.set_item(i, 2.0 + rng.normal());
    for (int64_t c = 0; c < C; ++c) gamma_host.set_item(C + c, 0.2 + 0.6 * static_cast<double>(c % 7) / 6.0);
    f_hat = make_var(put(f_host, dtype), true);
    gamma = make_var(put(gamma_host, DType::F32), true);
  }
  auto call = [&](bool backward) {
    Tape tape;
    tape.set_enabled(backward);
    x->grad = Tensor();
    g->grad = Tensor();
    if (fused) {
      f_hat->grad = Tensor();
      gamma->grad = Tensor();
    }
    GatedScanOutputs o = fused ? lower_bounded_gated_scan(tape, x, f_hat, gamma, 1, nullptr, ScanMode::Chunk, resets)
                               : gated_scan(tape, x, g, nullptr, ScanMode::Chunk, 0, resets);
    if (backward) tape.backward(o.output, d_out);
  };
  auto time_calls = [&](bool backward) {
    std::vector<double> ms;
#ifdef HGRN_WITH_CUDA
    cudaEvent_t start = nullptr, stop = nullptr;
    if (device == Device::CUDA) {
      CUDA_CHECK(cudaEventCreate(&start));
      CUDA_CHECK(cudaEventCreate(&stop));
    }
#endif
    for (int64_t i = 0; i < warmup + iters; ++i) {
      device_synchronize();
      const Clock::time_point t0 = Clock::now();
#ifdef HGRN_WITH_CUDA
      if (device == Device::CUDA) CUDA_CHECK(cudaEventRecord(start, cuda_stream()));
#endif
      call(backward);
      double elapsed_ms = 0;
#ifdef HGRN_WITH_CUDA
      if (device == Device::CUDA) {
        CUDA_CHECK(cudaEventRecord(stop, cuda_stream()));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float event_ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&event_ms, start, stop));
        elapsed_ms = event_ms;
      }
#endif
      if (device != Device::CUDA) elapsed_ms = seconds(t0) * 1e3;
      if (i >= warmup) ms.push_back(elapsed_ms);
    }
#ifdef HGRN_WITH_CUDA
    if (device == Device::CUDA) {
      CUDA_CHECK(cudaEventDestroy(start));
      CUDA_CHECK(cudaEventDestroy(stop));
    }
#endif
    return median(ms);
  };
  r.forward_ms = time_calls(false);
  r.forward_backward_ms = time_calls(true);
  // Forward: x, g read and o written once; backward: x, g, dO read and dx, dg written once. Fused: î, f̂ in place
  // of x, g (both in `dtype`), likewise.
  const double act = static_cast<double>(dtype_size(dtype)), elements = static_cast<double>(B * T * C);
  const double gate = fused ? act : 4;
  r.bytes_forward = elements * (2 * act + gate);
  r.bytes_forward_backward = r.bytes_forward + elements * (3 * act + 2 * gate);
  return r;
}

GenerationBench bench_generation(const Config& config, Device device, DType dtype, DecodePath path, int64_t batch,
                                 int64_t prompt_length, int64_t new_tokens, int64_t warmup, int64_t runs,
                                 std::ostream& log) {
  HGRN_CHECK(batch >= 1 && prompt_length >= 1 && new_tokens >= 2 && runs >= 1,
             "hgrn bench --generate: expected a batch >= 1, a prompt of >= 1 token, >= 2 new tokens and >= 1 run");
  HGRN_CHECK(dtype != DType::BF16 || device == Device::CUDA, "hgrn bench --generate: bf16 needs the GPU (use --dtype "
             "fp32)");
  GenerationBench r;
  r.device_name = device == Device::CUDA ? cuda_device_name() : "cpu";
  r.dtype = dtype_name(dtype);
  r.batch = batch;
  r.prompt_length = prompt_length;
  r.new_tokens = new_tokens;
  r.runs = runs;
  r.params = model_cost(config.model, prompt_length).params_total;
  Rng init(config.training.seed);
  const std::unique_ptr<CausalLM> model = create_model(config.model, init, DType::F32);
  model->to_device(device, dtype);
#ifdef HGRN_WITH_CUDA
  // As training does: the fastest GEMM algorithm per shape unless the config asks for bits that repeat across runs.
  set_gemm_autotune(device == Device::CUDA && !config.training.deterministic);
#endif
  Rng prompt_rng(config.training.seed + 1);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_length));
  for (int32_t& id : prompt)
    id = static_cast<int32_t>(prompt_rng.below(static_cast<uint64_t>(config.model.vocab_size)));
  GenerationOptions options;
  options.batch = batch;
  options.sampling.temperature = 0;  // greedy, never stopping early: no end-of-document id
  options.decode = path;
  options.fused_dtype = dtype;
  log << "bench --generate: " << r.params << " parameters, " << dtype_name(dtype) << " on " << r.device_name
      << ", batch " << batch << ", prompt " << prompt_length << ", " << new_tokens << " new tokens; " << warmup
      << " warm-up + " << runs << " timed generations\n";

  options.max_new_tokens = std::min<int64_t>(new_tokens, 16);
  for (int64_t w = 0; w < warmup; ++w) generate(*model, prompt, options);
  options.max_new_tokens = new_tokens;
  std::vector<double> setup, prefill, per_token, decode_rate;
  for (int64_t run = 0; run < runs; ++run) {
    device_synchronize();
    cuda_reset_peak_memory();
    CudaMemoryStats at_start{}, at_end{};
    size_t whole_peak = 0;
    int64_t calls = 0;
    const GenerationResult g = generate(*model, prompt, options, [&](const std::vector<int32_t>&) {
      ++calls;
      if (calls == 1) {  // the prefill is done and the first token taken: the decode steps start
        whole_peak = cuda_memory_stats().peak_in_use_bytes;
        at_start = cuda_memory_stats();
        cuda_reset_peak_memory();
      } else if (calls == new_tokens) {
        device_synchronize();
        at_end = cuda_memory_stats();
      }
    });
    setup.push_back(g.setup_seconds * 1e3);
    prefill.push_back(g.prefill_seconds * 1e3);
    per_token.push_back(g.seconds_per_step() * 1e3);
    decode_rate.push_back(g.decode_tokens_per_second());
    r.decode_path = g.fused ? (g.graph ? "fused (CUDA graph)" : "fused")
                            : g.fallback_reason.empty() ? "op by op" : "op by op (" + g.fallback_reason + ")";
    constexpr double kGiB = 1u << 30;
    r.peak_memory_gib = std::max<double>(whole_peak, at_end.peak_in_use_bytes) / kGiB;
    r.decode_peak_memory_gib = static_cast<double>(at_end.peak_in_use_bytes) / kGiB;
    r.decode_start_memory_gib = static_cast<double>(at_start.in_use_bytes) / kGiB;
    r.decode_end_memory_gib = static_cast<double>(at_end.in_use_bytes) / kGiB;
    r.decode_driver_allocations = static_cast<int64_t>(at_end.driver_allocations - at_start.driver_allocations);
    log << std::setprecision(3) << "  run " << run + 1 << ": prefill " << prefill.back() << " ms, "
        << per_token.back() << " ms per token, " << decode_rate.back() << " tokens/s decoding\n";
  }
  r.setup_ms = median(setup);
  r.prefill_ms = median(prefill);
  r.prefill_tokens_per_s = static_cast<double>(batch * prompt_length) / (r.prefill_ms * 1e-3);
  r.ms_per_token = median(per_token);
  r.decode_tokens_per_s = median(decode_rate);

  // The step's least traffic: every matrix its GEMMs read (the embedding is only gathered: B rows, unless it is also
  // the LM head), in the decoding dtype; vectors (norms, lower bounds) in fp32; each layer's state read and written.
  const double weight_size = static_cast<double>(dtype_size(dtype));
  const Var& embeddings = model->parameter("model.embeddings.weight");
  for (const auto& [spec, var] : model->parameters()) {
    const double n = static_cast<double>(var->value.numel());
    if (var == embeddings && !config.model.tie_word_embeddings)
      r.weight_bytes += static_cast<double>(batch * var->value.size(1)) * 4.0;
    else
      r.weight_bytes += n * (var->value.dim() == 2 ? weight_size : 4.0);
  }
  std::vector<RecurrentState> states;
  model->decode_step(Tensor::zeros({batch}, DType::I32), states);
  for (const RecurrentState& s : states) r.state_bytes += 2.0 * static_cast<double>(s.tensor.nbytes());
#ifdef HGRN_WITH_CUDA
  if (device == Device::CUDA) {
    r.copy_gbps = measure_device_copy_gbps();
    r.floor_ms = (r.weight_bytes + r.state_bytes) / (r.copy_gbps * 1e9) * 1e3;
  }
#endif
  return r;
}

}  // namespace hgrn
