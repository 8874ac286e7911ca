// memory_fit.h: refusing a run whose model cannot fit the machine before anything is allocated, with the estimate
// of models/cost.h, instead of letting the process grow until the system kills it.
#pragma once
#include "config/config.h"
#include "core/tensor.h"

namespace hgrn {

// The host's physical memory in bytes.
double host_memory_bytes();

// Throws ConfigError naming the model and batch keys, the estimated bytes and what the device has, when the
// estimated peak memory of training `config` on `device` (models/cost.h: training_memory; activations of
// `activation_bytes` each on the GPU) exceeds the host's physical memory (CPU) or the GPU's memory (CUDA).
void require_training_fits(const Config& config, Device device, int64_t activation_bytes);

}  // namespace hgrn
