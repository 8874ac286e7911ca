// tensor.h: an n-dimensional array (shape, strides, dtype, device) over reference-counted storage.
// Views share storage; ops in hgrn require contiguous inputs unless they say otherwise.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace hgrn {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device device);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// A block of memory on one device, freed through the allocator (core/allocator.h) when the last Tensor lets go.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor: defined() is false

  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::CPU);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  // Row-strided: the last axis has unit stride and its vectors (the rows: every index of the leading axes) lie
  // row_stride() elements apart, in order. A contiguous tensor is row-strided, and so is a columns() view of one.
  // copy_from, zero and the GPU kernels that take strided operands (the gates, the recurrence's v, SwiGLU) accept it.
  bool is_row_strided() const;
  int64_t row_stride() const;  // elements between consecutive rows; checks is_row_strided()
  // Another Tensor (a view, a copy of this handle) holds the same storage.
  bool storage_shared() const { return storage_.use_count() > 1; }

  void* raw_data() const;
  template <typename T>
  T* data() const {
    HGRN_CHECK(DTypeOf<T>::value == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ",
               dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(raw_data());
  }

  // Views (share storage). reshape needs a contiguous tensor; -1 in one place infers that size.
  Tensor reshape(const Shape& shape) const;
  Tensor select_row(int64_t index) const;  // index into axis 0 of a contiguous tensor: shape[1:]
  // Elements [begin, begin + count) of a contiguous tensor, flattened: a 1-D view (reshape it for another shape).
  Tensor flat_view(int64_t begin, int64_t count) const;
  // Columns [begin, begin + count) of the last axis of a contiguous tensor: a row-strided view whose rows keep the
  // full width as their stride (the blocks of a fused projection's output, ops/elementwise.h: split_columns).
  Tensor columns(int64_t begin, int64_t count) const;
  // Rows [begin, begin + count) of axis 0 of a contiguous tensor (a view).
  Tensor rows(int64_t begin, int64_t count) const;
  // Contiguous tensors of one dtype and trailing shape that lie one after another in one storage, as one tensor
  // stacked along axis 0 (a view, no copy); undefined when they do not lie so. Adjacent weights (ParamSpec::
  // adjacent_to_previous) are read this way as one GEMM operand.
  static Tensor adjacent_rows(const std::vector<Tensor>& parts);

  // Copies.
  Tensor clone() const;
  Tensor to(DType dtype) const;    // converting copy on the same device (always copies)
  Tensor to(Device device) const;  // copy across devices
  // Same shape; converts dtype within one device. Both contiguous, or (same dtype) both row-strided.
  void copy_from(const Tensor& src);
  void fill(double value);
  void zero();  // contiguous or row-strided

  // Element access for tests and small host code (any float/int dtype, converts through double), by row-major flat
  // index (of a contiguous or row-strided tensor). item() also reads one element of a GPU tensor (a synchronous copy);
  // set_item is CPU only.
  double item(int64_t flat_index = 0) const;
  void set_item(int64_t flat_index, double value);
  std::vector<double> to_double_vector() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  HGRN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DTypeOf<T>::value);
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

// t itself when it already lives on `device`, else a copy there (inputs and targets follow the model's device).
inline Tensor on_device(const Tensor& t, Device device) { return t.device() == device ? t : t.to(device); }

// Calls f.template operator()<T>() with T the C++ type of a floating dtype computed on the CPU (fp32 or fp64).
#define HGRN_DISPATCH_FLOAT(dtype, NAME, ...)                                                 \
  [&] {                                                                                        \
    switch (dtype) {                                                                           \
      case ::hgrn::DType::F32: { using scalar_t = float; return __VA_ARGS__(); }              \
      case ::hgrn::DType::F64: { using scalar_t = double; return __VA_ARGS__(); }             \
      default:                                                                                 \
        throw ::hgrn::Error(std::string(NAME) + ": no CPU kernel for dtype " +                 \
                            ::hgrn::dtype_name(dtype) + " (use fp32 or fp64)");               \
    }                                                                                          \
  }()

}  // namespace hgrn
