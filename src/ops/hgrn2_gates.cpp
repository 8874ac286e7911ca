// hgrn2_gates.cpp: lower_bound_transform, hgrn2_forget_gate and input_gate_from_forget, forward and backward.
//
// Forget gate with a bound (ℓ > 0): with ls(x) = logsigmoid(x) = log σ(x), the gate is g = log λ where
//   λ = γ + (1 − γ)·σ(f̂) = 1 − u,   u = (1 − γ)·σ(−f̂).
// Two forms, each accurate where the other is not, neither taking the log of a rounded sum that contains σ(f̂):
//   λ ≤ 1/2:  g = logaddexp(log γ, log1p(−γ) + ls(f̂))   (the spec's log-space form; full relative precision
//             for small λ, however far σ(f̂) underflows)
//   λ > 1/2:  g = log1p(−u), u = (1 − γ)·σ(−f̂)            (keeps g's relative precision as g → 0, where the
//             first form cancels, so that k = 1 − exp(g) = u stays accurate even for γ close to 1)
// γ = 0 (a bound that rounded to 0) gives exactly ls(f̂). Rounding cannot take g outside [log γ, 0].
// The derivatives, as exponentials of sums of logs so that no factor underflows on the way (σ(f̂) can) and
// ∂g/∂f̂, which is at most σ(−f̂), cannot overflow:
//   ∂g/∂f̂ = (1 − γ)·σ(f̂)·σ(−f̂) / λ = exp(log1p(−γ) + ls(f̂) − g + ls(−f̂)),
//   ∂g/∂γ = (1 − σ(f̂)) / λ          = exp(ls(−f̂) − g)   (at most 1/γ).
// Without a bound, ∂g/∂f̂ = σ(−f̂).
// On the GPU (kernels/hgrn2_gates.cu, the same formulas in fp32) Γ, γ and g are fp32 whatever the activation dtype
// (spec 1.3: g stays fp32 in every layer), f̂ is fp32 or bf16, and k is stored in the dtype the caller asks for.
#include "ops/hgrn2_gates.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/activations.h"
#include "ops/cpu_math.h"
#include "ops/cpu_parallel.h"
#include "ops/elementwise.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/hgrn2_gates.h"
#endif

