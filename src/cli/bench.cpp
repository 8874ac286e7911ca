// bench.cpp: `hgrn bench --config FILE` (training steps), `hgrn bench --recurrence B,T,H,K,V` (the recurrence alone)
// and `hgrn bench --scan B,T,C` (the gated scan alone): a table on stdout and, with --json, the same numbers as JSON.
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
  bench->add_option("--dtype", args.dtype, "Recurrence, scan: q/k/v or x dtype (g is always fp32)")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  bench->add_option("--device", args.device, "Recurrence, scan: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  bench->add_option("--warmup", args.warmup, "Untimed steps (or calls) first")->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  bench->add_option("--steps", args.steps, "Timed training steps")->check(CLI::PositiveNumber)->capture_default_str();
  bench->add_option("--iters", args.iters, "Timed recurrence or scan calls")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench->add_option("--json", args.json_path, "Also write the results as JSON to this file")->type_name("FILE");
  bench->footer(
      "Examples:\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml              # tokens/s, MFU, peak memory\n"
      "  hgrn bench --config configs/hgrn2-150m.yaml --steps 10 --json bench-150m.json\n"
      "  hgrn bench --config configs/hgrn2-385m.yaml --stateful   # the same steps with carried states\n"
      "  hgrn bench --recurrence 8,2048,8,128,128                 # the peer's recurrence shape\n"
      "  hgrn bench --scan 8,2048,1024                            # HGRN1's scan, forward and forward+backward\n"
      "  hgrn bench --scan 8,2048,1024 --fused --dtype bf16       # HGRN1's gates and scan in one op\n"
      "  mpirun -np 4 hgrn bench --config configs/hgrn2-385m.yaml # data-parallel steps on 4 GPUs (whole job)");
  return bench;
}

int run_bench_command(const BenchArgs& args, std::ostream& root_out) {
  // Under mpirun rank 0 alone reports (the others run the same steps).
  std::ostringstream discarded;
  std::ostream& out = world().is_root() ? root_out : discarded;
  const bool steps = !args.config.config_path.empty();
  if (int{steps} + int{!args.recurrence.empty()} + int{!args.scan.empty()} != 1)
    throw Error("hgrn bench: give one of --config FILE (training steps), --recurrence B,T,H,K,V or --scan B,T,C");
  nlohmann::json json;
  out << std::fixed;
  if (steps) {
    Config config = load_config(args.config.config_path, args.config.overrides);
    // The steps run on random tokens whatever the data section says, so the carried states need no token stream.
    if (args.stateful) config.data.stateful = true;
    const StepBench r = bench_training_steps(config, args.warmup, args.steps, out);
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
    json = {{"kind", "training_step"}, {"config", config.source}, {"device", r.device_name}, {"params", r.params},
            {"tokens_per_step", r.tokens_per_step}, {"warmup", r.warmup}, {"steps", r.steps},
            {"median_ms", r.median_ms}, {"mean_ms", r.mean_ms}, {"min_ms", r.min_ms}, {"max_ms", r.max_ms},
            {"tokens_per_s", r.tokens_per_s}, {"tokens_per_s_mean", r.tokens_per_s_mean},
            {"peak_memory_gib", r.peak_memory_gib}, {"reserved_memory_gib", r.reserved_memory_gib},
            {"timed_driver_allocations", r.timed_driver_allocations}, {"gpu_peak_tflops", r.gpu_peak_tflops},
            {"model_tflops", r.model_tflops}, {"mfu", r.mfu}, {"first_loss", r.first_loss},
            {"last_loss", r.last_loss}, {"precision", config.training.precision},
            {"ranks", r.ranks}, {"zero1", config.training.zero1}, {"stateful", config.data.stateful}};
  } else if (!args.scan.empty()) {
    const Device device = resolve_device(args.device);
    const DType dtype = args.dtype == "bf16" ? DType::BF16 : DType::F32;
    HGRN_CHECK(dtype == DType::F32 || device == Device::CUDA, "hgrn bench: bf16 needs the GPU (use --dtype fp32)");
    const auto& s = args.scan;
    for (int64_t x : s) HGRN_CHECK(x > 0, "hgrn bench --scan: B,T,C must be positive");
    const ScanBench r = bench_scan(s[0], s[1], s[2], dtype, device, args.warmup, args.iters, args.fused_scan);
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
            {"forward_gbps", gbps_fwd}, {"forward_backward_gbps", gbps_fwd_bwd}};
  } else {
    const Device device = resolve_device(args.device);
    const DType dtype = args.dtype == "bf16" ? DType::BF16 : DType::F32;
    HGRN_CHECK(dtype == DType::F32 || device == Device::CUDA, "hgrn bench: bf16 needs the GPU (use --dtype fp32)");
    const auto& s = args.recurrence;
    for (int64_t x : s) HGRN_CHECK(x > 0, "hgrn bench --recurrence: B,T,H,K,V must be positive");
    const RecurrenceBench r = bench_recurrence(s[0], s[1], s[2], s[3], s[4], dtype, device, args.warmup, args.iters);
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
            {"bf16_gemm_tflops", r.gemm_tflops}};
  }
  if (!args.json_path.empty() && world().is_root()) {
    std::ofstream f(args.json_path);
    f << json.dump(2) << "\n";
    HGRN_CHECK(f.good(), "hgrn bench: cannot write ", args.json_path);
  }
  return kExitOk;
}

}  // namespace hgrn::cli
