// optimizer.cpp: the AdamW update, global gradient-norm clipping and the decay groups.
// Parameters on the GPU (fp32, moments fp32 on the GPU too) are updated, measured and scaled by one multi-tensor
// launch each (kernels/adamw.cu), with the CPU loops' arithmetic; CPU parameters take the loops below unchanged.
#include "train/optimizer.h"

#include "core/allocator.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <string>

#include "kernels/adamw.h"  // AdamWStep in every build; its launchers only with HGRN_WITH_CUDA

namespace hgrn {

namespace {

// Element count above which the element-wise loops are split across OpenMP threads; below it the thread
// start-up costs more than the loop.
constexpr int64_t kParallelThreshold = 1 << 15;
// The norm is summed in chunks of this many elements, then the chunk sums in order: the result does not depend
// on how many threads ran the chunks.
constexpr int64_t kNormChunk = 1 << 16;

std::string param_label(const ParamRef& ref, size_t index) {
  if (ref.param && !ref.param->name.empty()) return detail::concat("'", ref.param->name, "'");
  return detail::concat("#", index);
}

// The gradient element that scale_in_place(·, factor) would leave: exactly the element for factor 1.
template <typename T>
inline double scaled(T g, double factor) {
  return static_cast<double>(static_cast<T>(static_cast<double>(g) * factor));
}

// The bias corrections enter as torch's fused AdamW applies them, through two per-step constants (AdamWStep): the
// step lr·m̂/(√v̂ + eps) is step_size·m / (√v · inv_sqrt_bc2 + eps) with step_size = lr/bc1, inv_sqrt_bc2 = 1/√bc2,
// one division per element where m/bc1, v/bc2 and the quotient took three (the GPU kernel's fp64 divisions).
template <typename T>
void adamw_update(T* param, const T* grad, T* first, T* second, int64_t n, double beta1, double beta2, double eps,
                  double decay_factor, const AdamWStep& step, double grad_scale) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const double g = scaled(grad[i], grad_scale);
    const double m = beta1 * static_cast<double>(first[i]) + (1.0 - beta1) * g;
    const double v = beta2 * static_cast<double>(second[i]) + (1.0 - beta2) * g * g;
    first[i] = static_cast<T>(m);
    second[i] = static_cast<T>(v);
    const double denom = std::sqrt(v) * step.inv_sqrt_bias_correction2 + eps;
    // Decoupled decay first, then the Adam step, as torch.optim.AdamW orders them.
    double p = static_cast<double>(param[i]) * decay_factor;
    p -= step.step_size * m / denom;
    param[i] = static_cast<T>(p);
  }
}

template <typename T>
double sum_of_squares(const T* data, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kNormChunk, end = std::min(n, begin + kNormChunk);
    double s = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const double x = data[i];
      s += x * x;
    }
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

template <typename T>
void scale_in_place(T* data, int64_t n, double factor) {
#pragma omp parallel for schedule(static) if (n >= kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(scaled(data[i], factor));
}

void check_grad_matches(const ParamRef& ref, size_t index) {
  const Tensor& p = ref.param->value;
  const Tensor& g = ref.param->grad;
  HGRN_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype() && g.device() == p.device() && g.is_contiguous(),
             "optimizer: gradient of parameter ", param_label(ref, index), " is ", dtype_name(g.dtype()), " ",
             shape_str(g.shape()), " on ", device_name(g.device()), ", expected a contiguous ",
             device_name(p.device()), " ", dtype_name(p.dtype()), " ", shape_str(p.shape()));
}

// The elements of a parameter-shaped tensor that a ParamRef updates (all of them, or its ZeRO-1 range).
Tensor updated_range(const ParamRef& ref, const Tensor& full) {
  return ref.count < 0 ? full : full.flat_view(ref.begin, ref.count);
}

