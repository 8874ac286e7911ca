// bench.cpp: `hgrn bench --config FILE` (training steps; with --generate, generation), `hgrn bench --recurrence
// B,T,H,K,V` (the recurrence alone) and `hgrn bench --scan B,T,C` (the gated scan alone): a table on stdout and,
// with --json, the same numbers as JSON.
#include "cli/bench.h"

#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"
#include "dist/world.h"
#include "train/bench.h"
#include "train/trainer.h"

namespace hgrn::cli {

CLI::App* add_bench_command(CLI::App& app, BenchArgs& args) {
  CLI::App* bench = app.add_subcommand(
      "bench", "Time whole training steps of a config (median of device-synchronised steps), or the GLA "
               "recurrence (HGRN2's) or the gated scan (HGRN1's) alone; prints a table, --json writes it");
  bench->add_option("-c,--config", args.config.config_path, "YAML config whose model, batch and sequence to time")
      ->type_name("FILE");
  bench->add_option("-s,--set", args.config.overrides, "Override a config key (KEY=VALUE, repeatable)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->take_all();
  bench->add_option("--recurrence", args.recurrence, "Time the recurrence alone at this shape")
      ->type_name("B,T,H,K,V")
      ->delimiter(',')
      ->expected(5);
  bench->add_option("--scan", args.scan, "Time the gated scan (HGRN1's recurrence) alone at this shape")
      ->type_name("B,T,C")
      ->delimiter(',')
      ->expected(3);
  bench->add_flag("--fused", args.fused_scan,
                  "Scan: time HGRN1's gates and scan fused (lower_bounded_gated_scan, from î and f̂, bounded gate)");
  bench->add_flag("--stateful", args.stateful,
                  "Config: time stateful steps (data.stateful: each row starts from the state it carried out of the "
                  "step before), on any data.task");
  bench->add_option("--dtype", args.dtype,
                    "Recurrence, scan: q/k/v or x dtype (g is always fp32); generate: activations and GEMM weights")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  bench->add_option("--device", args.device, "Recurrence, scan, generate: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  bench->add_option("--warmup", args.warmup, "Untimed steps (or calls, or short generations) first")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench->add_option("--steps", args.steps, "Timed training steps")->check(CLI::PositiveNumber)->capture_default_str();
  bench->add_option("--iters", args.iters, "Timed recurrence or scan calls")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench->add_option("--document-tokens", args.document_tokens,
                    "Restart the recurrent state at random document starts, documents of this many tokens on average "
                    "(as data.reset_state_at_document does for packed documents; 0: no resets)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench->add_flag("--generate", args.generate,
                  "With --config: time generation with its model (random weights): prefill, then greedy decoding");
  bench->add_option("--batch", args.batch, "Generate: sequences decoded side by side")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench->add_option("--prompt-length", args.prompt_length, "Generate: prompt tokens")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench->add_option("--new-tokens", args.new_tokens,
                    "Generate: tokens generated per sequence (e.g. 8192 against 256 to see the memory stay flat)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40))
      ->capture_default_str();
  bench->add_option("--decode", args.decode, "Generate: fused (fused steps, a CUDA graph on the GPU) or ops")
      ->check(CLI::IsMember({"fused", "ops"}))
      ->capture_default_str();
  bench->add_option("--runs", args.runs, "Generate: timed generations (the medians are reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench->add_option("--json", args.json_path, "Also write the results as JSON to this file")->type_name("FILE");
  bench->footer(
      "Examples:\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml              # tokens/s, MFU, peak memory\n"
      "  hgrn bench --config configs/hgrn2-150m.yaml --steps 10 --json bench-150m.json\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml --stateful   # the same steps with carried states\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml --generate --batch 64   # prefill and decode tokens/s\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml --generate --new-tokens 8192  # memory flat in the length\n"
      "  hgrn bench --recurrence 8,2048,8,128,128                 # the peer's recurrence shape\n"
      "  hgrn bench --scan 8,2048,1024                            # HGRN1's scan, forward and forward+backward\n"
      "  hgrn bench --scan 8,2048,1024 --fused --dtype bf16       # HGRN1's gates and scan in one op\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml --document-tokens 512  # the cost of document resets\n"
      "  mpirun -np 4 hgrn bench --config configs/hgrn2-385m.yaml # data-parallel steps on 4 GPUs (whole job)");
  return bench;
}

int run_bench_command(const BenchArgs& args, std::ostream& root_out) {
  // Under mpirun rank 0 alone reports (the others run the same steps).
  std::ostringstream discarded;
  std::ostream& out = world().is_root() ? root_out : discarded;
  const bool steps = !args.config.config_path.empty();
  if (int{steps} + int{!args.recurrence.empty()} + int{!args.scan.empty()} != 1)
    throw Error("hgrn bench: give one of --config FILE (training steps, or generation with --generate), "
                "--recurrence B,T,H,K,V or --scan B,T,C");
  if (args.generate && !steps) throw Error("hgrn bench --generate: give the model's --config FILE");
  if (args.generate && args.stateful) throw Error("hgrn bench: --stateful times training steps, not --generate");
  if (args.generate && args.document_tokens > 0)
    throw Error("hgrn bench: --document-tokens times training steps, the recurrence or the scan, not --generate");
  nlohmann::json json;
  out << std::fixed;
  if (args.document_tokens > 0 && !steps)
    out << "with resets: packed documents of ~" << args.document_tokens
        << " tokens, the state restarted at each document start\n";
  if (args.generate) {
    const Config config = load_config(args.config.config_path, args.config.overrides);
    const Device device = resolve_device(args.device);
    const DType dtype = args.dtype == "bf16" ? DType::BF16 : DType::F32;
    const GenerationBench r =
        bench_generation(config, device, dtype, args.decode == "fused" ? DecodePath::Fused : DecodePath::Ops,
                         args.batch, args.prompt_length, args.new_tokens, args.warmup, args.runs, out);
    const bool gpu = device == Device::CUDA;
    // The notes first, so that the table row stays the last line (scripts read it with tail).
    out << std::setprecision(3) << "decoding " << r.decode_path << "; set-up " << r.setup_ms << " ms, prefill "
        << r.prefill_ms << " ms\n";
    if (gpu) {
      out << "device memory: peak " << r.peak_memory_gib << " GiB over a generation, " << r.decode_peak_memory_gib
          << " GiB over its decode steps; in use " << r.decode_start_memory_gib << " GiB when they start, "
          << r.decode_end_memory_gib << " GiB when they end; " << r.decode_driver_allocations
          << " driver allocations during them\n";
      out << "a step's least traffic: " << r.weight_bytes / 1e9 << " GB of weights + " << r.state_bytes / 1e9
          << " GB of states read and written, " << r.floor_ms << " ms at the measured copy rate of " << r.copy_gbps
          << " GB/s; the step takes " << r.ms_per_token / r.floor_ms << "x that\n";
    }
    out << std::setprecision(1)
        << "| config | device | decode | dtype | batch | prompt | new tokens | prefill tokens/s | decode tokens/s | "
           "ms per token | peak GiB | floor ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n| "
        << config.source << " | " << r.device_name << " | " << r.decode_path << " | " << r.dtype << " | " << r.batch
        << " | " << r.prompt_length << " | " << r.new_tokens << " | " << std::setprecision(0)
        << r.prefill_tokens_per_s << " | " << r.decode_tokens_per_s << " | " << std::setprecision(3)
        << r.ms_per_token << " | " << r.peak_memory_gib << " | " << r.floor_ms << " |\n";
    json = {{"kind", "generation"}, {"config", config.source}, {"device", r.device_name},
            {"decode_path", r.decode_path}, {"dtype", r.dtype}, {"params", r.params}, {"batch", r.batch},
            {"prompt_length", r.prompt_length}, {"new_tokens", r.new_tokens}, {"runs", r.runs},
            {"warmup", args.warmup}, {"setup_ms", r.setup_ms}, {"prefill_ms", r.prefill_ms},
            {"prefill_tokens_per_s", r.prefill_tokens_per_s}, {"ms_per_token", r.ms_per_token},
            {"decode_tokens_per_s", r.decode_tokens_per_s}, {"peak_memory_gib", r.peak_memory_gib},
            {"decode_peak_memory_gib", r.decode_peak_memory_gib},
            {"decode_start_memory_gib", r.decode_start_memory_gib},
            {"decode_end_memory_gib", r.decode_end_memory_gib},
            {"decode_driver_allocations", r.decode_driver_allocations}, {"weight_bytes", r.weight_bytes},
            {"state_bytes", r.state_bytes}, {"device_copy_gbps", r.copy_gbps}, {"floor_ms", r.floor_ms}};
  } else if (steps) {
    Config config = load_config(args.config.config_path, args.config.overrides);
    // The steps run on random tokens whatever the data section says, so the carried states need no token stream.
    if (args.stateful) config.data.stateful = true;
    const StepBench r = bench_training_steps(config, args.warmup, args.steps, out, args.document_tokens);
    out << std::setprecision(1) << "\n| config | device | params | tokens/step | step ms (median) | tokens/s | MFU | "
        << "peak GiB |\n|---|---|---|---|---|---|---|---|\n| " << config.source << " | "
        << (r.ranks > 1 ? std::to_string(r.ranks) + " x " : "") << r.device_name << " | "
        << r.params / 1e6 << "M | " << r.tokens_per_step << " | " << std::setprecision(2) << r.median_ms << " | "
        << std::setprecision(0) << r.tokens_per_s << " | " << std::setprecision(1) << 100 * r.mfu << "% | "
        << std::setprecision(2) << r.peak_memory_gib << " |\n";
    out << "model " << r.model_tflops << " TFLOP/s against a measured bf16 GEMM peak of " << r.gpu_peak_tflops
        << " TFLOP/s; step times min " << r.min_ms << " / median " << r.median_ms << " / mean " << r.mean_ms
        << " / max " << r.max_ms << " ms (" << std::setprecision(0) << r.tokens_per_s_mean
        << " tokens/s at the mean); loss " << std::setprecision(2) << r.first_loss << " -> " << r.last_loss << "\n";
    if (r.device_name != "cpu")
      out << "device memory: peak in use " << r.peak_memory_gib << " GiB, reserved from the driver "
          << r.reserved_memory_gib << " GiB, " << r.timed_driver_allocations
          << " driver allocations during the timed steps\n";
    if (r.ranks > 1)
      out << "gradient reductions: " << r.reduce_buckets << " a step, " << std::setprecision(2) << r.reduce_busy_ms
          << " ms a step busy (on the communication stream on GPUs), the last ending " << r.reduce_tail_ms
          << " ms after the backward\n";
    json = {{"kind", "training_step"}, {"config", config.source}, {"device", r.device_name}, {"params", r.params},
            {"tokens_per_step", r.tokens_per_step}, {"warmup", r.warmup}, {"steps", r.steps},
            {"median_ms", r.median_ms}, {"mean_ms", r.mean_ms}, {"min_ms", r.min_ms}, {"max_ms", r.max_ms},
            {"tokens_per_s", r.tokens_per_s}, {"tokens_per_s_mean", r.tokens_per_s_mean},
            {"peak_memory_gib", r.peak_memory_gib}, {"reserved_memory_gib", r.reserved_memory_gib},
            {"timed_driver_allocations", r.timed_driver_allocations}, {"gpu_peak_tflops", r.gpu_peak_tflops},
            {"model_tflops", r.model_tflops}, {"mfu", r.mfu}, {"first_loss", r.first_loss},
            {"last_loss", r.last_loss}, {"precision", config.training.precision},
            {"ranks", r.ranks}, {"zero1", config.training.zero1},
            {"grad_reduce_dtype", config.training.grad_reduce_dtype}, {"stateful", config.data.stateful},
            {"document_tokens", args.document_tokens}, {"reduce_buckets", r.reduce_buckets},
            {"reduce_busy_ms", r.reduce_busy_ms}, {"reduce_tail_ms", r.reduce_tail_ms}};
  } else if (!args.scan.empty()) {
    const Device device = resolve_device(args.device);
    const DType dtype = args.dtype == "bf16" ? DType::BF16 : DType::F32;
    HGRN_CHECK(dtype == DType::F32 || device == Device::CUDA, "hgrn bench: bf16 needs the GPU (use --dtype fp32)");
    const auto& s = args.scan;
    for (int64_t x : s) HGRN_CHECK(x > 0, "hgrn bench --scan: B,T,C must be positive");
    const ScanBench r =
        bench_scan(s[0], s[1], s[2], dtype, device, args.warmup, args.iters, args.fused_scan, args.document_tokens);
    const double gbps_fwd = r.bytes_forward / (r.forward_ms * 1e-3) / 1e9;
    const double gbps_fwd_bwd = r.bytes_forward_backward / (r.forward_backward_ms * 1e-3) / 1e9;
    // The note first, so that the table row stays the last line (scripts read it with tail).
    out << (args.fused_scan ? "lower_bounded_gated_scan. GB/s: the least bytes each must move over its median time "
                              "(the forward reads î, f̂ and writes o; the backward also reads î, f̂, dO and writes dî, "
                              "df̂)\n"
                            : "GB/s: the least bytes each must move over its median time (the forward reads x, g and "
                              "writes o; the backward also reads x, g, dO and writes dx, dg)\n");
    out << std::setprecision(3)
        << "| B | T | C | dtype | forward ms | forward+backward ms | forward GB/s | forward+backward GB/s |\n"
        << "|---|---|---|---|---|---|---|---|\n| " << r.B << " | " << r.T << " | " << r.C << " | " << r.dtype
        << " | " << r.forward_ms << " | " << r.forward_backward_ms << " | " << std::setprecision(1) << gbps_fwd
        << " | " << gbps_fwd_bwd << " |\n";
    json = {{"kind", args.fused_scan ? "lower_bounded_scan" : "scan"}, {"B", r.B}, {"T", r.T}, {"C", r.C},
            {"dtype", r.dtype}, {"device", device_name(device)},
            {"forward_ms", r.forward_ms}, {"forward_backward_ms", r.forward_backward_ms},
            {"forward_min_bytes", r.bytes_forward}, {"forward_backward_min_bytes", r.bytes_forward_backward},
            {"forward_gbps", gbps_fwd}, {"forward_backward_gbps", gbps_fwd_bwd},
            {"document_tokens", args.document_tokens}};
  } else {
    const Device device = resolve_device(args.device);
    const DType dtype = args.dtype == "bf16" ? DType::BF16 : DType::F32;
    HGRN_CHECK(dtype == DType::F32 || device == Device::CUDA, "hgrn bench: bf16 needs the GPU (use --dtype fp32)");
    const auto& s = args.recurrence;
    for (int64_t x : s) HGRN_CHECK(x > 0, "hgrn bench --recurrence: B,T,H,K,V must be positive");
    const RecurrenceBench r =
        bench_recurrence(s[0], s[1], s[2], s[3], s[4], dtype, device, args.warmup, args.iters, args.document_tokens);
    const double gbps = r.bytes_forward / (r.forward_ms * 1e-3) / 1e9;
    const double tflops_fwd = r.flops_forward / (r.forward_ms * 1e-3) / 1e12;
    const double tflops_fwd_bwd = 3.0 * r.flops_forward / (r.forward_backward_ms * 1e-3) / 1e12;
    // Against the ceilings first, so that the table row stays the last line (scripts read it with tail).
    if (r.copy_gbps > 0 && r.gemm_tflops > 0)
      out << std::setprecision(3) << "ceilings measured now: device copy " << r.copy_gbps
          << " GB/s (read + write), bf16 GEMM " << r.gemm_tflops << " TFLOP/s; the forward moves its minimal bytes at "
          << 100.0 * gbps / r.copy_gbps << "% of the copy rate and computes at " << 100.0 * tflops_fwd / r.gemm_tflops
          << "% (forward+backward " << 100.0 * tflops_fwd_bwd / r.gemm_tflops << "%) of the GEMM rate\n";
    out << std::setprecision(3)
        << "| B | T | H | K | V | dtype | forward ms | forward+backward ms | forward GB/s | forward TFLOP/s | "
           "forward+backward TFLOP/s |\n"
        << "|---|---|---|---|---|---|---|---|---|---|---|\n| " << r.B << " | " << r.T << " | " << r.H << " | " << r.K
        << " | " << r.V << " | " << r.dtype << " | " << r.forward_ms << " | " << r.forward_backward_ms << " | "
        << std::setprecision(0) << gbps << " | " << std::setprecision(3) << tflops_fwd << " | " << tflops_fwd_bwd
        << " |\n";
    json = {{"kind", "recurrence"}, {"B", r.B}, {"T", r.T}, {"H", r.H}, {"K", r.K}, {"V", r.V}, {"dtype", r.dtype},
            {"device", device_name(device)}, {"forward_ms", r.forward_ms},
            {"forward_backward_ms", r.forward_backward_ms}, {"forward_min_bytes", r.bytes_forward},
            {"forward_flops", r.flops_forward}, {"forward_tflops", tflops_fwd},
            {"forward_backward_tflops", tflops_fwd_bwd}, {"device_copy_gbps", r.copy_gbps},
            {"bf16_gemm_tflops", r.gemm_tflops}, {"document_tokens", args.document_tokens}};
  }
  if (!args.json_path.empty() && world().is_root()) {
    std::ofstream f(args.json_path);
    f << json.dump(2) << "\n";
    HGRN_CHECK(f.good(), "hgrn bench: cannot write ", args.json_path);
  }
  return kExitOk;
}

}  // namespace hgrn::cli
