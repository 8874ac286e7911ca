// decode_megakernel_bench.cu: what one persistent kernel with no kernel boundaries could reach for a batch-1 HGRN2
// decoding token, at hgrn2-385m's shapes by default (random bf16 weights, fp32 activations and state). One block an
// SM runs every op of every token; an op waits only for a per-op counter that each SM bumps when its part is done
// (no grid barrier), and a producer warp streams the SM's weight rows for the ops ahead into a ring of shared-memory
// pages by bulk copies, so that DRAM never waits for the chain. Ops a token: the embedding (the greedy choice among
// the SMs' candidates), then a layer's q/f/i product (normed input), the recurrent step (a head's 128 × 128 state, a
// warp a value column), o_proj (normed o, added into h), gate/up (normed h), down (SwiGLU input, added into h), and
// the LM head (normed h, each SM's best logit a candidate). Modes:
//   full     the token as above (default)
//   chain    no weights streamed (the pages left as they are): the chain of ops alone
//   stream   the weights streamed, no waits on other SMs and no arithmetic: the stream alone
//   handoff  the counters alone: each op waits for the op before and signals, nothing else
//   check    3 tokens against plain reference kernels (logits, chosen tokens, states); exit 1 on a mismatch
// DMB_PROBE=1 adds a run that stamps SM 0's phases of each op (%globaltimer) at the middle token; DMB_ONCE=N runs one
// launch of N tokens and exits (for a profiler); DMB_SKIP=mask leaves out, for timing only, each row's arithmetic (1),
// the staging's reads (2) or the fence before a signal (4). Standalone:
//   nvcc -O3 -arch=sm_90 -I src -I . -o decode_megakernel_bench tools/decode_megakernel_bench.cu
//   ./decode_megakernel_bench [mode] [layers=26] [pages=6]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cp_async.cuh"
#include "kernels/cuda_check.h"
#include "kernels/row_sums.cuh"
#include "kernels/sigmoid.cuh"

using hgrn::shared_address;
using hgrn::stable_sigmoid;
using hgrn::warp_sum;

constexpr int kConsumerWarps = 16, kThreads = (kConsumerWarps + 1) * 32, kConsumers = kConsumerWarps * 32;
constexpr int kRegPacks = 4, kPageBytes = 32 * 1024, kHeadDim = 128, kMaxK = 4096, kMaxOwnRows = 256;
enum Kind { kEmbed, kQfi, kStep, kOutProj, kGateUp, kDown, kHead };
enum Mode { kFull, kChain, kStream, kHandoff, kCheck };

struct Op {
  int kind, n, k, layer;
  long long w_offset;  // in bf16 elements; -1: no weights
};

struct Model {
  int d, mlp, vocab, layers, ops, sms, pages, mode, tokens;
  int skip;  // timing only, wrong results: 1 each row's arithmetic, 2 the staging's reads, 4 the fence
  const Op* op;
  const __nv_bfloat16* w;
  const __nv_bfloat16* emb;
  float *h, *qfi, *o, *gu, *state, *logits;
  unsigned long long* cand;    // one a SM: (ordered logit bits << 32) | ~row
  unsigned* done;              // per op, SMs finished, summed over tokens
  int* chosen;                 // the token each step embedded
  unsigned long long* stamps;  // SM 0, the middle token: per op, %globaltimer at 4 points (probe mode only)
};
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// The rows [begin, end) of an op that SM s owns: an even split over the SMs.
__host__ __device__ inline void rows_of(int n, int sms, int s, int& begin, int& end) {
  const int per = (n + sms - 1) / sms;
  begin = min(n, s * per);
  end = min(n, begin + per);
}
__host__ __device__ inline int rows_per_page(int k) { return kPageBytes / (2 * k); }

__device__ __forceinline__ void bar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(b)) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* b, unsigned parity) {
  unsigned ok;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok)
                 : "r"(shared_address(b)), "r"(parity)
                 : "memory");
  } while (!ok);
}
// One bulk copy global → shared that completes `bytes` of the barrier's expected transactions.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(b)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(b))
               : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory"); }
