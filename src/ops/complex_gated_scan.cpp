// complex_gated_scan.cpp: h_t = e^{g_t} e^{iθ} h_{t−1} + x_t (complex h and x) on the CPU, in two exact forms, each
// with a hand-written backward; w_t = e^{g_t} e^{iθ} is the step's complex factor:
//  * Sequential: step by step; the backward recomputes h and runs δ_t = do_t + conj(w_{t+1}) δ_{t+1} in reverse time
//    (δ = dL/dRe h + i·dL/dIm h: multiplying by w has the adjoint multiplying by conj(w)).
//  * Chunk: every chunk scanned from zero (chunk 0 from h_{−1}) with its cumulative log decay G_t = Σ_{s=start..t} g_s,
//    then, chunk by chunk, h_t += e^{G_t} e^{i(t−start+1)θ} h_{start−1}. The backward mirrors it: reverse scans from
//    zero within the chunks, then, chunks in reverse, δ_t += e^{D_t} e^{−i(end−1−t)θ} β with D_t = Σ_{s=t+1..end−1} g_s
//    and β the gradient of the chunk's last state from outside it (conj(w) δ of the next chunk's first row; the final
//    state's gradient for the last chunk).
// Both backwards form dx_t = δ_t, and with p_t = w_t h_{t−1} (∂h_t/∂g_t = p_t, ∂h_t/∂θ = i·p_t):
// dg_t = Re(conj(δ_t) p_t), dθ = Σ_{b,t} Re(conj(δ_t) i p_t), dL/dh_{−1} = conj(w_0) δ_0.
// Resets (ops/sequence_resets.h): a reset step's factor w_t is taken as 0 (h_{t−1} does not reach h_t, p_t = 0, so
// dg_t = 0 and it adds nothing to dθ, and no gradient flows back past it); the chunk form's carries reach only the
// rows before a chunk's first reset (forward) or from its last reset on (backward).
// Work is split over OpenMP threads by (batch, block of 64 channels), each block by the same sequential code; dθ is
// summed over the batch after the parallel region, in batch order, so results do not depend on the thread count.
// On the GPU: kernels/complex_gated_scan.h (a chunked scan in 64-step chunks whatever the mode).
#include "ops/complex_gated_scan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu_parallel.h"
#include "ops/elementwise.h"
#include "ops/scan_tasks.h"
#include "ops/sequence_resets.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/complex_gated_scan.h"
#endif