namespace hgrn {

// std::min(x, 0) as a select, which element loops vectorise (std::min's reference they do not).
template <typename T>
static inline T min_zero(T x) {
  return T(0) < x ? T(0) : x;
}

// log σ(x) and log σ(−x) = log(1 − σ(x)), as min(±x, 0) − log1p(exp(−|x|)): exp is only taken of a non-positive
// number, and the two share the one transcendental term.
template <typename T>
struct LogSigmoidPair {
  T of_x, of_minus_x;
};
template <typename T>
static inline LogSigmoidPair<T> log_sigmoid_pair(T x) {
  const T tail = cpu_log1p(cpu_exp(-std::abs(x)));
  return {min_zero(x) - tail, min_zero(-x) - tail};
}

// log1p(−γ) per channel, shared by every row.
template <typename T>
static std::vector<T> log_one_minus(const T* gamma_row, int64_t width) {
  std::vector<T> out(static_cast<size_t>(width));
  for (int64_t c = 0; c < width; ++c) out[static_cast<size_t>(c)] = std::log1p(-gamma_row[c]);
  return out;
}

// log(exp(a) + exp(b)) for a, b ≤ 0, either possibly −inf. Without a branch (selects), for vectorised loops.
template <typename T>
static inline T log_add_exp(T a, T b) {
  const T hi = a < b ? b : a, lo = b < a ? b : a;  // std::max(a, b), std::min(a, b)
  const T sum = hi + cpu_log1p(cpu_exp(lo - hi));
  return hi > -std::numeric_limits<T>::infinity() ? sum : hi;
}

// ---- lower bound ----------------------------------------------------------------------------------------------

template <typename T>
static void lower_bound_forward_cpu(const T* lower_bounds, T* probs, T* gamma, int64_t layers, int64_t width) {
  for (int64_t d = 0; d < width; ++d) {
    T max_value = lower_bounds[d];
    for (int64_t l = 1; l < layers; ++l) max_value = std::max(max_value, lower_bounds[l * width + d]);
    // γ_ℓ = (e_1 + … + e_ℓ) / S rather than cumsum(P) − P_0: the same number, with γ_0 = 0 exactly and no
    // cancellation when P_0 dominates.
    T total = 0;
    for (int64_t l = 0; l < layers; ++l) {
      const T e = std::exp(lower_bounds[l * width + d] - max_value);
      probs[l * width + d] = e;
      total += e;
    }
    T partial = 0;
    gamma[d] = 0;
    for (int64_t l = 1; l < layers; ++l) {
      partial += probs[l * width + d];
      gamma[l * width + d] = partial / total;
    }
    for (int64_t l = 0; l < layers; ++l) probs[l * width + d] /= total;
  }
}

// dP_j = Σ_{ℓ ≥ j} dγ_ℓ for j ≥ 1, dP_0 = 0, then dΓ_j += P_j · (dP_j − Σ_m P_m dP_m).
template <typename T>
static void lower_bound_backward_cpu(const T* probs, const T* dgamma, T* dlower_bounds, int64_t layers,
                                     int64_t width) {
  std::vector<T> dprobs(static_cast<size_t>(layers));
  for (int64_t d = 0; d < width; ++d) {
    T suffix = 0;
    for (int64_t l = layers - 1; l >= 1; --l) {
      suffix += dgamma[l * width + d];
      dprobs[static_cast<size_t>(l)] = suffix;
    }
    dprobs[0] = 0;
    T weighted = 0;
    for (int64_t l = 0; l < layers; ++l) weighted += probs[l * width + d] * dprobs[static_cast<size_t>(l)];
    for (int64_t l = 0; l < layers; ++l)
      dlower_bounds[l * width + d] += probs[l * width + d] * (dprobs[static_cast<size_t>(l)] - weighted);
  }
}

Var lower_bound_transform(Tape& tape, const Var& lower_bounds) {
  HGRN_CHECK(lower_bounds, "lower_bound_transform: lower_bounds is null");
  const Tensor& lv = lower_bounds->value;
  HGRN_CHECK(lv.dim() == 2 && lv.size(0) >= 1, "lower_bound_transform: lower_bounds must be [L, D] with L >= 1, got ",
             shape_str(lv.shape()));
  HGRN_CHECK(lv.is_contiguous(), "lower_bound_transform: lower_bounds must be contiguous");
  const bool on_gpu = lv.device() == Device::CUDA;
  HGRN_CHECK(!on_gpu || lv.dtype() == DType::F32, "lower_bound_transform: lower_bounds on the GPU must be fp32, got ",
             dtype_name(lv.dtype()));
  const int64_t layers = lv.size(0), width = lv.size(1);
  Tensor gamma = Tensor::empty(lv.shape(), lv.dtype(), lv.device());
  Tensor probs = Tensor::empty(lv.shape(), lv.dtype(), lv.device());
  if (on_gpu) {
#ifdef HGRN_WITH_CUDA
    cuda_lower_bound_forward(lv.data<float>(), probs.data<float>(), gamma.data<float>(), layers, width);
#else
    throw Error("lower_bound_transform: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(lv.dtype(), "lower_bound_transform", [&] {
      lower_bound_forward_cpu(lv.data<scalar_t>(), probs.data<scalar_t>(), gamma.data<scalar_t>(), layers, width);
    });
  }
  Var out = op_output(tape, gamma, {lower_bounds});
  if (!out->requires_grad) return out;
  tape.record([lower_bounds, out, probs, layers, width] {
    if (!out->grad.defined()) return;
    if (out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      HGRN_CHECK(out->grad.dtype() == DType::F32, "lower_bound_transform backward: the gradient of gamma is ",
                 dtype_name(out->grad.dtype()), ", expected fp32");
      cuda_lower_bound_backward(probs.data<float>(), out->grad.data<float>(),
                                grad_buffer(lower_bounds).data<float>(), layers, width);
      return;
#else
      throw Error("lower_bound_transform: this hgrn was built without CUDA");
#endif
    }
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "lower_bound_transform backward", [&] {
      lower_bound_backward_cpu(probs.data<scalar_t>(), out->grad.data<scalar_t>(),
                               grad_buffer(lower_bounds).data<scalar_t>(), layers, width);
    });
  });
  return out;
}

