// lm_loss.h: the language-model loss of one batch: forward, then cross-entropy against the batch's targets.
#pragma once
#include "data/mqar.h"
#include "models/registry.h"
#include "ops/cross_entropy.h"

namespace hgrn {

// Targets are already aligned with positions (target_t is the token after position t; -100 = no loss). The batch's
// resets, where given, restart the recurrent state at document starts; every target still counts (docs/data.md).
// recurrent_states: as CausalLM::forward's (carried states in, final states out), or null.
CrossEntropyResult language_model_loss(const CausalLM& model, Tape& tape, const TokenBatch& batch,
                                       std::vector<Var>* recurrent_states = nullptr);

}  // namespace hgrn
