// info.cpp: `hgrn info --config FILE [--set ...]`: prints the resolved config, a table of parameter counts per
// group, FLOPs per token and an estimate of a training step's peak memory, item by item.
#include "cli/info.h"

#include <cstdio>
#include <iomanip>

#include "core/format.h"
#include "models/cost.h"
#include "models/registry.h"
#include "train/memory_fit.h"

namespace hgrn::cli {

namespace {

// 1234567 -> "1.23M": a short form next to the exact count (B for billions, as parameter counts are written).
std::string short_count(double value) { return format_scaled(value, 1000.0, {"", "K", "M", "B", "T"}, "", ""); }

// 1536 -> "1.50 KiB".
std::string short_bytes(double bytes) {
  return format_scaled(bytes, 1024.0, {"B", "KiB", "MiB", "GiB", "TiB"}, " ", "");
}

std::string scientific(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.4g", value);
  return buffer;
}

}  // namespace

CLI::App* add_info_command(CLI::App& app, ConfigArgs& args) {
  CLI::App* info = app.add_subcommand(
      "info", "Print the resolved config, parameter counts, FLOPs per token and a memory estimate (trains nothing)");
  add_config_options(*info, args);
  info->footer(
      "Examples:\n"
      "  hgrn info --config configs/mqar-tiny.yaml\n"
      "  hgrn info --config configs/hgrn2-385m.yaml --set training.micro_batch_size=8\n"
      "  hgrn info -c configs/mqar-tiny.yaml -s model.hidden_size=128 -s data.mqar.num_kv_pairs=16");
  return info;
}

void print_info(const Config& config, std::ostream& out) {
  const ModelConfig& m = config.model;
  const int64_t batch = config.training.micro_batch_size;
  const int64_t seq_len = config.data.seq_len;
  const ModelCost cost = model_cost(m, seq_len);

  out << "== resolved config ==\n" << config_to_yaml(config) << "\n";

  out << "== model ==\n"
      << "  " << model_family(m.type).display_name() << ": " << m.num_hidden_layers << " layers, hidden "
      << m.hidden_size << ", " << model_family(m.type).mixer_summary(m) << ", MLP " << m.mlp_size() << ", vocab "
      << m.vocab_size
      << (m.tie_word_embeddings ? ", tied embeddings" : ", untied embeddings") << "\n\n";

  out << "== parameters ==\n";
  out << "  " << std::left << std::setw(16) << "group" << std::right << std::setw(16) << "count" << std::setw(10)
      << "share" << "\n";
  for (const auto& [group, count] : cost.params_by_group) {
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%", 100.0 * static_cast<double>(count) / cost.params_total);
    out << "  " << std::left << std::setw(16) << group << std::right << std::setw(16) << count << std::setw(10) << share
        << "\n";
  }
  out << "  " << std::left << std::setw(16) << "total" << std::right << std::setw(16) << cost.params_total << "  ("
      << short_count(static_cast<double>(cost.params_total)) << ")\n\n";

  const double tokens_per_step = static_cast<double>(batch * seq_len * config.training.grad_accum_steps);
  out << "== compute (chunk size " << gla_chunk_size(seq_len) << ") ==\n"
      << "  forward FLOPs per token     " << scientific(cost.flops_per_token_fwd) << "\n"
      << "  training FLOPs per token    " << scientific(cost.flops_per_token_train) << "  (3 x forward)\n"
      << "  training FLOPs per step     " << scientific(cost.flops_per_token_train * tokens_per_step) << "  ("
      << short_count(tokens_per_step) << " tokens: micro_batch_size " << batch << " x seq_len " << seq_len
      << " x grad_accum_steps " << config.training.grad_accum_steps << ")\n\n";

  const MemoryTarget target = memory_target(config);
  const TrainingMemory memory = training_memory(m, batch, seq_len, target);
  const double tokens = static_cast<double>(batch * seq_len);
  out << "== training memory estimate: peak " << (target.gpu ? "GPU memory in use" : "host memory of the tensors")
      << " in one step (micro-batch " << batch << " x " << seq_len << " tokens, " << config.training.precision
      << " activations, " << (target.gpu ? "GPU" : "CPU") << " path) ==\n"
      << "  recurrent states            " << short_bytes(memory.states) << "  ("
      << short_bytes(memory.states / static_cast<double>(batch)) << " per sequence: final states and the per-chunk "
      << "states kept for the backward)\n"
      << "  activations for backward    " << short_bytes(memory.activations) << "  ("
      << short_bytes(memory.activations / tokens) << " per token, under model.memory)\n"
      << "  weights, grads, AdamW       " << short_bytes(memory.weights_and_optimizer) << "  (fp32: "
      << (target.gpu ? "weights and moments, 12 bytes per parameter, and the gradients made by the peak"
                     : "weights, gradients and moments, 16 bytes per parameter")
      << ")\n";
  if (memory.weight_copies > 0 && target.fp8)
    out << "  weight copies and codes     " << short_bytes(memory.weight_copies)
        << "  (the head's bf16 copy, 2 bytes per weight; the layers' FP8 codes, 1 byte per weight, for a step)\n";
  else if (memory.weight_copies > 0)
    out << "  bf16 weight copies          " << short_bytes(memory.weight_copies) << "  (2 bytes per matmul weight"
        << (m.memory.recompute_weight_copies ? ": the head's only, recompute_weight_copies" : "") << ")\n";
  out << "  backward working set        " << short_bytes(memory.working_set) << "  (the largest transient, at "
      << memory.peak_at << ")\n"
      << "  total                       " << short_bytes(memory.total()) << "  (estimated peak"
      << (target.gpu ? ", as `hgrn bench` measures it" : "") << ")\n";
  const double host = host_memory_bytes();
  if (!target.gpu && memory.total() > host)
    out << "  (more than this host's " << short_bytes(host)
        << " of memory: hgrn train on the CPU refuses it here)\n";
}

int run_info_command(const ConfigArgs& args, std::ostream& out) {
  const Config config = load_config(args.config_path, args.overrides);
  print_info(config, out);
  return kExitOk;
}

}  // namespace hgrn::cli