// ---- forget gate ----------------------------------------------------------------------------------------------

// One row of the forget gate without a bound: log σ(f̂).
template <typename T>
HGRN_VECTOR_CLONES static void forget_gate_forward_row(const T* fr, T* gr, int64_t width) {
  for (int64_t c = 0; c < width; ++c) gr[c] = log_sigmoid_pair(fr[c]).of_x;
}

// One row with a bound: every element takes both forms and the bound-free one (γ = 0), then selects (no branch: the
// loop vectorises).
template <typename T>
HGRN_VECTOR_CLONES static void bounded_forget_gate_forward_row(const T* fr, const T* gamma_row, const T* log_gamma,
                                                               const T* log_one_minus_gamma, T* gr, int64_t width) {
  for (int64_t c = 0; c < width; ++c) {
    const T x = fr[c], gamma = gamma_row[c], log_gm = log_gamma[c], log_1m_gm = log_one_minus_gamma[c];
    const T tail = cpu_exp(-std::abs(x));  // σ(x), σ(−x) and log σ(x) all follow from e^−|x| without overflow
    const T log_sig = min_zero(x) - cpu_log1p(tail);
    const T sigmoid_neg = (x >= 0 ? tail : T(1)) / (T(1) + tail);  // σ(−f̂), to relative precision
    const T u = (T(1) - gamma) * sigmoid_neg;                        // 1 − λ
    const T near_one = cpu_log1p(-u), far = log_add_exp(log_gm, log_1m_gm + log_sig);
    const T bounded = u < T(0.5) ? (near_one < log_gm ? log_gm : near_one) : far;  // std::max(near_one, log γ)
    gr[c] = gamma != T(0) ? bounded : log_sig;
  }
}

template <typename T>
static void forget_gate_forward_cpu(const T* f_hat, const T* gamma_row, T* g, int64_t rows, int64_t width) {
  std::vector<T> log_gamma, log_one_minus_gamma;
  if (gamma_row) {
    log_one_minus_gamma = log_one_minus(gamma_row, width);
    log_gamma.resize(static_cast<size_t>(width));
    for (int64_t c = 0; c < width; ++c) log_gamma[static_cast<size_t>(c)] = std::log(gamma_row[c]);
  }
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    if (gamma_row)
      bounded_forget_gate_forward_row(f_hat + r * width, gamma_row, log_gamma.data(), log_one_minus_gamma.data(),
                                      g + r * width, width);
    else
      forget_gate_forward_row(f_hat + r * width, g + r * width, width);
  }
}

// One row of forget_gate_backward_cpu (the arguments offset to that row) with a bound, for one combination of the
// gradients wanted (a loop without branches).
template <bool kWithDf, bool kWithDgamma, typename T>
HGRN_VECTOR_CLONES static void bounded_forget_gate_backward_row(const T* fr, const T* log_one_minus_gamma, const T* gr,
                                                                const T* dgr, T* dfr, T* dgamma_block, int64_t width) {
  for (int64_t c = 0; c < width; ++c) {
    const LogSigmoidPair<T> ls = log_sigmoid_pair(fr[c]);
    if constexpr (kWithDf) {
      const T log_scaled_sigmoid = log_one_minus_gamma[c] + ls.of_x;  // log((1 − γ)·σ(f̂))
      dfr[c] += dgr[c] * cpu_exp(log_scaled_sigmoid - gr[c] + ls.of_minus_x);
    }
    if constexpr (kWithDgamma) dgamma_block[c] += dgr[c] * cpu_exp(ls.of_minus_x - gr[c]);
  }
}

// The same without a bound: ∂g/∂f̂ = σ(−f̂).
template <typename T>
HGRN_VECTOR_CLONES static void forget_gate_backward_row(const T* fr, const T* dgr, T* dfr, int64_t width) {
  for (int64_t c = 0; c < width; ++c) dfr[c] += dgr[c] * cpu_exp(log_sigmoid_pair(fr[c]).of_minus_x);
}