__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
  const float2 w0 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w.x));
  const float2 w1 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w.y));
  const float2 w2 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w.z));
  const float2 w3 = __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w.w));
  return w0.x * a.x + w0.y * a.y + w1.x * a.z + w1.y * a.w + w2.x * b.x + w2.y * b.y + w3.x * b.z + w3.y * b.w;
}
// A position in the ring of pages: the slot and how many times the ring has wrapped, mod 2 (a barrier's parity).
struct RingCursor {
  int slot = 0;
  unsigned phase = 0;
  bool wrapped = false;
  __device__ void next(int pages) {
    if (++slot == pages) slot = 0, phase ^= 1u, wrapped = true;
  }
};
__device__ __forceinline__ unsigned long long logit_key(float v, int row) {
  const unsigned bits = __float_as_uint(v), ordered = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  return ((unsigned long long)ordered << 32) | (unsigned)~row;
}

// Stages an op's input in shared memory (fp32); returns through `partials` each warp's Σx² where the op normalises.
__device__ void stage_input(const Model& m, const Op& op, int begin, int end, float* xs, float* partials, float* old) {
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  if (op.kind == kOutProj || op.kind == kDown)  // the rows' residual, read beside x rather than after the sums
    for (int r = begin + t; r < end; r += kConsumers) old[r - begin] = __ldcg(m.h + r);
  float ss = 0.f;
  constexpr int kPacks = kMaxK / 4 / kConsumers;  // float4s a thread, all loaded before any is used
  float4 a[kPacks], b[kPacks];
  const float* src = op.kind == kDown ? m.gu : op.kind == kOutProj ? m.o : m.h;
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int j = 4 * (t + i * kConsumers);
    if (j < op.k) a[i] = __ldcg(reinterpret_cast<const float4*>(src + j));
    if (j < op.k && op.kind == kDown) b[i] = __ldcg(reinterpret_cast<const float4*>(src + m.mlp + j));
  }
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    const int j = 4 * (t + i * kConsumers);
    if (j >= op.k) continue;
    float4 v = a[i];
    if (op.kind == kDown) {
      v.x = v.x * stable_sigmoid<float>(v.x) * b[i].x, v.y = v.y * stable_sigmoid<float>(v.y) * b[i].y;
      v.z = v.z * stable_sigmoid<float>(v.z) * b[i].z, v.w = v.w * stable_sigmoid<float>(v.w) * b[i].w;
    }
    *reinterpret_cast<float4*>(xs + j) = v;
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = warp_sum(ss);
  if (lane == 0) partials[warp] = ss;
}

