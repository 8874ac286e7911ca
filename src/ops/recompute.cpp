// recompute.cpp: see recompute.h.
#include "ops/recompute.h"

namespace hgrn {

namespace {
// True while recompute() replays a block for its backward: that backward follows at once, so freeing the block's
// intermediates there (rematerialize) would only compute them twice.
thread_local bool replaying = false;
struct ReplayScope {
  ReplayScope() { replaying = true; }
  ~ReplayScope() { replaying = false; }
};

// A value made again for v must be the one the forward made: same shape and dtype (what rematerialize's recompute and
// a producer's backward return); `what` (formatted only on failure) names what came back instead.
template <typename... What>
void check_like_released(const Var& v, const Tensor& value, const What&... what) {
  HGRN_CHECK(value.shape() == v->released.shape && value.dtype() == v->released.dtype, what..., " came back as ",
             shape_str(value.shape()), " ", dtype_name(value.dtype()), ", the forward made ",
             shape_str(v->released.shape), " ", dtype_name(v->released.dtype));
}
}  // namespace

Var recompute(Tape& tape, const std::vector<Var>& inputs, RecomputedFn f) {
  if (!tape.enabled()) return f(tape, inputs);  // evaluation: nothing would be kept anyway
  Tape untaped;
  untaped.set_enabled(false);
  Var y = f(untaped, inputs);
  Var out = make_var(y->value, true);  // requires a gradient: parameters inside f always do in training
  tape.record([inputs, out, f = std::move(f)] {
    if (!out->grad.defined()) return;
    Tape again;
    Var y2;
    {
      ReplayScope scope;
      y2 = f(again, inputs);
    }
    if (y2->requires_grad) again.backward(y2, out->grad);
  });
  return out;
}

void rematerialize(Tape& tape, const std::vector<Var>& vars, RematerializeFn values) {
  if (!tape.enabled() || replaying) return;
  for (const Var& v : vars) release_value(v);  // keeps each one's shape and dtype in v->released
  tape.record([vars, values = std::move(values)] {
    Tape untaped;
    untaped.set_enabled(false);
    std::vector<Tensor> recomputed = values(untaped);
    HGRN_CHECK(recomputed.size() == vars.size(), "rematerialize: ", recomputed.size(), " values for ", vars.size(),
               " tensors");
    for (size_t i = 0; i < vars.size(); ++i) {
      check_like_released(vars[i], recomputed[i], "rematerialize: tensor ", i);
      vars[i]->value = std::move(recomputed[i]);
    }
  });
}

void release_until_producer_backward(Tape& tape, const Var& v) {
  if (!tape.enabled() || replaying) return;
  release_value(v);
  v->restored_by_producer = true;
}

void when_value_ready(const Var& v, std::function<void()> work) {
  if (v->value.defined()) {
    work();
    return;
  }
  HGRN_CHECK(v->restored_by_producer, "when_value_ready: '", v->name,
             "' has no value and no producer that writes it again in the backward");
  v->waiting_for_value.push_back(std::move(work));
}

namespace {
// Runs and clears v's waiting work, in the order it was queued.
void run_waiting(const Var& v) {
  std::vector<std::function<void()>> waiting = std::move(v->waiting_for_value);
  v->waiting_for_value.clear();
  v->codes_wanted.reset();
  for (auto& work : waiting) work();
}
}  // namespace

void restore_value(const Var& v, Tensor value) {
  HGRN_CHECK(v->restored_by_producer && !v->value.defined(), "restore_value: '", v->name,
             "' was not released until its producer's backward");
  check_like_released(v, value, "restore_value: the value");
  v->value = std::move(value);
  run_waiting(v);
  v->value = Tensor();
}

void when_value_or_codes_ready(const Var& v, const Fp8CodesOut& codes, std::function<void()> work) {
  HGRN_CHECK(codes.codes && codes.scale, "when_value_or_codes_ready: '", v->name, "': no codes buffer or scale");
  const bool first = !v->value.defined() && v->waiting_for_value.empty();
  when_value_ready(v, std::move(work));
  if (first) v->codes_wanted = std::make_shared<const Fp8CodesOut>(codes);
}

const Fp8CodesOut* codes_to_restore(const Var& v) {
  if (!v->restored_by_producer || v->value.defined() || v->waiting_for_value.size() != 1) return nullptr;
  return v->codes_wanted.get();
}

void restore_codes(const Var& v) {
  HGRN_CHECK(codes_to_restore(v), "restore_codes: '", v->name, "' has no consumer waiting for codes alone");
  run_waiting(v);
}

}  // namespace hgrn