// df_hat (may be null) and dgamma_row (may be null; null also when there is no bound) are accumulated into. γ's
// gradient is a sum over rows, taken in fixed row blocks so that its bits do not depend on the thread count.
template <typename T>
static void forget_gate_backward_cpu(const T* f_hat, const T* gamma_row, const T* g, const T* dg, T* df_hat,
                                     T* dgamma_row, int64_t rows, int64_t width) {
  const std::vector<T> log_one_minus_gamma = gamma_row ? log_one_minus(gamma_row, width) : std::vector<T>();
  const T* log_1m_gm = log_one_minus_gamma.data();
  reduce_rows_in_fixed_blocks(rows, width, dgamma_row, [&](int64_t r, T* dgamma_block) {
    const T *fr = f_hat + r * width, *gr = g + r * width, *dgr = dg + r * width;
    T* dfr = df_hat ? df_hat + r * width : nullptr;
    if (!gamma_row) {
      if (dfr) forget_gate_backward_row(fr, dgr, dfr, width);
    } else if (dfr && dgamma_block) {
      bounded_forget_gate_backward_row<true, true>(fr, log_1m_gm, gr, dgr, dfr, dgamma_block, width);
    } else if (dfr) {
      bounded_forget_gate_backward_row<true, false>(fr, log_1m_gm, gr, dgr, dfr, dgamma_block, width);
    } else if (dgamma_block) {
      bounded_forget_gate_backward_row<false, true>(fr, log_1m_gm, gr, dgr, dfr, dgamma_block, width);
    }
  });
}

void check_lower_bounds_for_step(const char* op, const Tensor& gamma, int64_t layer, int64_t width, Device device,
                                 DType dtype) {
  HGRN_CHECK(layer >= 0, op, ": layer must be non-negative, got ", layer);
  if (!gamma.defined()) return;
  HGRN_CHECK(gamma.dim() == 2 && gamma.size(1) == width && layer < gamma.size(0) && gamma.is_contiguous() &&
                 gamma.device() == device && gamma.dtype() == dtype,
             op, ": gamma must be a contiguous ", dtype_name(dtype), " [L > ", layer, ", ", width, "], got ",
             dtype_name(gamma.dtype()), " ", shape_str(gamma.shape()));
}

// Checks f̂ and γ for layer `layer`'s forget gate (`op` names the caller in messages) and returns whether the gate is
// bounded (γ given and layer > 0). On the CPU a bounded gate's γ row is range-checked and returned in *gamma_row.
static bool check_forget_gate_args(const char* op, const Var& f_hat, const Var& gamma, int64_t layer,
                                   Tensor* gamma_row) {
  HGRN_CHECK(f_hat, op, ": f_hat is null");
  const Tensor& fv = f_hat->value;
  HGRN_CHECK(fv.dim() >= 1 && fv.size(-1) > 0, op, ": f_hat must have a non-empty last axis, got ",
             shape_str(fv.shape()));
  const bool on_gpu = fv.device() == Device::CUDA;
  HGRN_CHECK(on_gpu ? fv.is_row_strided() : fv.is_contiguous(), op,
             ": f_hat must be contiguous (on the GPU, row-strided)");
  HGRN_CHECK(layer >= 0, op, ": layer must be non-negative, got ", layer);
  const int64_t width = fv.size(-1);
  const bool bounded = gamma && layer > 0;
  if (!gamma) return false;
  const Tensor& gv = gamma->value;
  HGRN_CHECK(gv.dim() == 2 && gv.size(1) == width, op, ": gamma ", shape_str(gv.shape()), " does not match f_hat ",
             shape_str(fv.shape()), " (expected [L, ", width, "])");
  HGRN_CHECK(layer < gv.size(0), op, ": layer ", layer, " out of range for gamma with ", gv.size(0), " layers");
  HGRN_CHECK(gv.device() == fv.device() && gv.is_contiguous(), op, ": gamma must be a contiguous ",
             device_name(fv.device()), " tensor like f_hat");
  // The GPU keeps γ in fp32 under bf16 activations (spec 1.3); the CPU computes in one dtype throughout.
  const DType want = on_gpu ? DType::F32 : fv.dtype();
  HGRN_CHECK(gv.dtype() == want, op, ": f_hat is ", dtype_name(fv.dtype()), " on ", device_name(fv.device()),
             ", gamma is ", dtype_name(gv.dtype()), " (expected ", dtype_name(want), ")");
  // On the GPU the range check would cost a device-to-host copy per layer and step; there γ comes from
  // lower_bound_transform, which cannot leave [0, 1].
  if (bounded && !on_gpu) {
    *gamma_row = gv.select_row(layer);
    for (int64_t c = 0; c < width; ++c) {
      const double value = gamma_row->item(c);
      // NaN passes: it comes from non-finite weights, which the trainer meets as a non-finite loss and handles.
      HGRN_CHECK(std::isnan(value) || (value >= 0 && value <= 1), op, ": gamma[", layer, ", ", c, "] = ", value, " is outside [0, 1]");
    }
  }
  return bounded;
}

