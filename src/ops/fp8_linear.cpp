// fp8_linear.cpp: see fp8_linear.h. The scaling states of all weights live in one set of arrays on the scope's
// device, so that the end-of-step update is two kernel launches (one per format) and two for the inverses, whatever
// the layer count. Each weight is cast once a step: its forward codes are kept in the scope until the step ends and
// transposed for the input gradient. The CPU path is the reference arithmetic of ops/fp8.h on fp32 activations, for
// tests.
#include "ops/fp8_linear.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "ops/fp8.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cuda_context.h"
#include "kernels/fp8.h"
#endif

namespace hgrn {
namespace {

// A weight's tensors: input and weight in E4M3 (slots 2s, 2s + 1 of the forward arrays), output gradient in the
// recipe's gradient format (slot s of the gradient arrays).
enum class Role { Input = 0, Weight = 1, OutputGradient = 2 };

// The GEMMs' dequantising factors sit 256 bytes apart: cuBLASLt refused (NOT_SUPPORTED) scale pointers 4 bytes apart,
// and 256 bytes is the alignment its heuristic assumes for every other pointer of a matmul.
constexpr int64_t kInverseStride = 64;

// One format's states, laid out as cuda_fp8_update_scales reads them.
struct FormatStates {
  std::string name;  // "forward" or "gradient": the arrays' names in checkpoints
  Fp8Format format = Fp8Format::E4M3;
  Tensor history, positions, scales, step_amax, inverses;
  // Per tensor: whether it has a scale of its own yet (from its first cast, or a checkpoint's history), host-side.
  std::vector<char> scaled;

  void allocate(const std::string& what, Fp8Format f, int64_t tensors, int64_t history_length, Device device) {
    name = what;
    format = f;
    scaled.assign(static_cast<size_t>(tensors), 0);
    history = Tensor::zeros({tensors * history_length}, DType::F32, device);
    positions = Tensor::zeros({tensors}, DType::I64, device);
    scales = Tensor::full({tensors}, 1.0, DType::F32, device);
    step_amax = Tensor::zeros({tensors}, DType::F32, device);
    inverses = Tensor::full({tensors * kInverseStride}, 1.0, DType::F32, device);
  }
};

// A weight's row-major E4M3 codes from its first forward cast of the step, and the master values they were cast from
// (linear_columns casts a block of adjacent weights under its first weight's state).
struct CachedWeightCodes {
  const void* values = nullptr;
  int64_t out = 0, in = 0;
  Tensor codes;
};

struct Scope {
  Fp8Recipe recipe;
  Device device = Device::CUDA;
  int64_t capacity = 0, used = 0;
  std::unordered_set<const Variable*> excluded;
  std::unordered_map<const Variable*, int64_t> slot;
  FormatStates forward, gradient;
  std::function<void(float*, int64_t)> reduce_max;  // over the ranks; null with one
  // The weights' codes cast this step, for the later forwards and the input gradients: the weights and their scales
  // do not change until the step ends (fp8_end_step), which drops them. 1 byte per FP8 weight element until then.
  std::unordered_map<const Variable*, CachedWeightCodes> weight_codes;
};

Scope* active_scope = nullptr;

struct TensorState {
  float* scale;
  float* step_amax;
  float* inverse;
  FormatStates* states;
  int64_t index;  // in states' arrays
};

int64_t slot_of(const Var& weight) {
  Scope& s = *active_scope;
  const auto found = s.slot.find(weight.get());
  if (found != s.slot.end()) return found->second;
  HGRN_CHECK(s.used < s.capacity, "fp8 linear: more than ", s.capacity, " weights need scaling states");
  s.slot.emplace(weight.get(), s.used);
  return s.used++;
}

TensorState state_of(const Var& weight, Role role) {
  HGRN_CHECK(active_scope, "fp8 linear: no Fp8LinearScope is active");
  const int64_t s = slot_of(weight);
  FormatStates& f = role == Role::OutputGradient ? active_scope->gradient : active_scope->forward;
  const int64_t i = role == Role::OutputGradient ? s : 2 * s + static_cast<int64_t>(role);
  return {f.scales.data<float>() + i, f.step_amax.data<float>() + i, f.inverses.data<float>() + i * kInverseStride, &f,
          i};
}

// FP8 codes held in an I32 tensor (a Tensor has no byte dtype): four codes an element, 16-byte aligned storage.
Tensor fp8_codes(int64_t count) { return Tensor::empty({(count + 3) / 4}, DType::I32, active_scope->device); }
uint8_t* codes_of(const Tensor& t) { return static_cast<uint8_t*>(t.raw_data()); }

// The casts read dense rows: a row-strided view (a column block) is copied first.
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), t.device());
  copy.copy_from(t);
  return copy;
}