__global__ void __launch_bounds__(kThreads, 1) megakernel(Model m) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* pages = smem;
  float* xs = reinterpret_cast<float*>(smem + (size_t)m.pages * kPageBytes);
  float* partials = xs + kMaxK;                                                         // a warp's Σx²
  float* old = partials + kConsumerWarps;                                               // kMaxOwnRows
  unsigned long long* best = reinterpret_cast<unsigned long long*>(old + kMaxOwnRows);  // a warp's
  uint64_t* full = reinterpret_cast<uint64_t*>(best + kConsumerWarps);
  uint64_t* empty = full + m.pages;
  Op* ops = reinterpret_cast<Op*>(empty + m.pages);  // the op list, read from shared memory: no L1 to miss
  for (int i = threadIdx.x; i < m.ops; i += blockDim.x) ops[i] = m.op[i];
  const int s = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int i = 0; i < m.pages; ++i) bar_init(full + i, 1), bar_init(empty + i, kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer: every weight row this SM will use, in order, a page at a time
    if (lane != 0 || m.mode == kChain || m.mode == kHandoff) return;
    RingCursor ring;
    for (int token = 0; token < m.tokens; ++token)
      for (int o = 0; o < m.ops; ++o) {
        const Op op = ops[o];
        if (op.w_offset < 0) continue;
        int begin, end;
        rows_of(op.n, m.sms, s, begin, end);
        for (int r = begin; r < end; r += rows_per_page(op.k), ring.next(m.pages)) {
          const int slot = ring.slot;
          if (ring.wrapped) bar_wait(empty + slot, ring.phase ^ 1u);
          const int rows = min(rows_per_page(op.k), end - r);
          bulk_load(pages + (size_t)slot * kPageBytes, m.w + op.w_offset + (long long)r * op.k,
                    (unsigned)(rows * op.k * 2), full + slot);
        }
      }
    return;
  }

  RingCursor ring;
  for (int token = 0; token < m.tokens; ++token)
    for (int o = 0; o < m.ops; ++o) {
      const Op op = ops[o];
      int begin, end;
      rows_of(op.n, m.sms, s, begin, end);
      const bool signal = m.mode != kStream;
      const bool probe = m.stamps && s == 0 && token == m.tokens / 2 && threadIdx.x == 0;
      if (probe) m.stamps[o * 5 + 0] = now_ns();
      if (begin < end && m.mode != kStream) {
        if (threadIdx.x == 0) {  // wait for every SM's part of the op before (the head of the token before: embed)
          const unsigned* dep = m.done + (o == 0 ? m.ops - 1 : o - 1);
          const unsigned want = (unsigned)m.sms * (unsigned)(o == 0 ? token : token + 1);
          while (ld_acquire(dep) < want) {
          }
        }
        consumers_sync();
        if (probe) m.stamps[o * 5 + 1] = m.stamps[o * 5 + 2] = now_ns();
        if (m.mode == kHandoff) {
        } else if (op.kind == kEmbed) {  // the greedy choice among the SMs' candidates, then this SM's slice of h
          unsigned long long key = 0;
          for (int i = threadIdx.x; i < m.sms; i += kConsumers) key = max(key, __ldcg(m.cand + i));
          for (int off = 16; off; off >>= 1) key = max(key, __shfl_xor_sync(~0u, key, off));
          if (lane == 0) best[warp] = key;
          consumers_sync();
          key = 0;
          for (int i = 0; i < kConsumerWarps; ++i) key = max(key, best[i]);
          const int tok = token == 0 ? 0 : (int)~(unsigned)key;
          if (s == 0 && threadIdx.x == 0) m.chosen[token] = tok;
          for (int j = begin + threadIdx.x; j < end; j += kConsumers)
            __stcg(m.h + j, __bfloat162float(m.emb[(long long)tok * m.d + j]));
        } else if (op.kind == kStep) {  // a warp a value column: its head's 128 key rows of state, 4 a lane
          const float* q = m.qfi + (long long)op.layer * 3 * m.d;
          for (int v = begin + warp; v < end; v += kConsumerWarps) {
            const int head = v / kHeadDim;
            float4* st = reinterpret_cast<float4*>(m.state + ((long long)op.layer * m.d + v) * kHeadDim) + lane;
            const float4 qv = __ldcg(reinterpret_cast<const float4*>(q + head * kHeadDim) + lane);
            const float4 fv = __ldcg(reinterpret_cast<const float4*>(q + m.d + head * kHeadDim) + lane);
            const float iv = __ldcg(q + 2 * m.d + v);
            float4 sv = __ldcg(st);
            const float f0 = stable_sigmoid<float>(fv.x), f1 = stable_sigmoid<float>(fv.y),
                        f2 = stable_sigmoid<float>(fv.z), f3 = stable_sigmoid<float>(fv.w);
            sv.x = f0 * sv.x + (1.f - f0) * iv;
            sv.y = f1 * sv.y + (1.f - f1) * iv;
            sv.z = f2 * sv.z + (1.f - f2) * iv;
            sv.w = f3 * sv.w + (1.f - f3) * iv;
            __stcg(st, sv);
            const float out = warp_sum(qv.x * sv.x + qv.y * sv.y + qv.z * sv.z + qv.w * sv.w);
            if (lane == 0) __stcg(m.o + v, out);
          }
        } else {  // a product: stage x, then each page's rows, a warp a row
          if (!(m.skip & 2))
            stage_input(m, op, begin, end, xs, partials, old);
          else if (threadIdx.x < kConsumerWarps)
            partials[threadIdx.x] = 1.f;
          consumers_sync();
          if (probe) m.stamps[o * 5 + 2] = now_ns();
          float rstd = 1.f;
          if (op.kind != kDown) {
            float ss = 0.f;
            for (int i = 0; i < kConsumerWarps; ++i) ss += partials[i];
            rstd = rsqrtf(ss / op.k + 1e-6f);
          }
          unsigned long long warp_best = 0;
          float* out = op.kind == kQfi      ? m.qfi + (long long)op.layer * 3 * m.d
                       : op.kind == kGateUp ? m.gu
                       : op.kind == kHead   ? m.logits
                                            : m.h;
          const bool accumulate = op.kind == kOutProj || op.kind == kDown;
          const float4* x4 = reinterpret_cast<const float4*>(xs);
          // A lane multiplies the same packs of x (p = lane + 32 j) in every row: the first kRegPacks in registers.
          float4 xr[2 * kRegPacks];
#pragma unroll
          for (int j = 0; j < kRegPacks; ++j) {
            const int p = lane + 32 * j;
            xr[2 * j] = p < op.k / 8 ? x4[2 * p] : make_float4(0.f, 0.f, 0.f, 0.f);
            xr[2 * j + 1] = p < op.k / 8 ? x4[2 * p + 1] : make_float4(0.f, 0.f, 0.f, 0.f);
          }
          for (int r0 = begin; r0 < end; r0 += rows_per_page(op.k), ring.next(m.pages)) {
            const int slot = ring.slot, rows = min(rows_per_page(op.k), end - r0);
            if (m.mode != kChain) bar_wait(full + slot, ring.phase);
            const uint4* page = reinterpret_cast<const uint4*>(pages + (size_t)slot * kPageBytes);
            for (int r = warp; r < rows; r += kConsumerWarps) {
              const uint4* row = page + (size_t)r * (op.k / 8);
              float acc = 0.f;
              if (!(m.skip & 1)) {
#pragma unroll
                for (int j = 0; j < kRegPacks; ++j)
                  if (lane + 32 * j < op.k / 8) acc += dot8(row[lane + 32 * j], xr[2 * j], xr[2 * j + 1]);
                for (int p = lane + 32 * kRegPacks; p < op.k / 8; p += 32)
                  acc += dot8(row[p], x4[2 * p], x4[2 * p + 1]);
                acc = warp_sum(acc) * rstd;
              }
              if (lane == 0) {
                if (accumulate) acc += old[r0 + r - begin];
                __stcg(out + r0 + r, acc);
                if (op.kind == kHead) warp_best = max(warp_best, logit_key(acc, r0 + r));
              }
            }
            if (lane == 0 && m.mode != kChain) bar_arrive(empty + slot);  // this warp is done with the page
          }
          if (op.kind == kHead) {
            if (lane == 0) best[warp] = warp_best;
            consumers_sync();
            if (threadIdx.x == 0) {
              unsigned long long key = 0;
              for (int i = 0; i < kConsumerWarps; ++i) key = max(key, best[i]);
              __stcg(m.cand + s, key);
            }
          }
        }
        if (probe) m.stamps[o * 5 + 3] = now_ns();
        consumers_sync();
      } else if (begin < end) {  // the stream alone: take each page and give it back
        for (int r0 = begin; r0 < end && op.w_offset >= 0; r0 += rows_per_page(op.k), ring.next(m.pages)) {
          const int slot = ring.slot;
          bar_wait(full + slot, ring.phase);
          if (lane == 0) bar_arrive(empty + slot);
        }
      }
      if (signal && threadIdx.x == 0) {
        if (!(m.skip & 4)) __threadfence();
        atomicAdd(m.done + o, 1u);
        if (probe) m.stamps[o * 5 + 4] = now_ns();
      }
    }
}

