// cublaslt_loader.cpp: hgrn's cuBLASLt entry points, forwarded to libcublasLt loaded with dlopen on first use.
// Linking libcublasLt directly runs its static initialisers in every process, about 0.1 s of CPU (it maps ~100 MB),
// even in `hgrn --help`, CPU runs and each CPU test; loaded on first use, only processes that use the GPU pay.
// Only the functions hgrn calls are defined here: a new cublasLt call fails to link until it is added below.
#include <dlfcn.h>

#include <cublasLt.h>

#include <mutex>
#include <string>

#include "core/check.h"

namespace hgrn {
namespace {

#define HGRN_STR2(x) #x
#define HGRN_STR(x) HGRN_STR2(x)
constexpr const char* kSoname = "libcublasLt.so." HGRN_STR(CUBLAS_VER_MAJOR);

void* library() {
  static void* handle = nullptr;
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    handle = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
#ifdef HGRN_CUDA_LIBRARY_DIR
    // Not on the loader's search path: the toolkit hgrn was built against.
    if (!handle) handle = dlopen((std::string(HGRN_CUDA_LIBRARY_DIR) + "/" + kSoname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (!handle) error = dlerror();
  });
  HGRN_CHECK(handle, "cannot load cuBLASLt (", kSoname, "): ", error,
             "; add the CUDA Toolkit's library directory to LD_LIBRARY_PATH");
  return handle;
}

template <typename Fn>
Fn symbol(const char* name) {
  void* f = dlsym(library(), name);
  HGRN_CHECK(f, "cuBLASLt (", kSoname, ") has no ", name);
  return reinterpret_cast<Fn>(f);
}

}  // namespace
}  // namespace hgrn

// Each forwarder looks its function up once; the lookup throws hgrn::Error if the library or symbol is missing.
#define HGRN_FORWARD(name, params, args)                                       \
  extern "C" cublasStatus_t name params {                                      \
    static const auto fn = ::hgrn::symbol<decltype(&::name)>(#name);           \
    return fn args;                                                            \
  }

HGRN_FORWARD(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
HGRN_FORWARD(cublasLtMatmul,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
              const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream),
             (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
              workspaceSizeInBytes, stream))
HGRN_FORWARD(cublasLtMatmulAlgoConfigGetAttribute,
             (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
              size_t sizeInBytes, size_t* sizeWritten),
             (algo, attr, buf, sizeInBytes, sizeWritten))
HGRN_FORWARD(cublasLtMatmulAlgoGetHeuristic,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
              cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
              cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
             (handle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
              heuristicResultsArray, returnAlgoCount))
HGRN_FORWARD(cublasLtMatmulDescCreate,
             (cublasLtMatmulDesc_t * matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType),
             (matmulDesc, computeType, scaleType))
HGRN_FORWARD(cublasLtMatmulDescSetAttribute,
             (cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void* buf,
              size_t sizeInBytes),
             (matmulDesc, attr, buf, sizeInBytes))
HGRN_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
HGRN_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
HGRN_FORWARD(cublasLtMatmulPreferenceSetAttribute,
             (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
              size_t sizeInBytes),
             (pref, attr, buf, sizeInBytes))
HGRN_FORWARD(cublasLtMatrixLayoutCreate,
             (cublasLtMatrixLayout_t * matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
             (matLayout, type, rows, cols, ld))
