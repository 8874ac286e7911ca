// tensor.cpp: Tensor construction, views, copies and element access.
#include "core/tensor.h"

#include <algorithm>
#include <sstream>

#include "core/allocator.h"
#include "core/checked_math.h"
#ifdef HGRN_WITH_CUDA
#include "kernels/cast.h"
#endif

namespace hgrn {

const char* device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n = checked_mul(n, s, "the element count of a tensor shape");  // cheap: text only on failure
  return n;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Storage::Storage(size_t n, Device dev) : bytes(n), device(dev) { data = device_alloc(n, dev); }
Storage::~Storage() { device_free(data, device); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) HGRN_CHECK(s >= 0, "negative size in shape ", shape_str(shape));
  Tensor t;
  const int64_t bytes =
      checked_mul(shape_numel(shape), static_cast<int64_t>(dtype_size(dtype)), "the byte size of a tensor");
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

int64_t Tensor::size(int64_t axis) const {
  int64_t d = dim();
  if (axis < 0) axis += d;
  HGRN_CHECK(axis >= 0 && axis < d, "axis ", axis, " out of range for shape ", shape_str(shape_));
  return shape_[axis];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

bool Tensor::is_row_strided() const {
  const int64_t d = dim();
  if (d == 0) return true;
  if (strides_[d - 1] != 1 && shape_[d - 1] > 1) return false;
  if (d >= 2 && strides_[d - 2] < shape_[d - 1]) return false;
  for (int64_t i = 0; i + 2 < d; ++i)
    if (strides_[i] != strides_[i + 1] * shape_[i + 1]) return false;
  return true;
}

int64_t Tensor::row_stride() const {
  HGRN_CHECK(is_row_strided(), "tensor ", shape_str(shape_), " with strides ", shape_str(strides_),
             " is not row-strided");
  return dim() >= 2 ? strides_[dim() - 2] : (dim() == 1 ? shape_[0] : 1);
}

void* Tensor::raw_data() const {
  HGRN_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  HGRN_CHECK(is_contiguous(), "reshape of a non-contiguous tensor");
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      HGRN_CHECK(infer < 0, "reshape: more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    HGRN_CHECK(known > 0 && numel() % known == 0, "reshape ", shape_str(shape_), " -> ", shape_str(shape));
    s[infer] = numel() / known;
  }
  HGRN_CHECK(shape_numel(s) == numel(), "reshape ", shape_str(shape_), " -> ", shape_str(shape), ": sizes differ");
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::select_row(int64_t index) const {
  HGRN_CHECK(is_contiguous() && dim() >= 1, "select_row needs a contiguous tensor of at least one axis");
  HGRN_CHECK(index >= 0 && index < shape_[0], "row ", index, " out of range for shape ", shape_str(shape_));
  Tensor t = *this;
  t.shape_ = Shape(shape_.begin() + 1, shape_.end());
  t.strides_ = contiguous_strides(t.shape_);
  t.offset_ = offset_ + index * shape_numel(t.shape_);
  return t;
}

Tensor Tensor::flat_view(int64_t begin, int64_t count) const {
  HGRN_CHECK(is_contiguous(), "flat_view of a non-contiguous tensor");
  HGRN_CHECK(begin >= 0 && count >= 0 && begin + count <= numel(), "flat_view [", begin, ", ", begin + count,
             ") out of range for ", numel(), " elements");
  Tensor t = *this;
  t.shape_ = {count};
  t.strides_ = contiguous_strides(t.shape_);
  t.offset_ = offset_ + begin;
  return t;
}

Tensor Tensor::columns(int64_t begin, int64_t count) const {
  HGRN_CHECK(is_contiguous() && dim() >= 1, "columns() needs a contiguous tensor of at least one axis, got ",
             shape_str(shape_));
  HGRN_CHECK(begin >= 0 && count >= 0 && begin + count <= shape_.back(), "columns [", begin, ", ", begin + count,
             ") out of range for a last axis of ", shape_.back());
  Tensor t = *this;
  t.shape_.back() = count;
  t.offset_ = offset_ + begin;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  HGRN_CHECK(is_contiguous() && dim() >= 1, "rows() needs a contiguous tensor of at least one axis, got ",
             shape_str(shape_));
  HGRN_CHECK(begin >= 0 && count >= 0 && begin + count <= shape_[0], "rows [", begin, ", ", begin + count,
             ") out of range for ", shape_[0], " rows");
  Tensor t = *this;
  t.shape_[0] = count;
  t.offset_ = offset_ + begin * (shape_[0] ? numel() / shape_[0] : 0);
  return t;
}

Tensor Tensor::adjacent_rows(const std::vector<Tensor>& parts) {
  if (parts.empty() || !parts[0].defined()) return Tensor();
  const Tensor& first = parts[0];
  Tensor t = first;
  if (!first.is_contiguous() || first.dim() < 1) return Tensor();
  for (size_t i = 1; i < parts.size(); ++i) {
    const Tensor& p = parts[i];
    if (!p.defined() || p.storage_ != first.storage_ || p.dtype_ != first.dtype_ || !p.is_contiguous() ||
        p.dim() != first.dim() || !std::equal(p.shape_.begin() + 1, p.shape_.end(), first.shape_.begin() + 1) ||
        p.offset_ != t.offset_ + t.numel())
      return Tensor();
    t.shape_[0] += p.shape_[0];
  }
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {  // on the tensor's own device
  Tensor t = empty(shape_, dtype, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

// Reads element i of a contiguous CPU buffer of any dtype as double.
static double load_as_double(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::BF16: return static_cast<float>(static_cast<const bf16*>(p)[i]);
    case DType::F64: return static_cast<const double*>(p)[i];
    case DType::I32: return static_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0;
}

static void store_from_double(void* p, DType d, int64_t i, double v) {
  switch (d) {
    case DType::F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DType::BF16: static_cast<bf16*>(p)[i] = bf16(static_cast<float>(v)); break;
    case DType::F64: static_cast<double*>(p)[i] = v; break;
    case DType::I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
  }
}

void Tensor::copy_from(const Tensor& src) {
  HGRN_CHECK(src.shape_ == shape_, "copy_from: shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  if (!(src.is_contiguous() && is_contiguous())) {
    HGRN_CHECK(src.dtype_ == dtype_ && src.is_row_strided() && is_row_strided(),
               "copy_from needs contiguous tensors, or row-strided ones of one dtype: ", dtype_name(src.dtype_), " ",
               shape_str(src.shape_), " (strides ", shape_str(src.strides_), ") into ", dtype_name(dtype_), " ",
               shape_str(shape_), " (strides ", shape_str(strides_), ")");
    const size_t size = dtype_size(dtype_);
    const int64_t width = dim() ? shape_.back() : 1;
    device_copy_rows(raw_data(), device(), row_stride() * size, src.raw_data(), src.device(), src.row_stride() * size,
                     width * size, width ? numel() / width : 0);
    return;
  }
  if (src.dtype_ == dtype_) {
    device_copy(raw_data(), device(), src.raw_data(), src.device(), nbytes());
    return;
  }
  if (device() == Device::CUDA && src.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
    cuda_cast(src.raw_data(), src.dtype_, raw_data(), dtype_, numel());
    return;
#endif
  }
  HGRN_CHECK(device() == Device::CPU && src.device() == Device::CPU,
             "copy_from: a dtype-converting copy between devices: convert on one side first (",
             dtype_name(src.dtype_), " on ", device_name(src.device()), " -> ", dtype_name(dtype_), " on ",
             device_name(device()), ")");
  int64_t n = numel();
  const void* s = src.raw_data();
  void* d = raw_data();
  if (src.dtype_ == DType::BF16 && dtype_ == DType::F32) {
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(d)[i] = static_cast<const bf16*>(s)[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_from_double(d, dtype_, i, load_as_double(s, src.dtype_, i));
}

void Tensor::fill(double value) {
  if (device() == Device::CPU) {
    void* d = raw_data();
    for (int64_t i = 0, n = numel(); i < n; ++i) store_from_double(d, dtype_, i, value);
    return;
  }
#ifdef HGRN_WITH_CUDA
  HGRN_CHECK(is_contiguous(), "fill on the GPU needs a contiguous tensor");
  cuda_fill(raw_data(), dtype_, value, numel());
#else
  Tensor host = full(shape_, value, dtype_, Device::CPU);
  copy_from(host);
#endif
}

void Tensor::zero() {
  if (!is_contiguous()) {  // a row-strided view: row by row (on the GPU one 2-D memset)
    HGRN_CHECK(is_row_strided(), "zero: tensor ", shape_str(shape_), " with strides ", shape_str(strides_),
               " is neither contiguous nor row-strided");
    const size_t size = dtype_size(dtype_);
    const int64_t width = shape_.back();
    device_zero_rows(raw_data(), device(), row_stride() * size, width * size, width ? numel() / width : 0);
    return;
  }
  if (device() == Device::CPU) {
    std::memset(raw_data(), 0, nbytes());
    return;
  }
#ifdef HGRN_WITH_CUDA
  HGRN_CHECK(is_contiguous(), "zero on the GPU needs a contiguous tensor");
  cuda_zero(raw_data(), nbytes());  // a memset: all-zero bytes are 0 in every dtype
#else
  fill(0.0);
#endif
}

// The element offset of flat (row-major) index i of a contiguous or row-strided tensor.
static int64_t strided_offset(const Tensor& t, int64_t i) {
  if (t.is_contiguous()) return i;
  const int64_t width = t.size(-1);
  return i / width * t.row_stride() + i % width;
}

double Tensor::item(int64_t flat_index) const {
  HGRN_CHECK(flat_index >= 0 && flat_index < numel(), "item(", flat_index, ") out of range for shape ",
             shape_str(shape_));
  const int64_t i = strided_offset(*this, flat_index);
  if (device() == Device::CUDA) {  // one element through a small synchronous copy (a loss, a norm)
    alignas(8) unsigned char element[8];
    const size_t size = dtype_size(dtype_);
    device_copy(element, Device::CPU, static_cast<const char*>(raw_data()) + i * size, Device::CUDA, size);
    return load_as_double(element, dtype_, 0);
  }
  return load_as_double(raw_data(), dtype_, i);
}

void Tensor::set_item(int64_t flat_index, double value) {
  HGRN_CHECK(device() == Device::CPU, "set_item() writes CPU tensors");
  HGRN_CHECK(flat_index >= 0 && flat_index < numel(), "set_item(", flat_index, ") out of range for shape ",
             shape_str(shape_));
  store_from_double(raw_data(), dtype_, strided_offset(*this, flat_index), value);
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor host = device() == Device::CPU && is_contiguous() ? *this : to(Device::CPU);
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[i] = load_as_double(host.raw_data(), dtype_, i);
  return v;
}

}  // namespace hgrn