// The activation dtype of the scope's device: bf16 on the GPU, fp32 on the CPU.
DType activation_dtype_of(Device device) { return device == Device::CUDA ? DType::BF16 : DType::F32; }

// codes = fp8(x · *scale) for a dense x seen as [rows, cols] (out, out_t: row-major and transposed codes, either
// null); *amax (or null) becomes max(*amax, amax of x).
void cast(const Tensor& x, int64_t rows, int64_t cols, const float* scale, Fp8Format format, uint8_t* out,
          uint8_t* out_t, float* amax) {
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    if (out_t)
      cuda_fp8_quantize_transpose(x.raw_data(), x.dtype(), rows, cols, scale, format, out, out_t, amax);
    else
      cuda_fp8_quantize(x.raw_data(), x.dtype(), rows * cols, scale, format, out, amax);
    return;
#endif
  }
  const float* v = x.data<float>();
  if (out) fp8_quantize(v, rows * cols, *scale, format, out);
  if (out_t)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out_t[c * rows + r] = fp8_from_float(v[r * cols + c] * *scale, format);
  if (amax) *amax = std::max(*amax, fp8_amax(v, rows * cols));
}

// codes_t ([cols, rows]) = the transpose of the row-major [rows, cols] codes, byte for byte.
void transpose_codes(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* codes_t) {
  if (active_scope->device == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_fp8_transpose_codes(codes, rows, cols, codes_t);
    return;
#endif
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) codes_t[c * rows + r] = codes[r * cols + c];
}

// The codes of w ([out, in]) cached for `weight` this step, or null where none are.
const Tensor* cached_weight_codes(const Var& weight, const Tensor& w) {
  const auto found = active_scope->weight_codes.find(weight.get());
  if (found == active_scope->weight_codes.end()) return nullptr;
  const CachedWeightCodes& c = found->second;
  return c.values == w.raw_data() && c.out == w.size(0) && c.in == w.size(1) ? &c.codes : nullptr;
}

// A tensor's first cast, with no amax history yet (a fresh run), takes its scale from the tensor itself (current
// scaling, the delayed rule applied to its own amax) rather than 1: at scale 1 the first steps' output gradients fall
// below E5M2's range. The history is left to the end of the step, as for every cast.
void scale_on_first_cast(const TensorState& t, const Tensor& x) {
  FormatStates& f = *t.states;
  if (f.scaled[static_cast<size_t>(t.index)]) return;
  f.scaled[static_cast<size_t>(t.index)] = 1;
  const int margin = active_scope->recipe.margin;
  if (x.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    Tensor amax = Tensor::zeros({1}, DType::F32, Device::CUDA), history = Tensor::zeros({1}, DType::F32, Device::CUDA),
           position = Tensor::zeros({1}, DType::I64, Device::CUDA);
    const Tensor codes = fp8_codes(x.numel());
    cuda_fp8_quantize(x.raw_data(), x.dtype(), x.numel(), t.scale, f.format, codes_of(codes), amax.data<float>());
    if (active_scope->reduce_max) active_scope->reduce_max(amax.data<float>(), 1);
    cuda_fp8_update_scales(history.data<float>(), 1, position.data<int64_t>(), t.scale, amax.data<float>(), 1, f.format,
                           margin);
    cuda_fp8_scale_inverses(t.scale, t.inverse, 1, kInverseStride);
    return;
#endif
  }
  float amax = fp8_amax(x.data<float>(), x.numel());
  if (active_scope->reduce_max) active_scope->reduce_max(&amax, 1);
  Fp8ScalingState state = fp8_scaling_state(1);
  state.scale = *t.scale;
  fp8_record_amax(state, amax);
  fp8_update_scale(state, f.format, margin);
  *t.scale = state.scale;
  *t.inverse = fp8_scale_inverse(state.scale);
}

