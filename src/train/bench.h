// bench.h: `hgrn bench`: timings of whole training steps of a config, of generation with its model, and of the HGRU2
// recurrence or the gated scan alone.
// Benchmarks, not tests: the numbers go to docs/benchmarks.md with the command, GPU and commit.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "config/config.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "models/generation.h"

namespace hgrn {

struct StepBench {
  std::string device_name;
  int64_t params = 0, tokens_per_step = 0, warmup = 0, steps = 0;
  int64_t ranks = 1;              // data-parallel processes (mpirun); tokens and MFU count them all
  double median_ms = 0, mean_ms = 0, min_ms = 0, max_ms = 0;  // over the timed steps
  double tokens_per_s_mean = 0;   // tokens_per_step / mean step time: what a mean-timed peer compares with
  double tokens_per_s = 0;        // tokens_per_step / median step time
  double peak_memory_gib = 0;     // high-water mark of hgrn's GPU tensors over the timed steps (0 on the CPU)
  double reserved_memory_gib = 0; // what the caching allocator holds from the driver at the end (in use + cached)
  int64_t timed_driver_allocations = 0;  // cudaMalloc calls during the timed steps (0 in a steady state)
  double gpu_peak_tflops = 0;     // measured bf16 GEMM rate (0 on the CPU)
  double model_tflops = 0;        // HGRN2 training FLOPs (recurrence included) per second
  double mfu = 0;                 // model_tflops / gpu_peak_tflops
  double first_loss = 0, last_loss = 0;
  // Several ranks: per timed step, the gradient reductions (DataParallel::ReductionTiming), means over the steps.
  int64_t reduce_buckets = 0;
  double reduce_busy_ms = 0, reduce_tail_ms = 0;
};
// Times `warmup` + `steps` training steps (training_step, the loop's own) of the config's model on uniformly random
// tokens fixed for the run (as the peer's benchmark does), each step device-synchronised; reports the median.
// Under mpirun (several ranks) the steps are data-parallel ones and the figures are the whole job's. With
// data.stateful each step's rows start from the states the step before left (the data path is not timed).
// document_tokens > 0: the batch is packed documents of that many tokens on average (random_document_starts), whose
// starts restart the recurrent state as data.reset_state_at_document does.
StepBench bench_training_steps(const Config& config, int64_t warmup, int64_t steps, std::ostream& log,
                               int64_t document_tokens = 0);

// int32 [B, T] reset flags of random packed documents of `mean_tokens` tokens on average (each step after the first
// starts one with probability 1 / mean_tokens; step 0 always does), drawn from rng: the benchmarks' resets.
Tensor random_document_starts(Rng& rng, int64_t batch, int64_t time, int64_t mean_tokens);

struct RecurrenceBench {
  int64_t B = 0, T = 0, H = 0, K = 0, V = 0;
  std::string dtype;
  double forward_ms = 0, forward_backward_ms = 0;  // medians over groups of calls, per call
  double bytes_forward = 0;                          // bytes the forward must read and write at least
  double flops_forward = 0;                          // gla_recurrence_flops_per_token · B·T (the backward counts 2x)
  double copy_gbps = 0, gemm_tflops = 0;             // the GPU's measured ceilings (0 on the CPU)
};
// Times the recurrence op (q, k, v in `dtype`, fp32 g) on `device`: forward alone, and forward + backward.
// document_tokens > 0: with resets at random document starts of that mean length (random_document_starts).
RecurrenceBench bench_recurrence(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, DType dtype, Device device,
                                 int64_t warmup, int64_t iters, int64_t document_tokens = 0);

struct ScanBench {
  int64_t B = 0, T = 0, C = 0;
  std::string dtype;
  double forward_ms = 0, forward_backward_ms = 0;        // medians over the timed calls
  double bytes_forward = 0, bytes_forward_backward = 0;  // bytes each must read and write at least
};
// Times the gated scan op (x in `dtype`, fp32 g, no initial state) on `device`: forward alone, and forward +
// backward, each call timed alone (CUDA events on the GPU, the host clock on the CPU). fused: times
// lower_bounded_gated_scan instead (î, f̂ in `dtype`, a bounded layer's fp32 γ, whose gradient is taken too).
// document_tokens > 0: with resets at random document starts of that mean length (random_document_starts).
ScanBench bench_scan(int64_t B, int64_t T, int64_t C, DType dtype, Device device, int64_t warmup, int64_t iters,
                     bool fused = false, int64_t document_tokens = 0);

struct GenerationBench {
  std::string device_name, decode_path;  // decode_path: "fused (CUDA graph)", "fused", "op by op", or the fallback
  std::string dtype;
  int64_t params = 0, batch = 0, prompt_length = 0, new_tokens = 0, runs = 0;
  // Medians over the timed runs. Prefill: the prompt's forward and the first new token's logits, B·P tokens;
  // decode: the new_tokens − 1 steps after it, host sampling (or the device's greedy choice read back) included.
  double setup_ms = 0;  // making the fused path: buffers, weight copies, the graph's capture
  double prefill_ms = 0, prefill_tokens_per_s = 0;
  double ms_per_token = 0, decode_tokens_per_s = 0;
  // GPU memory (0 on the CPU): the high-water mark over a whole generation, over its decode steps alone, and what is
  // in use when the decoding starts and when it ends: flat in the generated length when the last three agree.
  double peak_memory_gib = 0, decode_peak_memory_gib = 0, decode_start_memory_gib = 0, decode_end_memory_gib = 0;
  int64_t decode_driver_allocations = 0;  // cudaMalloc calls during the decode steps
  // What a decode step must move at least: the weights its GEMMs read in the decoding dtype (and the embedding's B
  // rows), and the recurrent states read and written; over the GPU's measured copy rate, the step's memory floor.
  double weight_bytes = 0, state_bytes = 0, copy_gbps = 0, floor_ms = 0;
};
// Times generation (models/generation.h: prefill, then greedy decoding) with the config's model shape and random
// weights (its seed) on `device`: a random prompt of prompt_length ids continued by new_tokens in `batch` sequences,
// `dtype` activations and GEMM weights, on `path`. `warmup` untimed generations of a few tokens first, then `runs`
// timed ones. As in training, the GEMMs' algorithms are timed once per shape unless training.deterministic.
GenerationBench bench_generation(const Config& config, Device device, DType dtype, DecodePath path, int64_t batch,
                                 int64_t prompt_length, int64_t new_tokens, int64_t warmup, int64_t runs,
                                 std::ostream& log);

}  // namespace hgrn
