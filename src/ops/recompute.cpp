// recompute.cpp: see recompute.h.
#include "ops/recompute.h"

namespace hgrn {

Var recompute(Tape& tape, const std::vector<Var>& inputs, RecomputedFn f) {
  if (!tape.enabled()) return f(tape, inputs);  // evaluation: nothing would be kept anyway
  Tape untaped;
  untaped.set_enabled(false);
  Var y = f(untaped, inputs);
  Var out = make_var(y->value, true);  // requires a gradient: parameters inside f always do in training
  tape.record([inputs, out, f = std::move(f)] {
    if (!out->grad.defined()) return;
    Tape again;
    Var y2 = f(again, inputs);
    if (y2->requires_grad) again.backward(y2, out->grad);
  });
  return out;
}

}  // namespace hgrn