// W's row-major codes for the forward (w [out, in] with ws, its state): cast on the weight's first forward of the step,
// its amax recorded, and kept for the rest of the step. Later casts of the unchanged weight at the unchanged scale
// would give the same codes and fold the same amax into the step's maximum, so they are skipped.
Tensor step_weight_codes(const Var& weight, const Tensor& w, const TensorState& ws) {
  if (const Tensor* cached = cached_weight_codes(weight, w)) return *cached;
  const int64_t out = w.size(0), in = w.size(1);
  scale_on_first_cast(ws, w);
  const Tensor wq = fp8_codes(out * in);
  cast(w, out, in, ws.scale, Fp8Format::E4M3, codes_of(wq), nullptr, ws.step_amax);
  active_scope->weight_codes[weight.get()] = {w.raw_data(), out, in, wq};
  return wq;
}

struct Operand {
  const uint8_t* codes;
  Fp8Format format;
  const float* scale_inverse;
};

// c = a.scale_inverse · b.scale_inverse · A·Bᵀ + beta·c_in, A [m, k] (lda), B [n, k] (ldb), c of `c_dtype` (ldc);
// c_in is c itself when null, else another buffer laid out as c.
void gemm(int64_t m, int64_t n, int64_t k, const Operand& a, int64_t lda, const Operand& b, int64_t ldb, float beta,
          void* c, int64_t ldc, DType c_dtype, bool fast_accumulation, const void* c_in = nullptr) {
  if (active_scope->device == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_fp8_gemm(m, n, k, {a.codes, a.format, a.scale_inverse}, lda, {b.codes, b.format, b.scale_inverse}, ldb, beta,
                  c, ldc, c_dtype, fast_accumulation, c_in);
    return;
#endif
  }
  HGRN_CHECK(c_dtype == DType::F32, "fp8 linear on the CPU: the output must be fp32");
  if (c_in && c_in != c) std::memcpy(c, c_in, static_cast<size_t>(m) * ldc * sizeof(float));
  fp8_gemm_cpu(false, true, m, n, k, a.codes, lda, a.format, *a.scale_inverse, b.codes, ldb, b.format,
               *b.scale_inverse, beta, static_cast<float*>(c), ldc);
}

// The GEMM factors 1 / scale of the first `tensors` states.
void refresh_inverses(FormatStates& f, int64_t tensors) {
  if (f.scales.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_fp8_scale_inverses(f.scales.data<float>(), f.inverses.data<float>(), tensors, kInverseStride);
    return;
#endif
  }
  for (int64_t t = 0; t < tensors; ++t)
    f.inverses.data<float>()[t * kInverseStride] = fp8_scale_inverse(f.scales.data<float>()[t]);
}

// The end-of-step update of `tensors` states of one format, and their GEMM factors.
void update_scales(FormatStates& f, int64_t tensors, const Fp8Recipe& recipe) {
  if (f.history.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_fp8_update_scales(f.history.data<float>(), recipe.history_length, f.positions.data<int64_t>(),
                           f.scales.data<float>(), f.step_amax.data<float>(), tensors, f.format, recipe.margin);
    refresh_inverses(f, tensors);
    return;
#endif
  }
  for (int64_t t = 0; t < tensors; ++t) {
    float* history = f.history.data<float>() + t * recipe.history_length;
    Fp8ScalingState state;
    state.amax_history.assign(history, history + recipe.history_length);
    state.position = f.positions.data<int64_t>()[t];
    state.scale = f.scales.data<float>()[t];
    fp8_record_amax(state, f.step_amax.data<float>()[t]);
    f.step_amax.data<float>()[t] = 0.0f;
    fp8_update_scale(state, f.format, recipe.margin);
    std::copy(state.amax_history.begin(), state.amax_history.end(), history);
    f.positions.data<int64_t>()[t] = state.position;
    f.scales.data<float>()[t] = state.scale;
  }
  refresh_inverses(f, tensors);
}

}  // namespace