namespace hgrn {
namespace {

using scan_tasks::kChannelBlock;
using scan_tasks::kDefaultChunk;
using Dims = scan_tasks::Dims;

// The global tensors of one call, contiguous: x_re, x_im, g [B, T, C]; theta [C]; output [B, T, 2C]; states
// [B, 2, C]. Null gradient pointers: not wanted; null d_output / d_final_state: zero; null initial_state: h_{−1} = 0.
// d_theta_rows: [B, C], each batch's share of dθ.
template <typename T>
struct Io {
  const T* x_re = nullptr;
  const T* x_im = nullptr;
  const T* g = nullptr;
  const T* theta = nullptr;
  const T* initial_state = nullptr;
  T* output = nullptr;
  T* final_state = nullptr;
  const T* d_output = nullptr;
  const T* d_final_state = nullptr;
  T* dx_re = nullptr;
  T* dx_im = nullptr;
  T* dg = nullptr;
  T* d_theta_rows = nullptr;
  T* d_initial_state = nullptr;
  const int32_t* resets = nullptr;  // [B, T]; null: none
};

// One task: channels [c0, c0 + width) of batch b.
struct Block {
  int64_t b, c0, width, time, channels;
  int64_t at(int64_t t) const { return (b * time + t) * channels + c0; }           // in x, g
  int64_t out_at(int64_t t) const { return (b * time + t) * 2 * channels + c0; }   // Re in output; Im at + C
  int64_t state_at() const { return b * 2 * channels + c0; }                       // Re in a state; Im at + C
};

// The block's sequence's reset flags.
template <typename T>
SequenceResets resets_of(const Io<T>& io, const Block& k) {
  return {io.resets ? io.resets + k.b * k.time : nullptr};
}

// e^{g} of row t's decay, or 0 at a reset.
template <typename T>
T step_decay(const Io<T>& io, const Block& k, int64_t t, T g) {
  return resets_of(io, k).at(t) ? T(0) : std::exp(g);
}

// Per-thread scratch, reused across the thread's tasks.
template <typename T>
struct Scratch {
  std::vector<T> hr, hi;    // [T][width]: the backward's recomputed h_t
  std::vector<T> dr, di;    // [T][width]: δ_t
  std::vector<T> decays;    // [T][width]: the chunk form's cumulative log decays
  std::vector<T> cos_theta, sin_theta, run_r, run_i;  // [width]
  explicit Scratch(const Dims& d) {
    const size_t n = static_cast<size_t>(d.time * kChannelBlock), w = static_cast<size_t>(kChannelBlock);
    for (std::vector<T>* v : {&hr, &hi, &dr, &di, &decays}) v->resize(n);
    for (std::vector<T>* v : {&cos_theta, &sin_theta, &run_r, &run_i}) v->resize(w);
  }
  void load_theta(const Io<T>& io, const Block& k) {
    for (int64_t j = 0; j < k.width; ++j) {
      cos_theta[j] = std::cos(io.theta[k.c0 + j]);
      sin_theta[j] = std::sin(io.theta[k.c0 + j]);
    }
  }
};

// A state of the block (zeros for a null pointer) into (re, im).
template <typename T>
void load_state(const T* state, const Block& k, T* re, T* im) {
  for (int64_t j = 0; j < k.width; ++j) {
    re[j] = state ? state[k.state_at() + j] : T(0);
    im[j] = state ? state[k.state_at() + k.channels + j] : T(0);
  }
}

// running ← e^{g} e^{iθ} running + x for one step of the block.
template <typename T>
void step(const Io<T>& io, const Block& k, const Scratch<T>& s, int64_t t, T* rr, T* ri) {
  const T* xr = io.x_re + k.at(t);
  const T* xi = io.x_im + k.at(t);
  const T* g = io.g + k.at(t);
  for (int64_t j = 0; j < k.width; ++j) {
    const T a = step_decay(io, k, t, g[j]), c = s.cos_theta[j], sn = s.sin_theta[j];
    const T r = a * (c * rr[j] - sn * ri[j]) + xr[j];
    ri[j] = a * (sn * rr[j] + c * ri[j]) + xi[j];
    rr[j] = r;
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Forward: the block's h_t into (hr, hi), rows `stride` apart.

template <typename T>
void sequential_forward(const Io<T>& io, const Block& k, Scratch<T>& s, T* hr, T* hi, int64_t stride) {
  T *rr = s.run_r.data(), *ri = s.run_i.data();
  load_state(io.initial_state, k, rr, ri);
  for (int64_t t = 0; t < k.time; ++t) {
    step(io, k, s, t, rr, ri);
    std::copy_n(rr, k.width, hr + t * stride);
    std::copy_n(ri, k.width, hi + t * stride);
  }
}

template <typename T>
void chunk_forward(const Io<T>& io, const Block& k, int64_t chunk, Scratch<T>& s, T* hr, T* hi, int64_t stride) {
  const int64_t W = k.width;
  T *rr = s.run_r.data(), *ri = s.run_i.data(), *decays = s.decays.data();
  for (int64_t start = 0; start < k.time; start += chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    load_state(start == 0 ? io.initial_state : nullptr, k, rr, ri);
    for (int64_t t = start; t < end; ++t) {
      step(io, k, s, t, rr, ri);
      std::copy_n(rr, W, hr + t * stride);
      std::copy_n(ri, W, hi + t * stride);
      const T* g = io.g + k.at(t);
      T* G = decays + t * W;
      for (int64_t j = 0; j < W; ++j) G[j] = (t == start ? T(0) : G[j - W]) + g[j];
    }
  }
  const SequenceResets resets = resets_of(io, k);
  for (int64_t start = chunk; start < k.time; start += chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    const T* carry_r = hr + (start - 1) * stride;  // the previous chunk's last state, already final
    const T* carry_i = hi + (start - 1) * stride;
    for (int64_t t = start, first_reset = resets.first_in(start, end); t < first_reset; ++t) {
      const T n = static_cast<T>(t - start + 1);
      const T* G = decays + t * W;
      T* out_r = hr + t * stride;
      T* out_i = hi + t * stride;
      for (int64_t j = 0; j < W; ++j) {
        const T e = std::exp(G[j]), angle = n * io.theta[k.c0 + j];
        const T c = e * std::cos(angle), sn = e * std::sin(angle);
        out_r[j] += c * carry_r[j] - sn * carry_i[j];
        out_i[j] += sn * carry_r[j] + c * carry_i[j];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward: the block's δ_t into s.dr, s.di ([T][width]); leaves conj(w_0) δ_0 (dL/dh_{−1}) in s.run_r, s.run_i.

template <typename T>
T d_output_at(const Io<T>& io, const Block& k, int64_t t, int64_t j) {
  return io.d_output ? io.d_output[k.out_at(t) + j] : T(0);
}

// β ← conj(w_t) δ_t for row t of the block.
template <typename T>
void step_back(const Io<T>& io, const Block& k, const Scratch<T>& s, int64_t t, const T* dr, const T* di, T* br,
               T* bi) {
  const T* g = io.g + k.at(t);
  for (int64_t j = 0; j < k.width; ++j) {
    const T a = step_decay(io, k, t, g[j]), c = s.cos_theta[j], sn = s.sin_theta[j];
    br[j] = a * (c * dr[j] + sn * di[j]);
    bi[j] = a * (c * di[j] - sn * dr[j]);
  }
}

template <typename T>
void sequential_backward(const Io<T>& io, const Block& k, Scratch<T>& s) {
  const int64_t W = k.width;
  T *br = s.run_r.data(), *bi = s.run_i.data();
  load_state(io.d_final_state, k, br, bi);  // at t = T − 1, β is the final state's gradient
  for (int64_t t = k.time - 1; t >= 0; --t) {
    T* dr = s.dr.data() + t * W;
    T* di = s.di.data() + t * W;
    for (int64_t j = 0; j < W; ++j) {
      dr[j] = d_output_at(io, k, t, j) + br[j];
      di[j] = d_output_at(io, k, t, j + k.channels) + bi[j];
    }
    step_back(io, k, s, t, dr, di, br, bi);
  }
}

template <typename T>
void chunk_backward(const Io<T>& io, const Block& k, int64_t chunk, Scratch<T>& s) {
  const int64_t W = k.width;
  T *br = s.run_r.data(), *bi = s.run_i.data(), *decays = s.decays.data();
  for (int64_t start = 0; start < k.time; start += chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    std::fill_n(br, W, T(0));
    std::fill_n(bi, W, T(0));
    for (int64_t t = end - 1; t >= start; --t) {
      T* dr = s.dr.data() + t * W;
      T* di = s.di.data() + t * W;
      T* D = decays + t * W;
      for (int64_t j = 0; j < W; ++j) {
        dr[j] = d_output_at(io, k, t, j) + br[j];
        di[j] = d_output_at(io, k, t, j + k.channels) + bi[j];
        D[j] = t == end - 1 ? T(0) : D[j + W] + io.g[k.at(t + 1) + j];
      }
      step_back(io, k, s, t, dr, di, br, bi);
    }
  }
  load_state(io.d_final_state, k, br, bi);
  const SequenceResets resets = resets_of(io, k);
  for (int64_t start = (k.time - 1) / chunk * chunk; start >= 0; start -= chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    // β reaches the rows from the chunk's last reset on (all of them without one).
    for (int64_t t = std::max(start, resets.last_in(start, end)); t < end; ++t) {
      const T m = static_cast<T>(end - 1 - t);
      const T* D = decays + t * W;
      T* dr = s.dr.data() + t * W;
      T* di = s.di.data() + t * W;
      for (int64_t j = 0; j < W; ++j) {
        const T e = std::exp(D[j]), angle = m * io.theta[k.c0 + j];
        const T c = e * std::cos(angle), sn = e * std::sin(angle);
        dr[j] += c * br[j] + sn * bi[j];
        di[j] += c * bi[j] - sn * br[j];
      }
    }
    step_back(io, k, s, start, s.dr.data() + start * W, s.di.data() + start * W, br, bi);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Drivers: one OpenMP iteration per (batch, channel block).

using Plan = scan_tasks::Plan<Block>;

template <typename T>
void run_forward(const Io<T>& io, const Plan& plan, const Block& k, Scratch<T>& s, T* hr, T* hi, int64_t stride) {
  if (plan.mode == ScanMode::Sequential)
    sequential_forward(io, k, s, hr, hi, stride);
  else
    chunk_forward(io, k, plan.chunk, s, hr, hi, stride);
}

template <typename T>
void forward_cpu(const Io<T>& io, const Plan& plan) {
  const Dims& d = plan.dims;
#pragma omp parallel if (plan.parallel())
  {
    Scratch<T> s(d);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.tasks(); ++task) {
      const Block k = plan.block(task);
      s.load_theta(io, k);
      T* hr = io.output + k.out_at(0);  // written in place: rows 2C apart
      T* hi = hr + d.channels;
      run_forward(io, plan, k, s, hr, hi, 2 * d.channels);
      const int64_t last = (d.time - 1) * 2 * d.channels;
      std::copy_n(hr + last, k.width, io.final_state + k.state_at());
      std::copy_n(hi + last, k.width, io.final_state + k.state_at() + d.channels);
    }
  }
}

template <typename T>
void backward_cpu(const Io<T>& io, const Plan& plan) {
  const Dims& d = plan.dims;
#pragma omp parallel if (plan.parallel())
  {
    Scratch<T> s(d);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.tasks(); ++task) {
      const Block k = plan.block(task);
      const int64_t W = k.width;
      s.load_theta(io, k);
      // h_{t−1} for dg and dθ: the forward recomputed by the same form.
      const bool need_states = io.dg || io.d_theta_rows;
      if (need_states) run_forward(io, plan, k, s, s.hr.data(), s.hi.data(), W);
      if (plan.mode == ScanMode::Sequential)
        sequential_backward(io, k, s);
      else
        chunk_backward(io, k, plan.chunk, s);
      for (int64_t t = 0; t < d.time; ++t) {
        const T* dr = s.dr.data() + t * W;
        const T* di = s.di.data() + t * W;
        if (io.dx_re)
          for (int64_t j = 0; j < W; ++j) io.dx_re[k.at(t) + j] += dr[j];
        if (io.dx_im)
          for (int64_t j = 0; j < W; ++j) io.dx_im[k.at(t) + j] += di[j];
        if (!need_states) continue;
        const T* g = io.g + k.at(t);
        for (int64_t j = 0; j < W; ++j) {
          T pr, pi;  // h_{t−1}, then p_t = w_t h_{t−1}
          if (t > 0) {
            pr = s.hr[(t - 1) * W + j];
            pi = s.hi[(t - 1) * W + j];
          } else {
            pr = io.initial_state ? io.initial_state[k.state_at() + j] : T(0);
            pi = io.initial_state ? io.initial_state[k.state_at() + d.channels + j] : T(0);
          }
          const T a = step_decay(io, k, t, g[j]), c = s.cos_theta[j], sn = s.sin_theta[j];
          const T qr = a * (c * pr - sn * pi), qi = a * (sn * pr + c * pi);
          if (io.dg) io.dg[k.at(t) + j] += dr[j] * qr + di[j] * qi;
          if (io.d_theta_rows) io.d_theta_rows[k.b * d.channels + k.c0 + j] += di[j] * qr - dr[j] * qi;
        }
      }
      if (io.d_initial_state)
        for (int64_t j = 0; j < W; ++j) {
          io.d_initial_state[k.state_at() + j] += s.run_r[j];
          io.d_initial_state[k.state_at() + d.channels + j] += s.run_i[j];
        }
    }
  }
}

#ifdef HGRN_WITH_CUDA
GatedScanCudaShape cuda_shape(const Dims& d) {
  GatedScanCudaShape s;
  s.batch = d.batch;
  s.time = d.time;
  s.channels = d.channels;
  return s;
}

// A fp32 GPU buffer of n floats (undefined when n is 0: T <= 64 needs no per-chunk buffers).
Tensor gpu_floats(int64_t n) { return n > 0 ? Tensor::empty({n}, DType::F32, Device::CUDA) : Tensor(); }
float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
const uint64_t* masks_or_null(const Tensor& t) {
  return t.defined() ? reinterpret_cast<const uint64_t*>(t.data<int64_t>()) : nullptr;
}

void forward_cuda(const Var& x_re, const Var& x_im, const Var& g, const Var& theta, const Var& initial_state,
                  const Dims& dims, const Tensor& reset_masks, Tensor& output, Tensor& final_state,
                  Tensor& chunk_states) {
  chunk_states = gpu_floats(complex_gated_scan_cuda_chunk_elements(cuda_shape(dims)));  // kept for the backward
  const Tensor scratch = gpu_floats(complex_gated_scan_cuda_chunk_elements(cuda_shape(dims)));
  ComplexScanCudaForwardArgs a;
  a.x_re = x_re->value.raw_data();
  a.x_im = x_im->value.raw_data();
  a.act = x_re->value.dtype();
  a.g = g->value.data<float>();
  a.theta = theta->value.data<float>();
  a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
  a.output = output.raw_data();
  a.final_state = final_state.data<float>();
  a.chunk_states = data_or_null(chunk_states);
  a.scratch = data_or_null(scratch);
  a.reset_masks = masks_or_null(reset_masks);
  complex_gated_scan_cuda_forward(cuda_shape(dims), a);
}

// The CUDA backward: gradients of both outputs (either may be absent) into the inputs that want one.
void backward_cuda(const Var& x_re, const Var& x_im, const Var& g, const Var& theta, const Var& initial_state,
                   const Var& out, const Var& final_out, const Tensor& chunk_states, const Tensor& reset_masks,
                   const Dims& dims) {
  if (out->grad.defined())
    HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
               "complex_gated_scan: the output's gradient must be contiguous ", dtype_name(out->value.dtype()),
               ", got ", dtype_name(out->grad.dtype()));
  if (final_out->grad.defined())
    HGRN_CHECK(final_out->grad.dtype() == DType::F32 && final_out->grad.is_contiguous(),
               "complex_gated_scan: the final state's gradient must be contiguous fp32");
  const GatedScanCudaShape shape = cuda_shape(dims);
  const Tensor scratch_a = gpu_floats(complex_gated_scan_cuda_chunk_elements(shape));
  const Tensor scratch_b = gpu_floats(complex_gated_scan_cuda_chunk_elements(shape));
  ComplexScanCudaBackwardArgs a;
  a.x_re = x_re->value.raw_data();
  a.x_im = x_im->value.raw_data();
  a.act = x_re->value.dtype();
  a.g = g->value.data<float>();
  a.theta = theta->value.data<float>();
  a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
  a.chunk_states = data_or_null(chunk_states);
  a.reset_masks = masks_or_null(reset_masks);
  a.d_output = out->grad.defined() ? out->grad.raw_data() : nullptr;
  a.d_final_state = final_out->grad.defined() ? final_out->grad.data<float>() : nullptr;
  // Fresh gradients are written, existing ones added into; x_re's is asked for before x_im's, the order the kernel
  // writes them in, so that one Var passed as both gets the sum.
  if (wants_grad(x_re)) a.dx_re = grad_buffer_for_write(x_re, &a.accumulate_dx_re).raw_data();
  if (wants_grad(x_im)) a.dx_im = grad_buffer_for_write(x_im, &a.accumulate_dx_im).raw_data();
  if (wants_grad(g)) a.dg = grad_buffer_for_write(g, &a.accumulate_dg).data<float>();
  if (wants_grad(initial_state))
    a.d_initial_state = grad_buffer_for_write(initial_state, &a.accumulate_d_initial_state).data<float>();
  Tensor theta_rows;
  if (wants_grad(theta)) {
    a.d_theta = grad_buffer(theta).data<float>();  // a parameter's gradient: always accumulated
    theta_rows = gpu_floats(complex_gated_scan_cuda_theta_rows(shape));
    a.theta_rows = theta_rows.data<float>();
  }
  a.scratch_a = data_or_null(scratch_a);
  a.scratch_b = data_or_null(scratch_b);
  complex_gated_scan_cuda_backward(shape, a);
}
#endif

}  // namespace

ComplexGatedScanOutputs complex_gated_scan(Tape& tape, const Var& x_re_in, const Var& x_im_in, const Var& g_in,
                                           const Var& theta, const Var& initial_state, ScanMode mode,
                                           int64_t chunk_size, const Tensor& resets) {
  HGRN_CHECK(x_re_in && x_im_in && g_in && theta, "complex_gated_scan: x_re, x_im, g and theta are required");
  const Var x_re = contiguous(tape, x_re_in);
  const Var x_im = contiguous(tape, x_im_in);
  const Var g = contiguous(tape, g_in);
  const Tensor& xv = x_re->value;
  HGRN_CHECK(xv.dim() == 3, "complex_gated_scan: x_re must be [B, T, C], got ", shape_str(xv.shape()));
  const Dims dims{xv.size(0), xv.size(1), xv.size(2)};
  HGRN_CHECK(dims.batch > 0 && dims.time > 0 && dims.channels > 0, "complex_gated_scan: empty x_re ",
             shape_str(xv.shape()));
  for (const Var& v : {x_im, g})
    HGRN_CHECK(v->value.shape() == xv.shape(), "complex_gated_scan: ", v == g ? "g " : "x_im ",
               shape_str(v->value.shape()), " must match x_re ", shape_str(xv.shape()));
  HGRN_CHECK(theta->value.shape() == Shape{dims.channels}, "complex_gated_scan: theta must be [", dims.channels,
             "], got ", shape_str(theta->value.shape()));
  const Shape state_shape{dims.batch, 2, dims.channels};
  if (initial_state)
    HGRN_CHECK(initial_state->value.shape() == state_shape, "complex_gated_scan: initial_state must be ",
               shape_str(state_shape), ", got ", shape_str(initial_state->value.shape()));
  HGRN_CHECK(chunk_size >= 0, "complex_gated_scan: chunk_size must be >= 0 (0 = ", kDefaultChunk, "), got ",
             chunk_size);
  const DType dtype = xv.dtype();
  const Device device = xv.device();
  const bool on_cuda = device == Device::CUDA;
  check_resets(resets, dims.batch, dims.time, device, "complex_gated_scan");
  // GPU: x_re, x_im (and the output) in the activation dtype; g, theta and the states fp32. CPU: one dtype.
  const DType state_dtype = on_cuda ? DType::F32 : dtype;
  for (const Var& v : {x_im, g, theta, initial_state}) {
    if (!v) continue;
    HGRN_CHECK(v->value.device() == device, "complex_gated_scan: inputs mix ", device_name(device), " and ",
               device_name(v->value.device()));
    const DType want = v == x_im ? dtype : state_dtype;
    const char* name = v == x_im ? "x_im" : v == g ? "g" : v == theta ? "theta" : "initial_state";
    HGRN_CHECK(v->value.dtype() == want, "complex_gated_scan: ", name, " must be ", dtype_name(want), " here, got ",
               dtype_name(v->value.dtype()));
  }
  HGRN_CHECK(theta->value.is_contiguous() && (!initial_state || initial_state->value.is_contiguous()),
             "complex_gated_scan: theta and initial_state must be contiguous");
  const Plan plan{dims, mode, chunk_size > 0 ? chunk_size : kDefaultChunk};

  Tensor output = Tensor::empty({dims.batch, dims.time, 2 * dims.channels}, dtype, device);
  Tensor final_state = Tensor::empty(state_shape, state_dtype, device);
  Tensor chunk_states, reset_masks;  // the GPU's state entering each chunk and reset masks: kept for the backward
  if (on_cuda) {
#ifdef HGRN_WITH_CUDA
    reset_masks = reset_chunk_masks(resets);
    forward_cuda(x_re, x_im, g, theta, initial_state, dims, reset_masks, output, final_state, chunk_states);
#else
    throw Error("complex_gated_scan: this hgrn was built without CUDA");
#endif
  } else {
    HGRN_DISPATCH_FLOAT(dtype, "complex_gated_scan", [&] {
      Io<scalar_t> io;
      io.x_re = x_re->value.data<scalar_t>();
      io.x_im = x_im->value.data<scalar_t>();
      io.g = g->value.data<scalar_t>();
      io.theta = theta->value.data<scalar_t>();
      io.initial_state = initial_state ? initial_state->value.data<scalar_t>() : nullptr;
      io.output = output.data<scalar_t>();
      io.final_state = final_state.data<scalar_t>();
      io.resets = resets.defined() ? resets.data<int32_t>() : nullptr;
      forward_cpu(io, plan);
    });
  }

  ComplexGatedScanOutputs result{op_output(tape, output, {x_re, x_im, g, theta, initial_state}),
                                 op_output(tape, final_state, {x_re, x_im, g, theta, initial_state})};
  if (!result.output->requires_grad) return result;
  Var out = result.output, final_out = result.final_state;
  tape.record([x_re, x_im, g, theta, initial_state, out, final_out, chunk_states, reset_masks, resets, plan] {
    if (!out->grad.defined() && !final_out->grad.defined()) return;
    if (x_re->value.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      backward_cuda(x_re, x_im, g, theta, initial_state, out, final_out, chunk_states, reset_masks, plan.dims);
#else
      throw Error("complex_gated_scan: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(x_re->value.dtype(), "complex_gated_scan backward", [&] {
      Io<scalar_t> io;
      io.x_re = x_re->value.data<scalar_t>();
      io.x_im = x_im->value.data<scalar_t>();
      io.g = g->value.data<scalar_t>();
      io.theta = theta->value.data<scalar_t>();
      io.initial_state = initial_state ? initial_state->value.data<scalar_t>() : nullptr;
      io.d_output = out->grad.defined() ? out->grad.data<scalar_t>() : nullptr;
      io.d_final_state = final_out->grad.defined() ? final_out->grad.data<scalar_t>() : nullptr;
      io.resets = resets.defined() ? resets.data<int32_t>() : nullptr;
      // Gradient buffers are allocated here, outside the parallel region (grad_buffer is not thread-safe).
      io.dx_re = wants_grad(x_re) ? grad_buffer(x_re).data<scalar_t>() : nullptr;
      io.dx_im = wants_grad(x_im) ? grad_buffer(x_im).data<scalar_t>() : nullptr;
      io.dg = wants_grad(g) ? grad_buffer(g).data<scalar_t>() : nullptr;
      io.d_initial_state = wants_grad(initial_state) ? grad_buffer(initial_state).data<scalar_t>() : nullptr;
      std::vector<scalar_t> theta_rows;
      if (wants_grad(theta)) {
        theta_rows.assign(static_cast<size_t>(plan.dims.batch * plan.dims.channels), scalar_t(0));
        io.d_theta_rows = theta_rows.data();
      }
      backward_cpu(io, plan);
      if (io.d_theta_rows) {
        scalar_t* d_theta = grad_buffer(theta).data<scalar_t>();
        for (int64_t b = 0; b < plan.dims.batch; ++b)
          for (int64_t c = 0; c < plan.dims.channels; ++c) d_theta[c] += theta_rows[b * plan.dims.channels + c];
      }
    });
  });
  return result;
}

}  // namespace hgrn
