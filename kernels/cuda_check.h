// cuda_check.h: CUDA_CHECK, the check around every CUDA runtime call: a failure becomes an hgrn::Error that says
// which call failed, why, and where.
#pragma once
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess)                                                                              \
      throw ::hgrn::Error(::hgrn::detail::concat("CUDA error in ", #call, ": ", cudaGetErrorString(err_), \
                                                 " [", __FILE__, ":", __LINE__, "]"));                    \
  } while (0)