// Where the update rewrites the parameter's bf16 compute copy (linear's cast of it) along with the parameter: a GPU
// parameter updated whole, whose copy exists. The kernel writes the bits a cast of the updated value gives, so the
// copy stays valid and the next forward skips the cast (a launch and a pass over the weight). Null otherwise (the CPU,
// a ZeRO-1 range: the rest of the parameter arrives later), and the caller drops the copy for a cast at next use.
void* updated_bf16_copy(const ParamRef& ref) {
  const Tensor& p = ref.param->value;
  const Tensor& copy = ref.param->compute_copy;
  const bool whole = ref.begin == 0 && ref.updated_elements() == p.numel();
  if (!copy.defined() || !whole || p.device() != Device::CUDA || copy.device() != Device::CUDA ||
      copy.dtype() != DType::BF16 || !copy.is_contiguous() || copy.numel() != p.numel())
    return nullptr;
  return copy.raw_data();
}

#ifdef HGRN_WITH_CUDA
// A slot table on the device (cuda_upload_slot_table) and the launches' chunk count.
struct DeviceSlotTable {
  Tensor workspace;
  int64_t count = 0;
  long long chunks = 0;
  void* data() const { return workspace.raw_data(); }
};

// The GPU parameters' part of one multi-tensor launch.
struct GpuSlots {
  std::vector<MultiTensorSlot> slots;
  int64_t elements = 0;
  void add(const MultiTensorSlot& slot) {
    slots.push_back(slot);
    elements += slot.n;
  }
  bool same_as(const GpuSlots& other) const {
    return slots.size() == other.slots.size() &&
           std::memcmp(slots.data(), other.slots.data(), slots.size() * sizeof(MultiTensorSlot)) == 0;
  }
  // A workspace holding the table (waits for the copy).
  DeviceSlotTable upload() const {
    DeviceSlotTable t;
    t.count = static_cast<int64_t>(slots.size());
    const size_t bytes = cuda_multi_tensor_workspace_bytes(t.count, elements);
    t.workspace = Tensor::empty({static_cast<int64_t>((bytes + 7) / 8)}, DType::I64, Device::CUDA);
    t.chunks = cuda_upload_slot_table(slots.data(), t.count, t.data());
    return t;
  }
};
#else
struct GpuSlots {};
#endif

}  // namespace

#ifdef HGRN_WITH_CUDA
// The optimiser's slot table stays on the device from step to step: it is uploaded again (a host-device copy and a
// wait) only when a slot changes, not on every step.
struct AdamW::ResidentSlots {
  GpuSlots slots;
  DeviceSlotTable table;
  const DeviceSlotTable& for_slots(const GpuSlots& wanted) {
    if (!table.workspace.defined() || !slots.same_as(wanted)) {
      table = wanted.upload();
      slots = wanted;
    }
    return table;
  }
};
#else
struct AdamW::ResidentSlots {};
#endif

AdamW::AdamW(std::vector<ParamRef> params, AdamWConfig config)
    : params_(std::move(params)), config_(config), resident_(std::make_shared<ResidentSlots>()) {
  HGRN_CHECK(config_.beta1 >= 0.0 && config_.beta1 < 1.0, "AdamW: beta1 must be in [0, 1), got ", config_.beta1);
  HGRN_CHECK(config_.beta2 >= 0.0 && config_.beta2 < 1.0, "AdamW: beta2 must be in [0, 1), got ", config_.beta2);
  HGRN_CHECK(config_.eps > 0.0, "AdamW: eps must be positive, got ", config_.eps);
  HGRN_CHECK(config_.weight_decay >= 0.0, "AdamW: weight_decay must be non-negative, got ", config_.weight_decay);
  first_moments_.reserve(params_.size());
  second_moments_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& ref = params_[i];
    HGRN_CHECK(ref.param && ref.param->value.defined(), "AdamW: parameter ", param_label(ref, i), " is undefined");
    const Tensor& p = ref.param->value;
    HGRN_CHECK(p.dtype() == DType::F32 || p.dtype() == DType::F64, "AdamW: parameter ", param_label(ref, i), " is ",
               dtype_name(p.dtype()), "; parameters must be fp32 or fp64");
    HGRN_CHECK(p.device() == Device::CPU || p.dtype() == DType::F32, "AdamW: parameter ", param_label(ref, i),
               " is ", dtype_name(p.dtype()), " on the GPU, where parameters must be fp32");
    HGRN_CHECK(p.is_contiguous(), "AdamW: parameter ", param_label(ref, i), " is not contiguous");
    HGRN_CHECK(ref.count < 0 || (ref.begin >= 0 && ref.begin + ref.count <= p.numel()), "AdamW: element range [",
               ref.begin, ", ", ref.begin + ref.count, ") of parameter ", param_label(ref, i), " outside its ",
               p.numel(), " elements");
    const Shape moment_shape = ref.count < 0 ? p.shape() : Shape{ref.count};
    first_moments_.push_back(Tensor::zeros(moment_shape, p.dtype(), p.device()));
    second_moments_.push_back(Tensor::zeros(moment_shape, p.dtype(), p.device()));
  }
}

