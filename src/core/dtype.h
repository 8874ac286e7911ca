// dtype.h: the element types a Tensor can hold, their sizes and names, and the bf16 <-> fp32 conversion.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace hgrn {

enum class DType : uint8_t { F32, BF16, F64, I32, I64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType dtype_from_name(const std::string& name);  // throws on an unknown name
inline bool dtype_is_float(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F64; }

// bfloat16 storage type: the upper 16 bits of an IEEE fp32. Arithmetic happens in fp32.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) { bits = from_float(f); }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  // Round to nearest even, NaN stays NaN (quiet).
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
  }
};

// Maps a C++ type to its DType (used by Tensor::data<T>() to check the caller asked for the right type).
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::BF16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };

}  // namespace hgrn