// The GPU path of hgrn2_forget_gate (q_hat null, with_k false) and of hgrn2_gates: one fused kernel each way.
static Hgrn2Gates gates_on_gpu(Tape& tape, const Var& q_hat, const Var& f_hat, const Var& gamma, int64_t layer,
                               bool bounded, bool with_k) {
#ifdef HGRN_WITH_CUDA
  const Tensor& fv = f_hat->value;
  const int64_t width = fv.size(-1), rows = fv.numel() / width;
  const float* gamma_row = bounded ? gamma->value.data<float>() + layer * width : nullptr;
  Tensor q, g = Tensor::empty(fv.shape(), DType::F32, Device::CUDA), k;
  if (q_hat) q = Tensor::empty(fv.shape(), fv.dtype(), Device::CUDA);
  if (with_k) k = Tensor::empty(fv.shape(), fv.dtype(), Device::CUDA);
  cuda_hgrn2_gates_forward(q_hat ? q_hat->value.raw_data() : nullptr, fv.raw_data(), fv.dtype(), gamma_row,
                           q_hat ? q.raw_data() : nullptr, g.data<float>(), with_k ? k.raw_data() : nullptr, rows,
                           width, q_hat ? q_hat->value.row_stride() : 0, fv.row_stride());
  // Only the bounded gate depends on gamma; leaving it out otherwise keeps layer 0 off gamma's gradient entirely.
  Hgrn2Gates out;
  const auto gate_output = [&](const Tensor& t) {
    return bounded ? op_output(tape, t, {f_hat, gamma}) : op_output(tape, t, {f_hat});
  };
  out.g = gate_output(g);
  if (with_k) out.k = gate_output(k);
  if (q_hat) out.q = op_output(tape, q, {q_hat});
  if (q_hat && with_k)
    out.origin = std::make_shared<const Hgrn2GatesOrigin>(
        Hgrn2GatesOrigin{q_hat, f_hat, gamma, layer, bounded, out.q, out.g, out.k});
  if (!out.g->requires_grad && !(out.q && out.q->requires_grad)) return out;
  tape.record([q_hat, f_hat, gamma, bounded, layer, rows, width, q = out.q, g = out.g, k = out.k] {
    const bool dq_in = q && q->grad.defined(), dg_in = g->grad.defined(), dk_in = k && k->grad.defined();
    Hgrn2GatesBackwardArgs a;
    a.f_hat = f_hat->value.raw_data();
    a.f_hat_stride = f_hat->value.row_stride();
    a.dtype = f_hat->value.dtype();
    a.rows = rows;
    a.width = width;
    Tensor workspace;
    if (dg_in || dk_in) {
      HGRN_CHECK(!dg_in || g->grad.dtype() == DType::F32, "hgrn2 gates backward: the gradient of g is ",
                 dtype_name(g->grad.dtype()), ", expected fp32");
      a.dg = dg_in ? g->grad.data<float>() : nullptr;
      a.dk = dk_in ? k->grad.raw_data() : nullptr;
      a.gamma_row = bounded ? gamma->value.data<float>() + layer * width : nullptr;
      if (bounded && wants_grad(gamma)) {
        a.dgamma_row = grad_buffer(gamma).data<float>() + layer * width;  // each layer adds its row of [L, D]
        workspace = Tensor::empty({cuda_hgrn2_gates_backward_workspace(rows, width)}, DType::F32, Device::CUDA);
        a.workspace = workspace.data<float>();
      }
      // Overwritten when this is the first gradient to reach f̂ (no zero fill); asked for before q̂'s, the order
      // the kernel writes them in. Row-strided for a column block of a split: its place in the split's gradient.
      if (wants_grad(f_hat)) {
        const Tensor& df_hat = grad_buffer_for_write(f_hat, &a.add_df, GradLayout::RowStrided);
        a.df_hat = df_hat.raw_data();
        a.df_hat_stride = df_hat.row_stride();
      }
    }
    if (dq_in && wants_grad(q_hat)) {
      a.q_hat = q_hat->value.raw_data();
      a.q_hat_stride = q_hat->value.row_stride();
      a.dq = q->grad.raw_data();
      const Tensor& dq_hat = grad_buffer_for_write(q_hat, &a.add_dq, GradLayout::RowStrided);
      a.dq_hat = dq_hat.raw_data();
      a.dq_hat_stride = dq_hat.row_stride();
    }
    cuda_hgrn2_gates_backward(a);
  });
  return out;
#else
  (void)tape, (void)q_hat, (void)f_hat, (void)gamma, (void)layer, (void)bounded, (void)with_k;
  throw Error("hgrn2 gates: this hgrn was built without CUDA");
#endif
}