void AdamW::step(double lr, double grad_scale) {
  HGRN_CHECK(std::isfinite(grad_scale) && grad_scale > 0.0, "AdamW: gradient scale must be finite and positive, got ",
             grad_scale);
  update(lr, grad_scale, nullptr, 0.0);
}

std::function<double()> AdamW::clip_and_step(double lr, double max_norm,
                                             const std::function<double(double)>& total_over_ranks,
                                             const std::vector<Tensor>& guards) {
  for (const Tensor& guard : guards)
    HGRN_CHECK(guard.defined() && guard.numel() == 1, "AdamW::clip_and_step: a guard must be one value");
#ifdef HGRN_WITH_CUDA
  bool all_on_gpu = true, any = false;
  for (const Tensor& guard : guards)
    all_on_gpu = all_on_gpu && guard.device() == Device::CUDA && guard.dtype() == DType::F32;
  for (const ParamRef& ref : params_)
    if (has_gradient(ref.param) && ref.updated_elements() > 0) {
      any = true;
      const Device device = ref.param->grad.defined() ? ref.param->grad.device() : ref.param->value.device();
      all_on_gpu = all_on_gpu && device == Device::CUDA;
    }
  if (any && all_on_gpu && !total_over_ranks) {
    Tensor sum_of_squares = Tensor::empty({}, DType::F64, Device::CUDA);
    update(lr, 1.0, static_cast<double*>(sum_of_squares.raw_data()), max_norm, guards);
    // The device skips the whole update for a non-finite norm; the host learns of it here and takes back its count.
    return [this, sum_of_squares, counted = false]() mutable {
      const double norm = std::sqrt(sum_of_squares.item());
      if (!std::isfinite(norm) && !counted) --step_count_;
      counted = true;
      return norm;
    };
  }
#endif
  const GradNorm gn = grad_norm_and_clip_factor(params_, max_norm, total_over_ranks);
  bool guards_finite = true;
  for (const Tensor& guard : guards) guards_finite = guards_finite && std::isfinite(guard.item());
  if (!guards_finite) return [] { return std::nan(""); };
  if (std::isfinite(gn.norm)) step(lr, gn.clip_factor);
  return [norm = gn.norm] { return norm; };
}

