// hgru2_test_shape.h: the problem size of the HGRU2 recurrence's GPU tests (test_hgru2_recurrence_cuda.cpp,
// test_gated_recurrence_cuda.cpp), printable for their failure messages.
#pragma once
#include <cstdint>
#include <string>

namespace hgrn::testing {

struct Hgru2Shape {
  int64_t batch, time, heads, key_dim, value_dim;
  std::string str() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(time) + " H=" + std::to_string(heads) +
           " K=" + std::to_string(key_dim) + " V=" + std::to_string(value_dim);
  }
};

}  // namespace hgrn::testing
