// kernel_chain_bench.cu: what a boundary costs in a CUDA graph of 130 small dependent kernels (a batch-1 decoding
// step's count at hgrn2-385m): each kernel stages the previous one's 1024-wide output in every block, each warp makes
// its columns and writes them; optionally each warp first reads its own slice of weights. Four ways to chain them:
// plain launches; programmatic dependents that wait, then allow the next (the small-batch GEMV's order); allow, then
// wait; allow and never wait, the outputs written as (value, tag) words that the readers poll. `fanout` instead asks
// what readers of one line cost: programmatic dependents at 2 blocks an SM, each output written as R copies and block
// b reading copy b mod R, staged by each block or by each warp. Standalone:
//   nvcc -O3 -arch=sm_90 -o kernel_chain_bench tools/kernel_chain_bench.cu && ./kernel_chain_bench [fanout]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void gdc_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void gdc_allow() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// How a kernel joins the chain. kFlagsFirst: the chain's first kernel in kFlags, which writes tagged words and reads
// nothing.
enum Chain { kPlain, kWaitAllow, kAllowWait, kFlags, kFlagsFirst };

struct Args {
  const float* in;
  float* out;  // plain and dependents
  const unsigned long long* fin;
  unsigned long long* fout;  // flagged
  const unsigned* epoch;
  int tag;  // flagged: words carry epoch * 256 + tag
  int n, k, mode;
  const int4* w;
  long long w_int4_per_warp;  // optional weights: each warp reads its slice before staging
  int replicas;               // plain and dependents: the output written this many times, replica_stride apart
  long long replica_stride;
  bool warp_staged;  // each warp reads all of the input (into a sum: no shared memory, no barrier)
};

__global__ void __launch_bounds__(1024) chain_kernel(Args a) {
  __shared__ float x[4096];
  const int lane = threadIdx.x & 31;
  const int gw = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, total = gridDim.x * (blockDim.x / 32);
  int wsum = 0;
  if (a.w) {
    const int4* wp = a.w + (long long)gw * a.w_int4_per_warp;
    for (long long i = lane; i < a.w_int4_per_warp; i += 32) {
      int4 v = __ldg(wp + i);
      wsum += v.x ^ v.w;
    }
  }
  if (a.mode == kWaitAllow) {
    gdc_wait();
    gdc_allow();
  } else if (a.mode == kAllowWait) {
    gdc_allow();
    gdc_wait();
  } else if (a.mode == kFlags) {
    gdc_allow();
  }
  if (a.mode == kFlagsFirst) {
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) x[i] = 0.f;
  } else if (a.mode < kFlags && a.warp_staged) {
    const float* in = a.in + (long long)(blockIdx.x % a.replicas) * a.replica_stride;
    float v = 0.f;
    for (int i = lane; i < a.k; i += 32) v += __ldcg(in + i);
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) x[i] = v;  // this thread's own slots: no barrier needed
  } else if (a.mode < kFlags) {
    const float* in = a.in + (long long)(blockIdx.x % a.replicas) * a.replica_stride;
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) x[i] = __ldcg(in + i);
  } else {
    const unsigned want = *a.epoch * 256u + (unsigned)(a.tag - 1);
    for (int i = threadIdx.x; i < a.k; i += blockDim.x) {
      unsigned long long v;
      do {
        v = ld_relaxed(a.fin + i);
      } while ((unsigned)(v >> 32) != want);
      x[i] = __uint_as_float((unsigned)v);
    }
  }
  if (!a.warp_staged) __syncthreads();
  for (int j = gw; j < a.n; j += total) {
    float s = 0.f;
    for (int i = lane; i < a.k; i += 32) s += x[a.warp_staged ? threadIdx.x % a.k : i] * 1e-3f;
    for (int off = 16; off; off >>= 1) s += __shfl_xor_sync(~0u, s, off);
    s += (float)(wsum & 1) * 1e-9f;
    if (lane == 0) {
      if (a.mode < kFlags)
        for (int r = 0; r < a.replicas; ++r) __stcg(a.out + r * a.replica_stride + j, s * 0.5f + 1.f);
      else
        st_relaxed(a.fout + j,
                   ((unsigned long long)(*a.epoch * 256u + (unsigned)a.tag) << 32) | __float_as_uint(s * 0.5f + 1.f));
    }
  }
}