void AdamW::update(double lr, double grad_scale, [[maybe_unused]] double* device_sum_of_squares,
                   [[maybe_unused]] double max_norm, [[maybe_unused]] const std::vector<Tensor>& guards) {
  HGRN_CHECK(std::isfinite(lr) && lr >= 0.0, "AdamW: learning rate must be finite and non-negative, got ", lr);
  const int64_t t = step_count_ + 1;
  const double bias_correction1 = 1.0 - std::pow(config_.beta1, static_cast<double>(t));
  const double bias_correction2 = 1.0 - std::pow(config_.beta2, static_cast<double>(t));
  const AdamWStep adam_step{lr / bias_correction1, 1.0 / std::sqrt(bias_correction2)};
  [[maybe_unused]] GpuSlots gpu;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& ref = params_[i];
    if (!has_gradient(ref.param)) continue;
    settle_grad(ref.param);
    check_grad_matches(ref, i);
    void* copy = updated_bf16_copy(ref);
    if (!copy) ref.param->invalidate_compute_copy();
    const int64_t n = ref.updated_elements();
    if (n == 0) continue;
    Tensor& p = ref.param->value;
    if (p.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      gpu.add({p.data<float>() + ref.begin, ref.param->grad.data<float>() + ref.begin,
               first_moments_[i].data<float>(), second_moments_[i].data<float>(), copy, n, ref.decay ? 1 : 0, 0});
      continue;
#else
      throw Error("AdamW::step: this hgrn was built without CUDA");
#endif
    }
    const double decay_factor = ref.decay ? 1.0 - lr * config_.weight_decay : 1.0;
    HGRN_DISPATCH_FLOAT(p.dtype(), "AdamW::step", [&] {
      adamw_update<scalar_t>(p.data<scalar_t>() + ref.begin, ref.param->grad.data<scalar_t>() + ref.begin,
                             first_moments_[i].data<scalar_t>(), second_moments_[i].data<scalar_t>(), n,
                             config_.beta1, config_.beta2, config_.eps, decay_factor, adam_step, grad_scale);
    });
  }
#ifdef HGRN_WITH_CUDA
  if (!gpu.slots.empty()) {
    const DeviceSlotTable& table = resident_->for_slots(gpu);
    // Measured with the update's own table: the same slots and order as grad_norm_and_clip_factor's.
    if (device_sum_of_squares) {
      cuda_grad_sum_of_squares(table.data(), table.count, table.chunks, device_sum_of_squares);
      for (const Tensor& guard : guards) cuda_poison_if_nonfinite(device_sum_of_squares, guard.data<float>());
    }
    cuda_adamw_update(table.data(), table.count, table.chunks, config_.beta1, config_.beta2, config_.eps,
                      1.0 - lr * config_.weight_decay, adam_step, grad_scale, device_sum_of_squares, max_norm);
  }
#endif
  step_count_ = t;
}

void AdamW::zero_grad() {
  for (const ParamRef& ref : params_) mark_grad_zero(ref.param);
}

void AdamW::load_state(std::vector<Tensor> first_moments, std::vector<Tensor> second_moments, int64_t step_count) {
  HGRN_CHECK(first_moments.size() == params_.size() && second_moments.size() == params_.size(),
             "AdamW::load_state: ", first_moments.size(), " first and ", second_moments.size(),
             " second moments for ", params_.size(), " parameters");
  HGRN_CHECK(step_count >= 0, "AdamW::load_state: negative step count ", step_count);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].param->value;
    for (const Tensor* moment : {&first_moments[i], &second_moments[i]}) {
      HGRN_CHECK(moment->defined() && moment->shape() == p.shape() && moment->dtype() == p.dtype(),
                 "AdamW::load_state: moment for parameter ", param_label(params_[i], i), " is ",
                 moment->defined() ? dtype_name(moment->dtype()) : "undefined", " ",
                 moment->defined() ? shape_str(moment->shape()) : "", ", expected ", dtype_name(p.dtype()), " ",
                 shape_str(p.shape()));
    }
  }
  // Copies onto the parameter's device (a checkpoint's moments arrive on the CPU), so the caller's tensors (e.g.
  // views of a checkpoint buffer) are never written through.
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& ref = params_[i];
    const Device device = ref.param->value.device();
    first_moments_[i] = updated_range(ref, first_moments[i]).to(device);
    second_moments_[i] = updated_range(ref, second_moments[i]).to(device);
  }
  step_count_ = step_count;
}

