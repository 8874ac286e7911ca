// info.cpp: `hgrn info --config FILE [--set ...]`: prints the resolved config, a table of parameter counts per
// group, FLOPs per token and the state and activation memory of one training micro-batch.
#include "cli/info.h"

#include <cstdio>
#include <iomanip>

#include "core/format.h"
#include "models/cost.h"
#include "models/registry.h"

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
  const int64_t bytes_per_activation = config.training.precision == "bf16" ? 2 : 4;
  const ModelCost cost = model_cost(m, seq_len, bytes_per_activation);

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

  const double states = cost.state_bytes_per_sequence * static_cast<double>(batch);
  const double activations = cost.activation_bytes_per_token * static_cast<double>(batch * seq_len);
  // fp32 master weights, gradients and the two AdamW moments: 16 bytes per parameter.
  const double weights_and_optimizer = 16.0 * static_cast<double>(cost.params_total);
  out << "== training memory estimate (micro-batch " << batch << " x " << seq_len << " tokens, "
      << config.training.precision << " activations) ==\n"
      << "  recurrent states            " << short_bytes(states) << "  (" << short_bytes(cost.state_bytes_per_sequence)
      << " per sequence)\n"
      << "  activations for backward    " << short_bytes(activations) << "  ("
      << short_bytes(cost.activation_bytes_per_token) << " per token)\n"
      << "  weights, grads, AdamW       " << short_bytes(weights_and_optimizer) << "  (fp32, 16 bytes per parameter)\n"
      << "  total                       " << short_bytes(states + activations + weights_and_optimizer) << "\n";
}

int run_info_command(const ConfigArgs& args, std::ostream& out) {
  const Config config = load_config(args.config_path, args.overrides);
  print_info(config, out);
  return kExitOk;
}

}  // namespace hgrn::cli