int main(int argc, char** argv) {
  const bool fanout = argc > 1 && std::strcmp(argv[1], "fanout") == 0;
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int kernels = 130, n = 1024, kMaxReplicas = 8;
  const long long replica_stride = 4096 + 64;  // floats: copies 16 KB and two lines apart
  float* bufs;
  unsigned long long* fbufs;
  unsigned* epoch;
  int4* w;
  CK(cudaMalloc(&bufs, 2 * kMaxReplicas * replica_stride * 4));
  CK(cudaMemset(bufs, 0, 2 * kMaxReplicas * replica_stride * 4));
  CK(cudaMalloc(&fbufs, 2 * 4096 * 8));
  CK(cudaMemset(fbufs, 0, 2 * 4096 * 8));
  CK(cudaMalloc(&epoch, 4));
  const size_t wbytes = 1ull << 30;
  CK(cudaMalloc(&w, wbytes));
  CK(cudaMemset(w, 1, wbytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  unsigned host_epoch = 1;
  // The median step over 25 replays of a graph of `kernels` launches, in us a kernel (negative: a CUDA error).
  const auto time_chain = [&](int grid, int threads, int mode, int wkb, int replicas, bool warp_staged) -> float {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess) return -1.f;
    // the first kernel of a step is a plain launch; with flags it writes tag 0 (the others read tag - 1)
    for (int t = 0; t < kernels; ++t) {
      Args a{};
      a.in = bufs + (t & 1) * kMaxReplicas * replica_stride;
      a.out = bufs + ((t + 1) & 1) * kMaxReplicas * replica_stride;
      a.fin = fbufs + (t & 1) * 4096;
      a.fout = fbufs + ((t + 1) & 1) * 4096;
      a.epoch = epoch;
      a.tag = t;
      a.n = n;
      a.k = n;
      a.mode = mode;
      a.replicas = replicas;
      a.replica_stride = replica_stride;
      a.warp_staged = warp_staged;
      if (t == 0 && mode == kFlags) a.mode = kFlagsFirst;
      a.w = wkb ? w + (size_t)(t % 8) * (wbytes / 16 / 8) : nullptr;
      a.w_int4_per_warp = (long long)wkb * 1024 / 16 / (threads / 32);
      if ((long long)grid * (threads / 32) * a.w_int4_per_warp * 16 > (long long)(wbytes / 8)) a.w = nullptr;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = grid;
      cfg.blockDim = threads;
      cfg.stream = st;
      cfg.attrs = &attr;
      cfg.numAttrs = (mode != kPlain && t > 0) ? 1 : 0;
      if (cudaLaunchKernelEx(&cfg, chain_kernel, a) != cudaSuccess) return -1.f;
    }
    if (cudaStreamEndCapture(st, &graph) != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
      return -1.f;
    std::vector<float> times;
    for (int rep = 0; rep < 30; ++rep) {
      ++host_epoch;
      cudaMemcpyAsync(epoch, &host_epoch, 4, cudaMemcpyHostToDevice, st);
      cudaEventRecord(e0, st);
      cudaGraphLaunch(exec, st);
      cudaEventRecord(e1, st);
      if (cudaStreamSynchronize(st) != cudaSuccess) return -1.f;
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      if (rep >= 5) times.push_back(ms);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2] * 1e3f / kernels;
  };
  if (fanout) {
    for (int wkb : {0, 48})
      for (bool warp_staged : {false, true})
        for (int replicas : {1, 2, 4, 8}) {
          const float us = time_chain(2 * sms, 256, kWaitAllow, wkb, replicas, warp_staged);
          printf("grid %4d x 256, weights %2d KB/block, staged by each %-5s, %d copies: %7.3f us a kernel\n", 2 * sms,
                 wkb, warp_staged ? "warp" : "block", replicas, us);
        }
    return 0;
  }
  for (int shape : {0, 1, 2, 3, 4, 5})
    for (int wkb : {0, 48})  // KB of weights a block: 6.3 MB a kernel at 132 blocks, 130 kernels ~ hgrn2-385m's
      for (int mode = kPlain; mode <= kFlags; ++mode) {
        if (wkb && shape != 0 && shape != 5) continue;
        const int shapes[6][2] = {{1, 256}, {1, 512}, {1, 1024}, {2, 256}, {2, 512}, {4, 256}};
        const int blocks_per_sm = shapes[shape][0], threads = shapes[shape][1];
        const int grid = sms * blocks_per_sm;
        const float us = time_chain(grid, threads, mode, wkb, 1, false);
        const char* names[] = {"plain", "wait-allow", "allow-wait", "flags"};
        printf("threads %4d grid %4d (%d/SM) weights %2d KB/block: %-10s %7.3f us a kernel (median step %.1f us)\n",
               threads, grid, blocks_per_sm, wkb, names[mode], us, us * kernels);
      }
  return 0;
}