GradNorm grad_norm_and_clip_factor(const std::vector<ParamRef>& params, double max_norm,
                                   const std::function<double(double)>& total_over_ranks) {
  double total = 0.0;
  [[maybe_unused]] GpuSlots gpu;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRef& ref = params[i];
    HGRN_CHECK(ref.param, "clip_grad_norm: parameter ", param_label(ref, i), " is undefined");
    if (!has_gradient(ref.param) || ref.updated_elements() == 0) continue;
    settle_grad(ref.param);
    check_grad_matches(ref, i);
    const Tensor g = updated_range(ref, ref.param->grad);
    if (g.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      HGRN_CHECK(g.dtype() == DType::F32, "clip_grad_norm: GPU gradient of ", param_label(ref, i), " is ",
                 dtype_name(g.dtype()), ", expected fp32");
      MultiTensorSlot slot;
      slot.grad = g.data<float>();
      slot.n = g.numel();
      gpu.add(slot);
      continue;
#else
      throw Error("clip_grad_norm: this hgrn was built without CUDA");
#endif
    }
    total += HGRN_DISPATCH_FLOAT(g.dtype(), "clip_grad_norm",
                                 [&] { return sum_of_squares(g.data<scalar_t>(), g.numel()); });
  }
#ifdef HGRN_WITH_CUDA
  // The GPU's share is summed on the device (fixed order) and comes back as one number: the host needs the norm
  // anyway, for the clip decision and the log.
  if (!gpu.slots.empty()) {
    const DeviceSlotTable table = gpu.upload();
    double* device_total = cuda_multi_tensor_total(table.data(), table.count, table.chunks);
    cuda_grad_sum_of_squares(table.data(), table.count, table.chunks, device_total);
    double host_total = 0.0;
    device_copy(&host_total, Device::CPU, device_total, Device::CUDA, sizeof host_total);  // waits
    total += host_total;
  }
#endif
  if (total_over_ranks) total = total_over_ranks(total);
  const double norm = std::sqrt(total);
  // A non-finite norm is returned unclipped: scaling by max_norm / inf would silently zero the gradients, while
  // the caller can see the inf/nan and skip the step.
  const bool clip = max_norm > 0.0 && std::isfinite(norm) && norm > max_norm;
  return {norm, clip ? max_norm / (norm + 1e-6) : 1.0};
}

double clip_grad_norm(const std::vector<ParamRef>& params, double max_norm,
                      const std::function<double(double)>& total_over_ranks) {
  const GradNorm r = grad_norm_and_clip_factor(params, max_norm, total_over_ranks);
  if (r.clip_factor == 1.0) return r.norm;
  [[maybe_unused]] GpuSlots gpu;
  for (const ParamRef& ref : params) {
    if (!has_gradient(ref.param) || ref.updated_elements() == 0) continue;
    settle_grad(ref.param);
    const Tensor g = updated_range(ref, ref.param->grad);
    if (g.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      MultiTensorSlot slot;  // all GPU gradients at once, below
      slot.grad = g.data<float>();
      slot.n = g.numel();
      gpu.add(slot);
#endif
      continue;
    }
    HGRN_DISPATCH_FLOAT(g.dtype(), "clip_grad_norm",
                        [&] { scale_in_place(g.data<scalar_t>(), g.numel(), r.clip_factor); });
  }
#ifdef HGRN_WITH_CUDA
  if (!gpu.slots.empty()) {
    const DeviceSlotTable table = gpu.upload();
    cuda_scale_grads(table.data(), table.count, table.chunks, r.clip_factor);
  }
#endif
  return r.norm;
}

std::vector<ParamRef> make_param_groups(const std::vector<std::pair<ParamSpec, Var>>& params, bool decay_embeddings) {
  std::vector<ParamRef> refs;
  refs.reserve(params.size());
  for (const auto& [spec, var] : params) {
    HGRN_CHECK(var, "make_param_groups: parameter '", spec.name, "' has no variable");
    bool decay = false;
    switch (spec.group) {
      case ParamGroup::Mixer:
      case ParamGroup::Mlp:
      case ParamGroup::LmHead: decay = true; break;
      case ParamGroup::Norm:
      case ParamGroup::MixerVector:
      case ParamGroup::LowerBound: decay = false; break;
      case ParamGroup::Embedding: decay = decay_embeddings; break;
    }
    refs.push_back({var, decay});
  }
  return refs;
}

}  // namespace hgrn
