// cuda_check.h: CUDA_CHECK and CUBLAS_CHECK, the checks around every CUDA runtime and cuBLAS(Lt) call: a failure
// becomes an hgrn::Error that says which call failed, why and where (kernel launches: launch_kernel, launch.cuh).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(call)                                                                                  \
  do {                                                                                                    \
    cudaError_t err_ = (call);                                                                            \
    if (err_ != cudaSuccess)                                                                              \
      throw ::hgrn::Error(::hgrn::detail::concat("CUDA error in ", #call, ": ", cudaGetErrorString(err_), \
                                                 " [", __FILE__, ":", __LINE__, "]"));                    \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                   \
  do {                                                                                                       \
    cublasStatus_t st_ = (call);                                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                        \
      throw ::hgrn::Error(::hgrn::detail::concat("cuBLAS error in ", #call, ": status ", static_cast<int>(st_), \
                                                 " (see cublasStatus_t) [", __FILE__, ":", __LINE__, "]"));  \
  } while (0)