Var hgrn2_forget_gate(Tape& tape, const Var& f_hat, const Var& gamma, int64_t layer) {
  Tensor gamma_row;
  const bool bounded = check_forget_gate_args("hgrn2_forget_gate", f_hat, gamma, layer, &gamma_row);
  const Tensor& fv = f_hat->value;
  if (fv.device() == Device::CUDA) return gates_on_gpu(tape, nullptr, f_hat, gamma, layer, bounded, false).g;

  const int64_t width = fv.size(-1), rows = fv.numel() / width;
  Tensor g = Tensor::empty(fv.shape(), fv.dtype());
  HGRN_DISPATCH_FLOAT(fv.dtype(), "hgrn2_forget_gate", [&] {
    forget_gate_forward_cpu(fv.data<scalar_t>(), bounded ? gamma_row.data<scalar_t>() : nullptr, g.data<scalar_t>(),
                            rows, width);
  });
  // Only the bounded gate depends on gamma; leaving it out otherwise keeps layer 0 off gamma's gradient entirely.
  Var out = bounded ? op_output(tape, g, {f_hat, gamma}) : op_output(tape, g, {f_hat});
  if (!out->requires_grad) return out;
  tape.record([f_hat, gamma, bounded, layer, out, rows, width] {
    if (!out->grad.defined()) return;
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "hgrn2_forget_gate backward", [&] {
      const scalar_t* gamma_row = bounded ? gamma->value.data<scalar_t>() + layer * width : nullptr;
      scalar_t* dgamma_row =
          bounded && wants_grad(gamma) ? grad_buffer(gamma).data<scalar_t>() + layer * width : nullptr;
      forget_gate_backward_cpu(f_hat->value.data<scalar_t>(), gamma_row, out->value.data<scalar_t>(),
                               out->grad.data<scalar_t>(),
                               wants_grad(f_hat) ? grad_buffer(f_hat).data<scalar_t>() : nullptr, dgamma_row, rows,
                               width);
    });
  });
  return out;
}

// ---- input gate -----------------------------------------------------------------------------------------------

template <typename T>
HGRN_VECTOR_CLONES static void input_gate_forward_cpu(const T* g, T* k, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) k[i] = -cpu_expm1(g[i]);
}

template <typename T>
HGRN_VECTOR_CLONES static void input_gate_backward_cpu(const T* g, const T* dk, T* dg, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; ++i) dg[i] -= cpu_exp(g[i]) * dk[i];
}

