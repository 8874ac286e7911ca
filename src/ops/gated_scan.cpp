// gated_scan.cpp: the gated linear recurrence h_t = e^{g_t} h_{t−1} + x_t, o_t = h_t on the CPU, in two exact forms,
// each with a hand-written backward:
//  * Sequential: step by step (fla's fused_recurrent_hgrn); the backward recomputes h and runs
//    dh_t = do_t + e^{g_{t+1}} dh_{t+1} in reverse time.
//  * Chunk: fla's chunk_hgrn: every chunk scanned from zero (chunk 0 from h_{−1}) with its cumulative log decay
//    G_t = Σ_{s=start..t} g_s, then, chunk by chunk, o_t += e^{G_t} o_{start−1}. The backward mirrors it: reverse
//    scans from zero within the chunks, then, chunks in reverse, dh_t += e^{Σ_{s=t+1..end} g_s} β with β the gradient
//    arriving from the next chunk's first row (e^{g_s} dh_s there; the final state's gradient for the last chunk).
// Both backwards form dx_t = dh_t, dg_t = h_{t−1} e^{g_t} dh_t and dL/dh_{−1} = e^{g_0} dh_0.
// Resets (ops/sequence_resets.h): at a reset step h_{t−1} counts as 0, so e^{g_t} h_{t−1} is dropped there, dg_t = 0,
// and the gradient stops there on its way back; the chunk form's carries reach only the rows before a chunk's first
// reset (forward) or from its last reset on (backward).
// Work is split over OpenMP threads by (batch, block of 64 channels): each block is computed by the same sequential
// code whatever thread runs it, so the result is the same bits for any number of threads.
#include "ops/gated_scan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu_parallel.h"
#include "ops/elementwise.h"
#include "ops/scan_tasks.h"
#include "ops/sequence_resets.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/gated_scan.h"
#endif

