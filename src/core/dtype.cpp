// dtype.cpp: sizes and names of the element types.
#include "core/dtype.h"

#include <stdexcept>

namespace hgrn {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::F64: return "fp64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::F32, DType::BF16, DType::F64, DType::I32, DType::I64})
    if (name == dtype_name(d)) return d;
  throw std::invalid_argument("unknown dtype '" + name + "' (expected fp32, bf16, fp64, int32 or int64)");
}

}  // namespace hgrn
