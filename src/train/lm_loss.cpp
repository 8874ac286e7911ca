// lm_loss.cpp: the model's hidden states through the fused LM head + cross-entropy (no whole-batch logits).
#include "train/lm_loss.h"

#include "core/trace.h"
#include "ops/linear_cross_entropy.h"

namespace hgrn {

CrossEntropyResult language_model_loss(const CausalLM& model, Tape& tape, const TokenBatch& batch,
                                       std::vector<Var>* recurrent_states) {
  HGRN_CHECK(batch.inputs.shape() == batch.targets.shape(), "batch inputs ", shape_str(batch.inputs.shape()),
             " and targets ", shape_str(batch.targets.shape()), " differ in shape");
  const Var hidden = model.forward_hidden(tape, batch.inputs, recurrent_states, batch.resets);
  TraceLayer trace(tape, "lm_head + cross-entropy");
  return linear_cross_entropy(tape, hidden, model.lm_head(),
                              on_device(batch.targets.reshape({batch.targets.numel()}), model.device()));
}

}  // namespace hgrn
