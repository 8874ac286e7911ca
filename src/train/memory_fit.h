// memory_fit.h: refusing a run whose model cannot fit the machine before anything is allocated, with the estimate
// of models/cost.h, instead of letting the process grow until the system kills it.
#pragma once
#include "config/config.h"

namespace hgrn {

// The host's physical memory in bytes.
double host_memory_bytes();

// Throws ConfigError naming the model and batch keys, the estimated bytes and what the host has, when the
// estimated peak memory of training `config` on the CPU (models/cost.h: training_memory) exceeds the host's
// physical memory.
void require_training_fits(const Config& config);

}  // namespace hgrn