Fp8LinearScope::Fp8LinearScope(const Fp8Recipe& recipe, int64_t max_weights, const std::vector<Var>& excluded,
                               Device device) {
  HGRN_CHECK(!active_scope, "fp8 linear: a second Fp8LinearScope while one is active");
  HGRN_CHECK(recipe.history_length >= 1 && recipe.margin >= 0, "fp8 linear: amax history length ",
             recipe.history_length, " and margin ", recipe.margin, ": expected >= 1 and >= 0");
  if (device == Device::CUDA) {
#ifndef HGRN_WITH_CUDA
    throw Error("fp8 linear layers on the GPU need the CUDA backend: this hgrn was built without it");
#else
    const cudaDeviceProp& gpu = cuda_device_properties();
    HGRN_CHECK(gpu.major * 10 + gpu.minor >= 89, "training.precision: fp8 needs FP8 tensor cores (compute "
               "capability 8.9 or newer: Ada, Hopper); this GPU, ", gpu.name, ", has ", gpu.major, ".", gpu.minor,
               ": set training.precision to bf16");
#endif
  }
  auto scope = std::make_unique<Scope>();
  scope->recipe = recipe;
  scope->device = device;
  scope->capacity = max_weights;
  for (const Var& v : excluded)
    if (v) scope->excluded.insert(v.get());
  scope->forward.allocate("forward", Fp8Format::E4M3, 2 * max_weights, recipe.history_length, device);
  scope->gradient.allocate("gradient", recipe.gradient_format, max_weights, recipe.history_length, device);
  active_scope = scope.release();
}

Fp8LinearScope::~Fp8LinearScope() {
  delete active_scope;
  active_scope = nullptr;
}

// The paused scope's cached codes are dropped: nothing it sees stops the weights changing before it resumes.
Fp8LinearPause::Fp8LinearPause() : paused_(active_scope) {
  if (active_scope) active_scope->weight_codes.clear();
  active_scope = nullptr;
}
Fp8LinearPause::~Fp8LinearPause() { active_scope = static_cast<Scope*>(paused_); }

bool fp8_linear_active() { return active_scope != nullptr; }

bool fp8_linear_applies(const Var& weight, Device device, DType dtype, int64_t rows, const Tensor& w) {
  if (!active_scope || active_scope->excluded.count(weight.get())) return false;
  if (device != active_scope->device || w.device() != device || dtype != activation_dtype_of(device) ||
      w.dtype() != DType::F32 || w.dim() != 2)
    return false;
  const int64_t in = w.size(1), out = w.size(0);
  return in % 16 == 0 && out % 16 == 0 && rows % 16 == 0 && rows > 0 && w.is_contiguous();
}

bool fp8_linear_applies(const Var& weight, const Tensor& x, const Tensor& w) {
  if (x.dim() < 1 || w.dim() != 2 || x.size(-1) != w.size(1) || !x.is_contiguous()) return false;
  return fp8_linear_applies(weight, x.device(), x.dtype(), x.numel() / std::max<int64_t>(w.size(1), 1), w);
}