Var input_gate_from_forget(Tape& tape, const Var& g) {
  HGRN_CHECK(g, "input_gate_from_forget: g is null");
  return input_gate_from_forget(tape, g, g->value.dtype());
}

Var input_gate_from_forget(Tape& tape, const Var& g, DType out_dtype) {
  HGRN_CHECK(g, "input_gate_from_forget: g is null");
  const Tensor& gv = g->value;
  HGRN_CHECK(gv.is_contiguous(), "input_gate_from_forget: g must be contiguous");
  const bool on_gpu = gv.device() == Device::CUDA;
  HGRN_CHECK(on_gpu || out_dtype == gv.dtype(), "input_gate_from_forget: on the CPU k has g's dtype (",
             dtype_name(gv.dtype()), "), asked for ", dtype_name(out_dtype));
  const int64_t n = gv.numel();
  Tensor k = Tensor::empty(gv.shape(), out_dtype, gv.device());
  if (on_gpu) {
#ifdef HGRN_WITH_CUDA
    cuda_input_gate_forward(gv.raw_data(), gv.dtype(), k.raw_data(), out_dtype, n);
#else
    throw Error("input_gate_from_forget: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(k.dtype(), "input_gate_from_forget",
                        [&] { input_gate_forward_cpu(gv.data<scalar_t>(), k.data<scalar_t>(), n); });
  }
  Var out = op_output(tape, k, {g});
  if (!out->requires_grad) return out;
  tape.record([g, out, n] {
    if (!out->grad.defined()) return;
    if (out->grad.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      bool add_dg = false;
      void* dg = grad_buffer_for_write(g, &add_dg).raw_data();  // overwritten when this is the first to reach it
      cuda_input_gate_backward(g->value.raw_data(), g->value.dtype(), out->grad.raw_data(), out->grad.dtype(), dg,
                               add_dg, n);
      return;
#else
      throw Error("input_gate_from_forget: this hgrn was built without CUDA");
#endif
    }
    HGRN_DISPATCH_FLOAT(out->grad.dtype(), "input_gate_from_forget backward", [&] {
      input_gate_backward_cpu(g->value.data<scalar_t>(), out->grad.data<scalar_t>(), grad_buffer(g).data<scalar_t>(),
                              n);
    });
  });
  return out;
}

// ---- a layer's gates together -----------------------------------------------------------------------------------

Hgrn2Gates hgrn2_gates(Tape& tape, const Var& q_hat_in, const Var& f_hat_in, const Var& gamma, int64_t layer) {
  HGRN_CHECK(q_hat_in && f_hat_in, "hgrn2_gates: q_hat or f_hat is null");
  // q̂ and f̂ may be row-strided (column blocks of the fused q/f/i projection: linear_columns).
  const Var q_hat = contiguous_on_cpu(tape, q_hat_in), f_hat = contiguous_on_cpu(tape, f_hat_in);
  Tensor gamma_row;
  const bool bounded = check_forget_gate_args("hgrn2_gates", f_hat, gamma, layer, &gamma_row);
  const Tensor &qv = q_hat->value, &fv = f_hat->value;
  HGRN_CHECK(qv.shape() == fv.shape() && qv.dtype() == fv.dtype() && qv.device() == fv.device() &&
                 qv.is_row_strided(),
             "hgrn2_gates: q_hat (", shape_str(qv.shape()), " ", dtype_name(qv.dtype()), " on ",
             device_name(qv.device()), ") must be a tensor like f_hat (", shape_str(fv.shape()), " ",
             dtype_name(fv.dtype()), " on ", device_name(fv.device()), ")");
  if (fv.device() == Device::CUDA) return gates_on_gpu(tape, q_hat, f_hat, gamma, layer, bounded, true);
  // The CPU reference is the three ops above, recorded in the order the model recorded them before this op.
  Hgrn2Gates out;
  out.g = hgrn2_forget_gate(tape, f_hat, gamma, layer);
  out.q = silu(tape, q_hat);
  out.k = input_gate_from_forget(tape, out.g);
  return out;
}

}  // namespace hgrn