namespace hgrn {
namespace {

using scan_tasks::kChannelBlock;
using scan_tasks::kDefaultChunk;
using ScanDims = scan_tasks::Dims;

// The global tensors of one call ([B, T, C] or [B, C], contiguous). Null gradient pointers: not wanted; null
// d_output / d_final_state: that output's gradient is zero; null initial_state: h_{−1} = 0.
template <typename T>
struct ScanIo {
  const T* x = nullptr;
  const T* g = nullptr;
  const T* initial_state = nullptr;
  T* output = nullptr;
  T* final_state = nullptr;
  const T* d_output = nullptr;
  const T* d_final_state = nullptr;
  T* dx = nullptr;
  T* dg = nullptr;
  T* d_initial_state = nullptr;
  const int32_t* resets = nullptr;  // [B, T]; null: none
};

// One task: channels [c0, c0 + width) of batch b; element (t, j) of a [B, T, C] tensor is at at(t) + j.
struct Block {
  int64_t b, c0, width, time, channels;
  int64_t at(int64_t t) const { return (b * time + t) * channels + c0; }
  int64_t state_at() const { return b * channels + c0; }
};

// The block's sequence's reset flags.
template <typename T>
SequenceResets resets_of(const ScanIo<T>& io, const Block& k) {
  return {io.resets ? io.resets + k.b * k.time : nullptr};
}

// Per-thread scratch, reused across the thread's tasks.
template <typename T>
struct Scratch {
  std::vector<T> states;    // [T][width]: h_t (the backward's recomputed forward)
  std::vector<T> decays;    // [T][width]: Chunk's cumulative log decays
  std::vector<T> d_states;  // [T][width]: the backward's dh_t
  std::vector<T> row;       // [width]
  explicit Scratch(const ScanDims& d) {
    const size_t n = static_cast<size_t>(d.time * kChannelBlock);
    states.resize(n);
    decays.resize(n);
    d_states.resize(n);
    row.resize(static_cast<size_t>(kChannelBlock));
  }
};

// h_{−1} of the block (zeros without an initial state) into h.
template <typename T>
void load_initial(const ScanIo<T>& io, const Block& k, T* h) {
  for (int64_t j = 0; j < k.width; ++j) h[j] = io.initial_state ? io.initial_state[k.state_at() + j] : T(0);
}

// ---------------------------------------------------------------------------------------------------------------------
// Forward: the block's h_t ([T][width], rows `stride` apart) from x, g and h_{−1}; `running` is [width] scratch.

template <typename T>
void sequential_forward(const ScanIo<T>& io, const Block& k, T* h, int64_t stride, T* running) {
  const SequenceResets resets = resets_of(io, k);
  load_initial(io, k, running);
  for (int64_t t = 0; t < k.time; ++t) {
    const T* x = io.x + k.at(t);
    const T* g = io.g + k.at(t);
    T* out = h + t * stride;
    const bool restart = resets.at(t);
    for (int64_t j = 0; j < k.width; ++j) {
      running[j] = restart ? x[j] : std::exp(g[j]) * running[j] + x[j];
      out[j] = running[j];
    }
  }
}

// fla's two passes: chunk-local scans (their cumulative log decays into `decays`, [T][width]), then the carry.
template <typename T>
void chunk_forward(const ScanIo<T>& io, const Block& k, int64_t chunk, T* h, int64_t stride, T* decays, T* running) {
  const int64_t W = k.width;
  const SequenceResets resets = resets_of(io, k);
  for (int64_t start = 0; start < k.time; start += chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    if (start == 0)
      load_initial(io, k, running);
    else
      std::fill_n(running, W, T(0));
    for (int64_t t = start; t < end; ++t) {
      const T* x = io.x + k.at(t);
      const T* g = io.g + k.at(t);
      T* out = h + t * stride;
      T* G = decays + t * W;
      const bool restart = resets.at(t);
      for (int64_t j = 0; j < W; ++j) {
        running[j] = restart ? x[j] : std::exp(g[j]) * running[j] + x[j];
        out[j] = running[j];
        G[j] = (t == start ? T(0) : G[j - W]) + g[j];
      }
    }
  }
  for (int64_t start = chunk; start < k.time; start += chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    const T* carry = h + (start - 1) * stride;  // the previous chunk's last state, already final
    for (int64_t t = start, first_reset = resets.first_in(start, end); t < first_reset; ++t) {
      T* out = h + t * stride;
      const T* G = decays + t * W;
      for (int64_t j = 0; j < W; ++j) out[j] += std::exp(G[j]) * carry[j];
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Backward: the block's dh_t ([T][width]) from do and the final state's gradient; leaves e^{g_0} dh_0 (dL/dh_{−1})
// in `beta` ([width]).

template <typename T>
void load_final_gradient(const ScanIo<T>& io, const Block& k, T* beta) {
  for (int64_t j = 0; j < k.width; ++j) beta[j] = io.d_final_state ? io.d_final_state[k.state_at() + j] : T(0);
}

template <typename T>
T d_output_at(const ScanIo<T>& io, const Block& k, int64_t t, int64_t j) {
  return io.d_output ? io.d_output[k.at(t) + j] : T(0);
}

template <typename T>
void sequential_backward(const ScanIo<T>& io, const Block& k, T* dh, T* beta) {
  const SequenceResets resets = resets_of(io, k);
  load_final_gradient(io, k, beta);  // beta = e^{g_{t+1}} dh_{t+1}; at t = T − 1, the final state's gradient
  for (int64_t t = k.time - 1; t >= 0; --t) {
    const T* g = io.g + k.at(t);
    T* d = dh + t * k.width;
    const bool restart = resets.at(t);
    for (int64_t j = 0; j < k.width; ++j) {
      d[j] = d_output_at(io, k, t, j) + beta[j];
      beta[j] = restart ? T(0) : std::exp(g[j]) * d[j];
    }
  }
}

// fla's two passes in reverse: reverse scans from zero within each chunk (with Σ_{s=t+1..end} g_s into `decays`),
// then chunks in reverse: dh_t += e^{Σ_{s=t+1..end} g_s} β, and β ← e^{g_start} dh_start for the chunk before.
template <typename T>
void chunk_backward(const ScanIo<T>& io, const Block& k, int64_t chunk, T* dh, T* decays, T* beta) {
  const int64_t W = k.width;
  const SequenceResets resets = resets_of(io, k);
  for (int64_t start = 0; start < k.time; start += chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    std::fill_n(beta, W, T(0));
    for (int64_t t = end - 1; t >= start; --t) {
      const T* g = io.g + k.at(t);
      T* d = dh + t * W;
      T* G = decays + t * W;
      const bool restart = resets.at(t);
      for (int64_t j = 0; j < W; ++j) {
        d[j] = d_output_at(io, k, t, j) + beta[j];
        beta[j] = restart ? T(0) : std::exp(g[j]) * d[j];
        G[j] = t == end - 1 ? T(0) : G[j + W] + io.g[k.at(t + 1) + j];
      }
    }
  }
  load_final_gradient(io, k, beta);
  for (int64_t start = (k.time - 1) / chunk * chunk; start >= 0; start -= chunk) {
    const int64_t end = std::min(k.time, start + chunk);
    // β reaches the rows from the chunk's last reset on (all of them without one).
    for (int64_t t = std::max(start, resets.last_in(start, end)); t < end; ++t) {
      T* d = dh + t * W;
      const T* G = decays + t * W;
      for (int64_t j = 0; j < W; ++j) d[j] += std::exp(G[j]) * beta[j];
    }
    const T* g = io.g + k.at(start);
    const bool restart = resets.at(start);
    for (int64_t j = 0; j < W; ++j) beta[j] = restart ? T(0) : std::exp(g[j]) * dh[start * W + j];
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Drivers: one OpenMP iteration per (batch, channel block).

using Plan = scan_tasks::Plan<Block>;

template <typename T>
void forward_cpu(const ScanIo<T>& io, const Plan& plan) {
  const ScanDims& d = plan.dims;
#pragma omp parallel if (plan.parallel())
  {
    Scratch<T> s(d);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.tasks(); ++task) {
      const Block k = plan.block(task);
      T* h = io.output + k.at(0);  // written in place: rows C apart
      if (plan.mode == ScanMode::Sequential)
        sequential_forward(io, k, h, d.channels, s.row.data());
      else
        chunk_forward(io, k, plan.chunk, h, d.channels, s.decays.data(), s.row.data());
      std::copy_n(h + (d.time - 1) * d.channels, k.width, io.final_state + k.state_at());
    }
  }
}

template <typename T>
void backward_cpu(const ScanIo<T>& io, const Plan& plan) {
  const ScanDims& d = plan.dims;
#pragma omp parallel if (plan.parallel())
  {
    Scratch<T> s(d);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < d.tasks(); ++task) {
      const Block k = plan.block(task);
      const int64_t W = k.width;
      T* h = s.states.data();
      T* dh = s.d_states.data();
      T* beta = s.row.data();
      // h_{t−1} for dg: the forward recomputed by the same form.
      if (io.dg) {
        if (plan.mode == ScanMode::Sequential)
          sequential_forward(io, k, h, W, beta);
        else
          chunk_forward(io, k, plan.chunk, h, W, s.decays.data(), beta);
      }
      if (plan.mode == ScanMode::Sequential)
        sequential_backward(io, k, dh, beta);
      else
        chunk_backward(io, k, plan.chunk, dh, s.decays.data(), beta);
      for (int64_t t = 0; t < d.time; ++t) {
        const T* d_t = dh + t * W;
        if (io.dx) {
          T* dx = io.dx + k.at(t);
          for (int64_t j = 0; j < W; ++j) dx[j] += d_t[j];
        }
        if (io.dg) {
          T* dg = io.dg + k.at(t);
          const T* g = io.g + k.at(t);
          const bool restart = resets_of(io, k).at(t);
          for (int64_t j = 0; j < W; ++j) {
            const T h_prev = restart ? T(0)
                             : t > 0 ? h[(t - 1) * W + j]
                                     : (io.initial_state ? io.initial_state[k.state_at() + j] : T(0));
            dg[j] += h_prev * std::exp(g[j]) * d_t[j];
          }
        }
      }
      if (io.d_initial_state)
        for (int64_t j = 0; j < W; ++j) io.d_initial_state[k.state_at() + j] += beta[j];
    }
  }
}

#ifdef HGRN_WITH_CUDA
GatedScanCudaShape cuda_shape(const ScanDims& d) {
  GatedScanCudaShape s;
  s.batch = d.batch;
  s.time = d.time;
  s.channels = d.channels;
  return s;
}

// A per-chunk buffer of the kernels (undefined when T <= 64: none is needed).
Tensor chunk_buffer(const ScanDims& d) {
  const int64_t n = gated_scan_cuda_chunk_elements(cuda_shape(d));
  return n > 0 ? Tensor::empty({n}, DType::F32, Device::CUDA) : Tensor();
}
float* data_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
const uint64_t* masks_or_null(const Tensor& t) {
  return t.defined() ? reinterpret_cast<const uint64_t*>(t.data<int64_t>()) : nullptr;
}

// The CUDA backward: gradients of both outputs (either may be absent) into the inputs that want one.
void gated_scan_backward_cuda(const Var& x, const Var& g, const Var& initial_state, const Var& out,
                              const Var& final_out, const Tensor& chunk_states, const Tensor& reset_masks,
                              const ScanDims& dims) {
  if (out->grad.defined())
    HGRN_CHECK(out->grad.dtype() == out->value.dtype() && out->grad.is_contiguous(),
               "gated_scan: the output's gradient must be contiguous ", dtype_name(out->value.dtype()), ", got ",
               dtype_name(out->grad.dtype()));
  if (final_out->grad.defined())
    HGRN_CHECK(final_out->grad.dtype() == DType::F32 && final_out->grad.is_contiguous(),
               "gated_scan: the final state's gradient must be contiguous fp32");
  const Tensor scratch_a = chunk_buffer(dims), scratch_b = chunk_buffer(dims);
  GatedScanCudaBackwardArgs a;
  a.x = x->value.raw_data();
  a.x_stride = x->value.row_stride();
  a.act = x->value.dtype();
  a.g = g->value.data<float>();
  a.g_stride = g->value.row_stride();
  a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
  a.chunk_states = data_or_null(chunk_states);
  a.reset_masks = masks_or_null(reset_masks);
  a.d_output = out->grad.defined() ? out->grad.raw_data() : nullptr;
  a.d_final_state = final_out->grad.defined() ? final_out->grad.data<float>() : nullptr;
  // A column block of a split gets its place in the split's gradient (row-strided); fresh buffers are written.
  if (wants_grad(x)) {
    const Tensor& dx = grad_buffer_for_write(x, &a.accumulate_dx, GradLayout::RowStrided);
    a.dx = dx.raw_data();
    a.dx_stride = dx.row_stride();
  }
  if (wants_grad(g)) {
    const Tensor& dg = grad_buffer_for_write(g, &a.accumulate_dg, GradLayout::RowStrided);
    a.dg = dg.data<float>();
    a.dg_stride = dg.row_stride();
  }
  if (wants_grad(initial_state))
    a.d_initial_state = grad_buffer_for_write(initial_state, &a.accumulate_d_initial_state).data<float>();
  a.scratch_a = data_or_null(scratch_a);
  a.scratch_b = data_or_null(scratch_b);
  gated_scan_cuda_backward(cuda_shape(dims), a);
}
#endif

}  // namespace

GatedScanOutputs gated_scan(Tape& tape, const Var& x_in, const Var& g_in, const Var& initial_state, ScanMode mode,
                            int64_t chunk_size, const Tensor& resets) {
  HGRN_CHECK(x_in && g_in, "gated_scan: x and g are required");
  // x and g may be row-strided (column blocks of a fused projection): the GPU reads them in place, the CPU copies.
  const Var x = contiguous_on_cpu(tape, x_in);
  const Var g = contiguous_on_cpu(tape, g_in);
  const Tensor& xv = x->value;
  HGRN_CHECK(xv.dim() == 3, "gated_scan: x must be [B, T, C], got ", shape_str(xv.shape()));
  const ScanDims dims{xv.size(0), xv.size(1), xv.size(2)};
  HGRN_CHECK(dims.batch > 0 && dims.time > 0 && dims.channels > 0, "gated_scan: empty x ", shape_str(xv.shape()));
  HGRN_CHECK(g->value.shape() == xv.shape(), "gated_scan: g ", shape_str(g->value.shape()), " must match x ",
             shape_str(xv.shape()));
  const Shape state_shape{dims.batch, dims.channels};
  if (initial_state)
    HGRN_CHECK(initial_state->value.shape() == state_shape, "gated_scan: initial_state must be ",
               shape_str(state_shape), ", got ", shape_str(initial_state->value.shape()));
  HGRN_CHECK(chunk_size >= 0, "gated_scan: chunk_size must be >= 0 (0 = ", kDefaultChunk, "), got ", chunk_size);
  const Device device = xv.device();
  check_resets(resets, dims.batch, dims.time, device, "gated_scan");
  const bool on_cuda = device == Device::CUDA;
  const DType dtype = xv.dtype();
  // GPU: x (and the output) in the activation dtype, g and the states fp32. CPU: one dtype.
  const DType state_dtype = on_cuda ? DType::F32 : dtype;
  for (const Var& v : {g, initial_state}) {
    if (!v) continue;
    HGRN_CHECK(v->value.device() == device, "gated_scan: inputs mix ", device_name(device), " and ",
               device_name(v->value.device()));
    HGRN_CHECK(v->value.dtype() == state_dtype, "gated_scan: ", v == g ? "g" : "initial_state", " must be ",
               dtype_name(state_dtype), " here, got ", dtype_name(v->value.dtype()));
  }
  HGRN_CHECK(!initial_state || initial_state->value.is_contiguous(), "gated_scan: initial_state must be contiguous");
  HGRN_CHECK(xv.is_row_strided() && g->value.is_row_strided(), "gated_scan: x and g must be row-strided");
  const Plan plan{dims, mode, chunk_size > 0 ? chunk_size : kDefaultChunk};

  Tensor output, final_state, chunk_states, reset_masks;
  if (on_cuda) {
#ifdef HGRN_WITH_CUDA
    reset_masks = reset_chunk_masks(resets);  // kept for the backward
    output = Tensor::empty(xv.shape(), dtype, device);
    final_state = Tensor::empty(state_shape, DType::F32, device);
    chunk_states = chunk_buffer(dims);  // the state entering each chunk: kept for the backward
    const Tensor scratch = chunk_buffer(dims);
    GatedScanCudaForwardArgs a;
    a.x = xv.raw_data();
    a.x_stride = xv.row_stride();
    a.act = dtype;
    a.g = g->value.data<float>();
    a.g_stride = g->value.row_stride();
    a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
    a.output = output.raw_data();
    a.final_state = final_state.data<float>();
    a.chunk_states = data_or_null(chunk_states);
    a.scratch = data_or_null(scratch);
    a.reset_masks = masks_or_null(reset_masks);
    gated_scan_cuda_forward(cuda_shape(dims), a);
#else
    throw Error("gated_scan: this hgrn was built without CUDA");
#endif
  } else {
    output = Tensor::empty(xv.shape(), dtype);
    final_state = Tensor::empty(state_shape, dtype);
    HGRN_DISPATCH_FLOAT(dtype, "gated_scan", [&] {
      ScanIo<scalar_t> io;
      io.x = xv.data<scalar_t>();
      io.g = g->value.data<scalar_t>();
      io.initial_state = initial_state ? initial_state->value.data<scalar_t>() : nullptr;
      io.output = output.data<scalar_t>();
      io.final_state = final_state.data<scalar_t>();
      io.resets = resets.defined() ? resets.data<int32_t>() : nullptr;
      forward_cpu(io, plan);
    });
  }

  GatedScanOutputs result{op_output(tape, output, {x, g, initial_state}),
                          op_output(tape, final_state, {x, g, initial_state})};
  if (!result.output->requires_grad) return result;
  Var out = result.output, final_out = result.final_state;
  tape.record([x, g, initial_state, out, final_out, chunk_states, reset_masks, resets, plan] {
    // Either output may have received no gradient (the loss did not use it): it then contributes zero.
    if (!out->grad.defined() && !final_out->grad.defined()) return;
    if (x->value.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      gated_scan_backward_cuda(x, g, initial_state, out, final_out, chunk_states, reset_masks, plan.dims);
#else
      throw Error("gated_scan: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(x->value.dtype(), "gated_scan backward", [&] {
      ScanIo<scalar_t> io;
      io.x = x->value.data<scalar_t>();
      io.g = g->value.data<scalar_t>();
      io.initial_state = initial_state ? initial_state->value.data<scalar_t>() : nullptr;
      io.d_output = out->grad.defined() ? out->grad.data<scalar_t>() : nullptr;
      io.d_final_state = final_out->grad.defined() ? final_out->grad.data<scalar_t>() : nullptr;
      io.resets = resets.defined() ? resets.data<int32_t>() : nullptr;
      // Gradient buffers are allocated here, outside the parallel region (grad_buffer is not thread-safe).
      io.dx = wants_grad(x) ? grad_buffer(x).data<scalar_t>() : nullptr;
      io.dg = wants_grad(g) ? grad_buffer(g).data<scalar_t>() : nullptr;
      io.d_initial_state = wants_grad(initial_state) ? grad_buffer(initial_state).data<scalar_t>() : nullptr;
      backward_cpu(io, plan);
    });
  });
  return result;
}

}  // namespace hgrn