namespace {
// y = x·Wᵀ (+ residual) into y ([rows, out], contiguous) from x's codes xq [rows, in], cast at the input's scale.
void forward_from_codes(const Var& weight, const Tensor& xq, int64_t rows, const Tensor& w, const Tensor* residual,
                        Tensor& y) {
  const int64_t in = w.size(1), out = w.size(0);
  const TensorState xs = state_of(weight, Role::Input), ws = state_of(weight, Role::Weight);
  const Tensor wq = step_weight_codes(weight, w, ws);
  // The GEMM reads the residual as its addend where it is laid out as y; otherwise y starts as a copy of it.
  const bool addend_apart = residual && residual->dtype() == y.dtype() && residual->is_contiguous() &&
                            residual->numel() == y.numel() &&
                            residual->device() == y.device();
  if (residual && !addend_apart) y.copy_from(*residual);
  // Fast accumulation in the forward only, as Transformer Engine: the backward's sums are longer and smaller.
  gemm(rows, out, in, {codes_of(xq), Fp8Format::E4M3, xs.inverse}, in, {codes_of(wq), Fp8Format::E4M3, ws.inverse}, in,
       residual ? 1.0f : 0.0f, y.raw_data(), out, y.dtype(), /*fast_accumulation=*/true,
       addend_apart ? residual->raw_data() : nullptr);
}

// y = x·Wᵀ (+ residual) into y, laid out [rows, out] and contiguous (fp8_linear_forward's arithmetic).
void forward_into(const Var& weight, const Tensor& x, const Tensor& w, const Tensor* residual, Tensor& y) {
  const int64_t in = w.size(1), rows = x.numel() / in;
  const TensorState xs = state_of(weight, Role::Input);
  const Tensor xq = fp8_codes(rows * in);
  scale_on_first_cast(xs, x);
  cast(x, rows, in, xs.scale, Fp8Format::E4M3, codes_of(xq), nullptr, xs.step_amax);
  forward_from_codes(weight, xq, rows, w, residual, y);
}

// dw = dy[:, first_column .. first_column + n)ᵀ·x + beta·dw from Xᵀ's codes xq_t [in, rows].
void weight_gradient_from_codes(const Var& weight, const Fp8OutputGradient& dy, int64_t first_column,
                                const Tensor& xq_t, float beta, Tensor& dw) {
  const int64_t n = dw.size(0), in = dw.size(1), rows = dy.rows;
  const TensorState gs = state_of(weight, Role::OutputGradient), xs = state_of(weight, Role::Input);
  // dy's columns [first, first + n) are rows of its transpose: an offset of first · rows codes (rows % 16 == 0).
  gemm(n, in, rows,
       {codes_of(dy.codes_transposed) + first_column * rows, active_scope->recipe.gradient_format, gs.inverse}, rows,
       {codes_of(xq_t), Fp8Format::E4M3, xs.inverse}, rows, beta, dw.raw_data(), in, DType::F32, false);
}
}  // namespace

Tensor fp8_linear_forward(const Var& weight, const Tensor& x, const Tensor& w, const Tensor* residual) {
  Shape shape = x.shape();
  shape.back() = w.size(0);
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  forward_into(weight, x, w, residual, y);
  return y;
}

void fp8_linear_forward_into(const Var& weight, const Tensor& x, const Tensor& w, Tensor& y) {
  HGRN_CHECK(y.is_contiguous() && y.dtype() == x.dtype() && y.numel() == x.numel() / w.size(1) * w.size(0),
             "fp8 linear: the output ", shape_str(y.shape()), " does not fit ", x.numel() / w.size(1), " rows of ",
             w.size(0));
  forward_into(weight, x, w, nullptr, y);
}

Fp8OutputGradient fp8_output_gradient(const Var& weight, const Tensor& dy_in) {
  const Tensor dy = dense(dy_in);
  Fp8OutputGradient g;
  g.width = dy.size(-1);
  g.rows = dy.numel() / g.width;
  const TensorState s = state_of(weight, Role::OutputGradient);
  scale_on_first_cast(s, dy);
  g.codes = fp8_codes(g.rows * g.width);
  g.codes_transposed = fp8_codes(g.rows * g.width);
  cast(dy, g.rows, g.width, s.scale, active_scope->recipe.gradient_format, codes_of(g.codes),
       codes_of(g.codes_transposed), s.step_amax);
  return g;
}

Fp8CodesOut fp8_output_gradient_codes(const Var& weight, int64_t rows, int64_t width, Fp8OutputGradient& g) {
  const TensorState s = state_of(weight, Role::OutputGradient);
  if (!s.states->scaled[static_cast<size_t>(s.index)]) return {};
  g = Fp8OutputGradient{};
  g.rows = rows;
  g.width = width;
  g.codes = fp8_codes(rows * width);
  return {codes_of(g.codes), s.scale, s.step_amax, active_scope->recipe.gradient_format};
}

void fp8_output_gradient_transpose(Fp8OutputGradient& g) {
  HGRN_CHECK(g.codes.defined(), "fp8 linear: no output-gradient codes to transpose");
  g.codes_transposed = fp8_codes(g.rows * g.width);
  transpose_codes(codes_of(g.codes), g.rows, g.width, codes_of(g.codes_transposed));
}

