// cuda_check.h: CUDA_CHECK and CUBLAS_CHECK, the checks around every CUDA runtime and cuBLAS(Lt) call: a failure
// becomes an hgrn::Error that says which call failed, why, where, and (for launch failures) what to try.
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

// After a kernel launch: reports a bad launch configuration at once (asynchronous faults show at the next sync).
#define CUDA_CHECK_LAUNCH(kernel_name)                                                                        \
  do {                                                                                                        \
    cudaError_t err_ = cudaGetLastError();                                                                    \
    if (err_ != cudaSuccess)                                                                                  \
      throw ::hgrn::Error(::hgrn::detail::concat("CUDA kernel ", kernel_name, " failed to launch: ",          \
                                                 cudaGetErrorString(err_), " [", __FILE__, ":", __LINE__, "]")); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                                   \
  do {                                                                                                       \
    cublasStatus_t st_ = (call);                                                                             \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                        \
      throw ::hgrn::Error(::hgrn::detail::concat("cuBLAS error in ", #call, ": status ", static_cast<int>(st_), \
                                                 " (see cublasStatus_t) [", __FILE__, ":", __LINE__, "]"));  \
  } while (0)