// Reference: one plain kernel an op, fp32 sums in a different order.
__global__ void ref_embed(const __nv_bfloat16* emb, const int* tok, float* h, int d) {
  for (int j = threadIdx.x; j < d; j += blockDim.x) h[j] = __bfloat162float(emb[(long long)*tok * d + j]);
}
__global__ void ref_stage(const float* src, const float* gu, int k, int mlp, int kind, float* x) {
  __shared__ float ss;
  if (threadIdx.x == 0) ss = 0.f;
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    if (kind == kDown) {
      const float g = gu[j];
      x[j] = g / (1.f + expf(-g)) * gu[mlp + j];
    } else {
      x[j] = src[j];
      atomicAdd(&ss, src[j] * src[j]);
    }
  }
  __syncthreads();
  if (kind != kDown)
    for (int j = threadIdx.x; j < k; j += blockDim.x) x[j] *= 1.f / sqrtf(ss / k + 1e-6f);
}
__global__ void ref_gemv(const __nv_bfloat16* w, const float* x, float* y, int n, int k, bool accumulate) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  double acc = 0.0;
  for (int i = 0; i < k; ++i) acc += (double)__bfloat162float(w[(long long)r * k + i]) * x[i];
  y[r] = accumulate ? y[r] + (float)acc : (float)acc;
}
__global__ void ref_step(const float* q, float* state, float* o, int d) {
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= d) return;
  const int head = v / kHeadDim;
  double acc = 0.0;
  for (int k = 0; k < kHeadDim; ++k) {
    const float f = 1.f / (1.f + expf(-q[d + head * kHeadDim + k]));
    float& sv = state[(long long)v * kHeadDim + k];
    sv = f * sv + (1.f - f) * q[2 * d + v];
    acc += (double)q[head * kHeadDim + k] * sv;
  }
  o[v] = (float)acc;
}
__global__ void ref_argmax(const float* logits, int n, int* tok) {
  if (threadIdx.x) return;
  int b = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[b]) b = i;
  *tok = b;
}
__global__ void fill_bf16(__nv_bfloat16* p, long long n, unsigned seed, float scale) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13, x *= 3266489917u, x ^= x >> 16;
    p[i] = __float2bfloat16(((float)(x & 0xffffff) / 16777216.f * 2.f - 1.f) * scale);
  }
}