Tensor fp8_weight_codes_transposed(const Var& weight, const Tensor& w) {
  const int64_t in = w.size(1), out = w.size(0);
  const TensorState ws = state_of(weight, Role::Weight);
  const Tensor wq_t = fp8_codes(out * in);  // Wᵀ [in, out], with the forward's scale (scales move at step ends)
  if (const Tensor* wq = cached_weight_codes(weight, w))
    transpose_codes(codes_of(*wq), out, in, codes_of(wq_t));
  else  // no forward of this weight since the step began (a backward run on its own): its fp32 values cast again
    cast(w, out, in, ws.scale, Fp8Format::E4M3, nullptr, codes_of(wq_t), nullptr);
  return wq_t;
}

void fp8_linear_input_gradient(const Var& weight, const Fp8OutputGradient& dy, const Tensor& w, float beta,
                               Tensor& dx, const Tensor* weight_codes_transposed) {
  const int64_t in = w.size(1), out = w.size(0);
  HGRN_CHECK(out == dy.width && dx.is_contiguous() &&
                 (dx.dtype() == activation_dtype_of(active_scope->device) || dx.dtype() == DType::F32) &&
                 dx.numel() == dy.rows * in,
             "fp8 linear: the input gradient ", shape_str(dx.shape()), " does not fit ", dy.rows, " rows of ", in);
  const TensorState gs = state_of(weight, Role::OutputGradient), ws = state_of(weight, Role::Weight);
  const Tensor wq_t = weight_codes_transposed ? *weight_codes_transposed : fp8_weight_codes_transposed(weight, w);
  gemm(dy.rows, in, out, {codes_of(dy.codes), active_scope->recipe.gradient_format, gs.inverse}, out,
       {codes_of(wq_t), Fp8Format::E4M3, ws.inverse}, out, beta, dx.raw_data(), in, dx.dtype(), false);
}

void fp8_linear_weight_gradient(const Var& weight, const Fp8OutputGradient& dy, int64_t first_column,
                                const Tensor& x, float beta, Tensor& dw) {
  const int64_t n = dw.size(0), in = dw.size(1), rows = dy.rows;
  HGRN_CHECK(dw.dtype() == DType::F32 && dw.is_contiguous() && first_column >= 0 && first_column + n <= dy.width &&
                 x.numel() == rows * in,
             "fp8 linear: the weight gradient ", shape_str(dw.shape()), " does not fit columns ", first_column, "..",
             first_column + n, " of ", dy.width, " and the input ", shape_str(x.shape()));
  const Tensor xc = dense(x);
  const TensorState xs = state_of(weight, Role::Input);
  const Tensor xq_t = fp8_codes(rows * in);  // Xᵀ [in, rows]
  cast(xc, rows, in, xs.scale, Fp8Format::E4M3, nullptr, codes_of(xq_t), nullptr);
  weight_gradient_from_codes(weight, dy, first_column, xq_t, beta, dw);
}

Fp8ProducedInput fp8_produced_input(const Var& weight, const Tensor& w, Device device, DType dtype, int64_t rows,
                                    bool forward) {
  Fp8ProducedInput x;
  if (!fp8_linear_applies(weight, device, dtype, rows, w)) return x;
  const TensorState xs = state_of(weight, Role::Input);
  if (!xs.states->scaled[static_cast<size_t>(xs.index)]) return x;  // the first cast scales by the values themselves
  x.rows = rows;
  x.in = w.size(1);
  x.codes = fp8_codes(rows * x.in);
  x.out = {codes_of(x.codes), xs.scale, forward ? xs.step_amax : nullptr, Fp8Format::E4M3};
  return x;
}

Tensor fp8_linear_forward_produced(const Var& weight, const Fp8ProducedInput& x, const Tensor& w,
                                   const Tensor* residual, const Shape& shape, DType dtype) {
  HGRN_CHECK(x.codes.defined() && x.out.amax && x.in == w.size(1) && !shape.empty() && shape.back() == w.size(0) &&
                 shape_numel(shape) == x.rows * w.size(0),
             "fp8 linear: produced input of ", x.rows, " rows does not fit the output ", shape_str(shape));
  Tensor y = Tensor::empty(shape, dtype, active_scope->device);
  forward_from_codes(weight, x.codes, x.rows, w, residual, y);
  return y;
}

