// cuda_context.cu: the compute stream, the cuBLASLt handle and workspace, and the device properties (see
// cuda_context.h). One GPU per process: multi-GPU runs use one process per GPU (mpirun).
#include <atomic>

#include "core/allocator.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace hgrn {

namespace {
struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 32u << 20;  // cuBLASLt's recommendation for Hopper is 32 MiB
  cudaDeviceProp props{};
  CudaContext() {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&props, device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&lt));
    CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  }
  // Deliberately never destroyed: the CUDA runtime may already be shut down when static destructors run.
};
std::atomic<bool> context_created{false};
CudaContext& context() {
  static CudaContext* ctx = [] {
    CudaContext* c = new CudaContext();
    context_created = true;
    return c;
  }();
  return *ctx;
}
}  // namespace

void cuda_use_device(int index) {
  HGRN_CHECK(!context_created, "cuda_use_device(", index, ") after the GPU was already in use");
  CUDA_CHECK(cudaSetDevice(index));
}

cudaStream_t cuda_stream() { return context().stream; }
cublasLtHandle_t cublaslt_handle() { return context().lt; }
void* cublaslt_workspace(size_t* bytes) {
  *bytes = context().workspace_bytes;
  return context().workspace;
}
const cudaDeviceProp& cuda_device_properties() { return context().props; }

int cublaslt_algorithms(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                        cublasLtMatrixLayout_t c, int requested, cublasLtMatmulHeuristicResult_t* results) {
  size_t workspace_bytes = 0;
  cublaslt_workspace(&workspace_bytes);
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof workspace_bytes));
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), op, a, b, c, c, pref, requested, results, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  return found;
}

// Nothing to wait for before the first GPU use (and on a CPU-only run no CUDA context is ever created).
void device_synchronize() {
  if (context_created) CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
}

std::string cuda_device_name() { return context().props.name; }

}  // namespace hgrn