// Throws hgrn::Error where a CUDA call fails; returns the exit status otherwise.
int bench(int argc, char** argv) {
  const char* names[] = {"full", "chain", "stream", "handoff", "check"};
  int mode = kFull;
  if (argc > 1) {
    mode = -1;
    for (int i = 0; i < 5; ++i)
      if (std::strcmp(argv[1], names[i]) == 0) mode = i;
    if (mode < 0) {
      printf("usage: %s [full|chain|stream|handoff|check] [layers=26] [pages=6]\n", argv[0]);
      return 2;
    }
  }
  Model m{};
  m.d = 1024, m.mlp = 2816, m.vocab = 50304, m.layers = argc > 2 ? atoi(argv[2]) : 26;
  m.pages = argc > 3 ? atoi(argv[3]) : 6;
  m.mode = mode == kCheck ? kFull : mode;
  m.skip = mode == kCheck || !getenv("DMB_SKIP") ? 0 : atoi(getenv("DMB_SKIP"));
  CUDA_CHECK(cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<Op> ops{{kEmbed, m.d, 0, 0, -1}};
  long long w_total = 0;
  const auto product = [&](int kind, int n, int k, int layer) {
    ops.push_back({kind, n, k, layer, w_total});
    w_total += (long long)n * k;
  };
  for (int l = 0; l < m.layers; ++l) {
    product(kQfi, 3 * m.d, m.d, l);
    ops.push_back({kStep, m.d, 0, l, -1});
    product(kOutProj, m.d, m.d, l);
    product(kGateUp, 2 * m.mlp, m.d, l);
    product(kDown, m.d, m.mlp, l);
  }
  product(kHead, m.vocab, m.d, 0);
  m.ops = (int)ops.size();
  if ((m.d + m.sms - 1) / m.sms > kMaxOwnRows || std::max(m.d, m.mlp) > kMaxK) {
    printf("shapes past the kernel's staging: d %d, mlp %d\n", m.d, m.mlp);
    return 2;
  }
  const size_t smem = (size_t)m.pages * kPageBytes + (kMaxK + kConsumerWarps + kMaxOwnRows) * 4 + kConsumerWarps * 8 +
                      2 * m.pages * 8 + ops.size() * sizeof(Op);
  const size_t state_floats = (size_t)m.layers * m.d * kHeadDim;
  __nv_bfloat16 *w, *emb;
  Op* dops;
  CUDA_CHECK(cudaMalloc(&w, w_total * 2));
  CUDA_CHECK(cudaMalloc(&emb, (size_t)m.vocab * m.d * 2));
  CUDA_CHECK(cudaMalloc(&dops, ops.size() * sizeof(Op)));
  CUDA_CHECK(cudaMemcpy(dops, ops.data(), ops.size() * sizeof(Op), cudaMemcpyHostToDevice));
  fill_bf16<<<1024, 256>>>(w, w_total, 1u, 0.05f);
  fill_bf16<<<1024, 256>>>(emb, (long long)m.vocab * m.d, 2u, 1.f);
  float* f;  // h, qfi, o, gu, state, logits
  const size_t nf = m.d + (size_t)m.layers * 3 * m.d + m.d + 2 * m.mlp + state_floats + m.vocab;
  CUDA_CHECK(cudaMalloc(&f, nf * 4));
  m.op = dops, m.w = w, m.emb = emb, m.h = f, m.qfi = m.h + m.d, m.o = m.qfi + (size_t)m.layers * 3 * m.d;
  m.gu = m.o + m.d, m.state = m.gu + 2 * m.mlp, m.logits = m.state + state_floats;
  CUDA_CHECK(cudaMalloc(&m.cand, m.sms * 8));
  CUDA_CHECK(cudaMalloc(&m.done, m.ops * 4));
  const int max_tokens = 400;
  CUDA_CHECK(cudaMalloc(&m.chosen, max_tokens * 4));
  CUDA_CHECK(cudaFuncSetAttribute(megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const double gb = (w_total + (double)m.d) * 2 / 1e9;  // weights read a token (the embedding's row aside)
  printf("%s: %d layers, %d ops a token, %d SMs, %d pages of %d KB, %.3f GB of weights a token\n", names[mode],
         m.layers, m.ops, m.sms, m.pages, kPageBytes / 1024, gb);

  const auto run = [&](int tokens) -> float {  // ms; the state starts at zero
    m.tokens = tokens;
    cudaMemset(f, 0, nf * 4);
    cudaMemset(m.cand, 0, m.sms * 8);
    cudaMemset(m.done, 0, m.ops * 4);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    void* args[] = {&m};
    cudaEventRecord(e0);
    cudaError_t e = cudaLaunchCooperativeKernel((void*)megakernel, m.sms, kThreads, args, smem, 0);
    cudaEventRecord(e1);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    if (e != cudaSuccess) {
      printf("megakernel: %s\n", cudaGetErrorString(e));
      return -1.f;
    }
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms;
  };

  if (mode == kCheck) {
    const int tokens = 3;
    if (run(tokens) < 0) return 1;
    std::vector<float> mk_logits(m.vocab), mk_state(state_floats), ref_logits(m.vocab), ref_state(state_floats);
    std::vector<int> mk_tok(tokens), ref_tok(tokens);
    CUDA_CHECK(cudaMemcpy(mk_logits.data(), m.logits, m.vocab * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(mk_state.data(), m.state, state_floats * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(mk_tok.data(), m.chosen, tokens * 4, cudaMemcpyDeviceToHost));
    float *x, *rf;
    int* tok;
    CUDA_CHECK(cudaMalloc(&x, kMaxK * 4));
    CUDA_CHECK(cudaMalloc(&rf, nf * 4));
    CUDA_CHECK(cudaMalloc(&tok, (tokens + 1) * 4));
    CUDA_CHECK(cudaMemset(rf, 0, nf * 4));
    CUDA_CHECK(cudaMemset(tok, 0, 4));
    float *h = rf, *qfi = h + m.d, *o = qfi + (size_t)m.layers * 3 * m.d, *gu = o + m.d, *st = gu + 2 * m.mlp;
    float* logits = st + state_floats;
    for (int t = 0; t < tokens; ++t) {
      ref_embed<<<1, 256>>>(emb, tok + t, h, m.d);
      for (const Op& op : ops) {
        const __nv_bfloat16* wo = w + op.w_offset;
        const int grid = (op.n + 127) / 128;
        switch (op.kind) {
          case kQfi:
            ref_stage<<<1, 1024>>>(h, gu, op.k, m.mlp, op.kind, x);
            ref_gemv<<<grid, 128>>>(wo, x, qfi + (size_t)op.layer * 3 * m.d, op.n, op.k, false);
            break;
          case kStep:
            ref_step<<<grid, 128>>>(qfi + (size_t)op.layer * 3 * m.d, st + (size_t)op.layer * m.d * kHeadDim, o, m.d);
            break;
          case kOutProj:
            ref_stage<<<1, 1024>>>(o, gu, op.k, m.mlp, op.kind, x);
            ref_gemv<<<grid, 128>>>(wo, x, h, op.n, op.k, true);
            break;
          case kGateUp:
          case kHead:
            ref_stage<<<1, 1024>>>(h, gu, op.k, m.mlp, op.kind, x);
            ref_gemv<<<grid, 128>>>(wo, x, op.kind == kHead ? logits : gu, op.n, op.k, false);
            break;
          case kDown:
            ref_stage<<<1, 1024>>>(h, gu, op.k, m.mlp, op.kind, x);
            ref_gemv<<<grid, 128>>>(wo, x, h, op.n, op.k, true);
            break;
        }
      }
      ref_argmax<<<1, 32>>>(logits, m.vocab, tok + t + 1);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(ref_logits.data(), logits, m.vocab * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(ref_state.data(), st, state_floats * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(ref_tok.data(), tok, tokens * 4, cudaMemcpyDeviceToHost));
    // Tolerances: fp32 sums of up to 2,816 products in another order, through 26 layers; the logits' scale is ~1.
    double logit_err = 0, logit_max = 0, state_err = 0, state_max = 0;
    for (int i = 0; i < m.vocab; ++i)
      logit_err = std::max(logit_err, (double)std::fabs(mk_logits[i] - ref_logits[i])),
      logit_max = std::max(logit_max, (double)std::fabs(ref_logits[i]));
    for (size_t i = 0; i < state_floats; ++i)
      state_err = std::max(state_err, (double)std::fabs(mk_state[i] - ref_state[i])),
      state_max = std::max(state_max, (double)std::fabs(ref_state[i]));
    const bool ok = logit_err <= 1e-3 * logit_max && state_err <= 1e-3 * state_max && mk_tok == ref_tok &&
                    logit_max > 0 && state_max > 0;
    printf("check: logits max |diff| %.3g of max %.3g, states %.3g of %.3g, tokens %d %d %d / %d %d %d: %s\n",
           logit_err, logit_max, state_err, state_max, mk_tok[0], mk_tok[1], mk_tok[2], ref_tok[0], ref_tok[1],
           ref_tok[2], ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
  }

  if (getenv("DMB_ONCE")) return run(atoi(getenv("DMB_ONCE"))) < 0;  // one launch, for a profiler
  run(8);                                                            // warm-up
  const int few = 40, many = 240;
  std::vector<float> per_token;
  for (int rep = 0; rep < 3; ++rep) {
    const float a = run(few), b = run(many);
    if (a < 0 || b < 0) return 1;
    per_token.push_back((b - a) / (many - few));
  }
  std::sort(per_token.begin(), per_token.end());
  if (getenv("DMB_PROBE")) {  // one more run, SM 0's stamps at the middle token: median us per kind of op
    CUDA_CHECK(cudaMalloc(&m.stamps, m.ops * 5 * 8));
    CUDA_CHECK(cudaMemset(m.stamps, 0, m.ops * 5 * 8));
    run(many);
    std::vector<unsigned long long> st(m.ops * 5);
    CUDA_CHECK(cudaMemcpy(st.data(), m.stamps, st.size() * 8, cudaMemcpyDeviceToHost));
    const char* kinds[] = {"embed", "qfi", "step", "o_proj", "gate/up", "down", "head"};
    printf("SM 0, token %d, us: wait | stage | work | signal | to the next op's start (median over layers)\n",
           many / 2);
    for (int kind = 0; kind < 7; ++kind) {
      std::vector<double> part[5];
      for (int o = 0; o < m.ops; ++o) {
        if (ops[o].kind != kind || !st[o * 5 + 1]) continue;
        const unsigned long long next = st[((o + 1) % m.ops) * 5];
        for (int i = 0; i < 4; ++i)
          if (st[o * 5 + i + 1] && st[o * 5 + i]) part[i].push_back((st[o * 5 + i + 1] - st[o * 5 + i]) / 1e3);
        if (next > st[o * 5 + 4]) part[4].push_back((next - st[o * 5 + 4]) / 1e3);
      }
      printf("%-8s", kinds[kind]);
      for (auto& v : part) {
        std::sort(v.begin(), v.end());
        printf(" %7.3f", v.empty() ? -1.0 : v[v.size() / 2]);
      }
      printf("\n");
    }
    m.stamps = nullptr;
  }
  const float ms = per_token[1];
  printf("%s: %.4f ms a token (median of 3: %.4f %.4f %.4f), %.2f TB/s of weights, %.2f us an op\n", names[mode], ms,
         per_token[0], per_token[1], per_token[2], gb / ms, ms * 1e3 / m.ops);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return bench(argc, argv);
  } catch (const std::exception& e) {
    printf("%s\n", e.what());
    return 1;
  }
}