void fp8_linear_weight_gradient_produced(const Var& weight, const Fp8OutputGradient& dy, int64_t first_column,
                                         const Fp8ProducedInput& x, float beta, Tensor& dw) {
  HGRN_CHECK(x.codes.defined() && x.rows == dy.rows && x.in == dw.size(1) && dw.dtype() == DType::F32 &&
                 dw.is_contiguous() && first_column >= 0 && first_column + dw.size(0) <= dy.width,
             "fp8 linear: the weight gradient ", shape_str(dw.shape()), " does not fit columns ", first_column, "..",
             first_column + dw.size(0), " of ", dy.width, " and the produced input of ", x.rows, " rows of ", x.in);
  const Tensor xq_t = fp8_codes(x.rows * x.in);  // Xᵀ [in, rows]
  transpose_codes(codes_of(x.codes), x.rows, x.in, codes_of(xq_t));
  weight_gradient_from_codes(weight, dy, first_column, xq_t, beta, dw);
}

void fp8_cast_into_codes_cpu(const Tensor& values, const Fp8CodesOut& codes) {
  HGRN_CHECK(values.device() == Device::CPU && codes.codes && codes.scale, "fp8 cast into codes: CPU values, a buffer "
             "and a scale wanted");
  const Tensor v32 = values.dtype() == DType::F32 ? values : values.to(DType::F32);
  const float* v = v32.data<float>();
  fp8_quantize(v, v32.numel(), *codes.scale, codes.format, codes.codes);
  if (codes.amax) *codes.amax = std::max(*codes.amax, fp8_amax(v, v32.numel()));
}

void fp8_set_amax_reduction(const std::function<void(float*, int64_t)>& reduce_max) {
  HGRN_CHECK(active_scope, "fp8 linear: an amax reduction needs an active Fp8LinearScope");
  active_scope->reduce_max = reduce_max;
}

void fp8_end_step() {
  if (!active_scope) return;
  Scope& s = *active_scope;
  s.weight_codes.clear();  // the weights' scales move here, and their values have moved (the step's update)
  if (s.used == 0) return;
  for (FormatStates* f : {&s.forward, &s.gradient}) {
    const int64_t tensors = f == &s.forward ? 2 * s.used : s.used;
    if (s.reduce_max) s.reduce_max(f->step_amax.data<float>(), tensors);
    update_scales(*f, tensors, s.recipe);
  }
}

// The arrays in a checkpoint: "forward_<field>", "gradient_<field>", the first `tensors` states of each.
static const char* const kSavedFields[] = {"history", "positions", "scales"};

static Tensor& field_of(FormatStates& f, const std::string& field) {
  return field == "history" ? f.history : field == "positions" ? f.positions : f.scales;
}

std::vector<std::pair<std::string, Tensor>> fp8_scaling_save(const std::vector<Var>& params) {
  std::vector<std::pair<std::string, Tensor>> out;
  if (!active_scope) return out;
  Scope& s = *active_scope;
  std::unordered_map<const Variable*, int64_t> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i].get(), static_cast<int64_t>(i));
  Tensor owners = Tensor::empty({s.used}, DType::I64);
  for (const auto& [weight, slot] : s.slot) {
    const auto found = index.find(weight);
    HGRN_CHECK(found != index.end(), "fp8 scaling: a weight with a scaling state is not among the model's parameters");
    owners.data<int64_t>()[slot] = found->second;
  }
  out.emplace_back("slot_params", owners);
  for (FormatStates* f : {&s.forward, &s.gradient}) {
    const int64_t tensors = f == &s.forward ? 2 * s.used : s.used;
    for (const char* field : kSavedFields) {
      const int64_t per_tensor = std::string(field) == "history" ? s.recipe.history_length : 1;
      out.emplace_back(f->name + "_" + field,
                       field_of(*f, field).rows(0, tensors * per_tensor).to(Device::CPU));
    }
  }
  return out;
}

