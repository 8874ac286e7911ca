// lm_loss.cpp: logits [B, T, V] flattened to [B*T, V] for the cross-entropy.
#include "train/lm_loss.h"

#include "core/trace.h"
#include "ops/elementwise.h"

namespace hgrn {

CrossEntropyResult language_model_loss(const Hgrn2Model& model, Tape& tape, const TokenBatch& batch) {
  HGRN_CHECK(batch.inputs.shape() == batch.targets.shape(), "batch inputs ", shape_str(batch.inputs.shape()),
             " and targets ", shape_str(batch.targets.shape()), " differ in shape");
  Var logits = model.forward(tape, batch.inputs);
  const int64_t rows = batch.inputs.numel();
  TraceLayer trace(tape, "cross-entropy");
  return cross_entropy(tape, reshape(tape, logits, {rows, model.config().vocab_size}),
                       on_device(batch.targets.reshape({rows}), model.device()));
}

}  // namespace hgrn
