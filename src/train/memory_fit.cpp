// memory_fit.cpp: the training memory estimate against the host's memory (see memory_fit.h).
#include "train/memory_fit.h"

#include <unistd.h>

#include <cstdio>

#include "models/cost.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/cuda_context.h"
#endif

namespace hgrn {

double host_memory_bytes() {
  return static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
}

void require_training_fits(const Config& config, Device device, int64_t activation_bytes) {
  MemoryTarget target;
  target.gpu = device == Device::CUDA;
  target.bytes_per_activation = target.gpu ? activation_bytes : 4;  // the CPU's op-by-op path runs in fp32
  target.fp8 = target.gpu && config.training.precision == "fp8";
  const TrainingMemory memory =
      training_memory(config.model, config.training.micro_batch_size, config.data.seq_len, target);
  double available = 0;
  const char* holder = "this host";
  if (target.gpu) {
#ifdef HGRN_WITH_CUDA
    available = static_cast<double>(cuda_device_properties().totalGlobalMem);
    holder = "this GPU";
#else
    return;
#endif
  } else {
    available = host_memory_bytes();
  }
  if (memory.total() <= available) return;
  char text[320];
  std::snprintf(text, sizeof text,
                "an estimated %.0f bytes (%.3g GB: %.3g GB of weights, gradients and AdamW moments, %.3g GB of "
                "states, activations and working set) but %s has %.0f bytes (%.3g GB)",
                memory.total(), memory.total() / 1e9, memory.weights_and_optimizer / 1e9,
                (memory.total() - memory.weights_and_optimizer) / 1e9, holder, available, available / 1e9);
  throw ConfigError(std::string(config.source.empty() ? "config" : config.source) +
                    ": the model and batch (model.hidden_size, model.num_hidden_layers, model.vocab_size, "
                    "training.micro_batch_size, data.seq_len) need " + text +
                    "; make the model or training.micro_batch_size smaller" +
                    std::string(target.gpu ? ", or set model.memory.recompute: true" : "") +
                    " (hgrn info shows the estimate)");
}

}  // namespace hgrn