void fp8_scaling_restore(const std::vector<std::pair<std::string, Tensor>>& saved, const std::vector<Var>& params,
                         const std::string& source) {
  HGRN_CHECK(active_scope, "fp8 scaling: restoring from ", source, " needs an active Fp8LinearScope");
  Scope& s = *active_scope;
  const auto find = [&](const std::string& name) -> const Tensor& {
    for (const auto& [n, t] : saved)
      if (n == name) return t;
    throw Error(detail::concat(source, ": the FP8 scaling states lack '", name, "'"));
  };
  const Tensor& owners = find("slot_params");
  HGRN_CHECK(owners.dtype() == DType::I64 && owners.dim() == 1 && owners.size(0) <= s.capacity, source,
             ": the FP8 scaling states' slot_params is ", dtype_name(owners.dtype()), " ", shape_str(owners.shape()),
             ": expected int64 [at most ", s.capacity, "]");
  const int64_t used = owners.size(0);
  s.slot.clear();
  s.weight_codes.clear();  // cast at the scales being replaced
  for (int64_t i = 0; i < used; ++i) {
    const int64_t p = owners.data<int64_t>()[i];
    HGRN_CHECK(p >= 0 && p < static_cast<int64_t>(params.size()), source, ": FP8 scaling state ", i,
               " belongs to parameter ", p, ", but the model has ", params.size());
    s.slot.emplace(params[p].get(), i);
  }
  s.used = used;
  for (FormatStates* f : {&s.forward, &s.gradient}) {
    const int64_t tensors = f == &s.forward ? 2 * used : used;
    for (const char* field : kSavedFields) {
      const std::string name = f->name + "_" + field;
      const int64_t per_tensor = std::string(field) == "history" ? s.recipe.history_length : 1;
      const Tensor& t = find(name);
      Tensor& target = field_of(*f, field);
      HGRN_CHECK(t.dtype() == target.dtype() && t.dim() == 1 && t.size(0) == tensors * per_tensor, source,
                 ": the FP8 scaling array ", name, " is ", dtype_name(t.dtype()), " ", shape_str(t.shape()),
                 ": expected ", dtype_name(target.dtype()), " [", tensors * per_tensor, "] (", tensors,
                 " tensors; amax history ", s.recipe.history_length, ")");
      target.rows(0, tensors * per_tensor).copy_from(on_device(t, s.device));
      if (std::string(field) == "history") {  // a tensor with an amax on record has its scale
        const Tensor h = t.to(DType::F32);
        for (int64_t i = 0; i < tensors; ++i)
          f->scaled[static_cast<size_t>(i)] =
              std::any_of(h.data<float>() + i * per_tensor, h.data<float>() + (i + 1) * per_tensor,
                          [](float a) { return a != 0.0f; });
      }
    }
    f->step_amax.zero();
    refresh_inverses(*f, tensors);
  }
}

Fp8ScalingSnapshot fp8_scaling_snapshot(const Var& weight) {
  Fp8ScalingSnapshot out;
  if (!active_scope || !active_scope->slot.count(weight.get())) return out;
  const Scope& s = *active_scope;
  const int64_t slot = s.slot.at(weight.get()), h = s.recipe.history_length;
  const Tensor e4_scales = s.forward.scales.to(Device::CPU), e4_amax = s.forward.step_amax.to(Device::CPU),
               e5_scales = s.gradient.scales.to(Device::CPU), e5_amax = s.gradient.step_amax.to(Device::CPU),
               e4_history = s.forward.history.to(Device::CPU), e5_history = s.gradient.history.to(Device::CPU),
               e4_positions = s.forward.positions.to(Device::CPU), e5_positions = s.gradient.positions.to(Device::CPU);
  for (int role = 0; role < 3; ++role) {
    const bool e5 = role == 2;
    const int64_t i = e5 ? slot : 2 * slot + role;
    out.scales.push_back((e5 ? e5_scales : e4_scales).data<float>()[i]);
    out.step_amax.push_back((e5 ? e5_amax : e4_amax).data<float>()[i]);
    out.positions.push_back((e5 ? e5_positions : e4_positions).data<int64_t>()[i]);
    const float* history = (e5 ? e5_history : e4_history).data<float>() + i * h;
    out.amax_history.insert(out.amax_history.end(), history, history + h);
  }
  return out;
}

}  // namespace hgrn
