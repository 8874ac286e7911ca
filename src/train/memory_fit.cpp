// memory_fit.cpp: the training memory estimate against the host's memory (see memory_fit.h).
#include "train/memory_fit.h"

#include <unistd.h>

#include <cstdio>

#include "models/cost.h"

namespace hgrn {

double host_memory_bytes() {
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
}

void require_training_fits(const Config& config) {
  MemoryTarget cpu;  // the CPU's op-by-op path, in fp32
  cpu.gpu = false;
  cpu.bytes_per_activation = 4;
  const TrainingMemory memory =
      training_memory(config.model, config.training.micro_batch_size, config.data.seq_len, cpu);
  const double host = host_memory_bytes();
  if (memory.total() <= host) return;
  char text[256];
  std::snprintf(text, sizeof text,
                "an estimated %.0f bytes (%.3g GB: %.3g GB of weights, gradients and AdamW moments, %.3g GB of "
                "states, activations and working set) but this host has %.0f bytes (%.3g GB)",
                memory.total(), memory.total() / 1e9, memory.weights_and_optimizer / 1e9,
                (memory.total() - memory.weights_and_optimizer) / 1e9, host, host / 1e9);
  throw ConfigError(std::string(config.source.empty() ? "config" : config.source) +
                    ": the model and batch (model.hidden_size, model.num_hidden_layers, model.vocab_size, "
                    "training.micro_batch_size, data.seq_len) need " + text +
                    "; make the model or training.micro_batch_size smaller (hgrn info shows the estimate)");
}

}  // namespace hgrn
