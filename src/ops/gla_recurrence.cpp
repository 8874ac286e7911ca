// gla_recurrence.cpp: the HGRU2 recurrence S_t = Diag(e^{g_t}) S_{t−1} + k_tᵀ v_t, o_t = s·q_t S_t on the CPU, in two
// exact forms, each with a hand-written backward:
//  * Naive: the step-by-step recurrence (fla's fused_recurrent / naive_recurrent_gla), backward in reverse time.
//  * Chunk: fla's chunkwise GLA (spec sections 7.2 and 7.3): inter-chunk states, an intra-chunk score matrix A and the
//    per-chunk output; the backward recomputes the states and runs dS, dv, dA, intra and inter dq/dk, dg. It is the
//    reference the CUDA kernel is held to, so it is laid out in that kernel's stages, and like fla it keeps A from the
//    forward for the backward.
// Resets (ops/sequence_resets.h): at a reset step t the state is restarted, S_t = k_tᵀ v_t (the decay of S_{t−1} is 0).
// The chunk form treats each reset as a segment boundary inside its chunk, with the same cumulative gates: a key j
// reaches a query i only if no reset lies in (j, i] (the scores are masked), the state entering a chunk reaches only
// the rows before its first reset, and only the keys from its last reset on reach the state leaving it; the gate
// gradient's reverse cumulative sum restarts at every reset, whose own dg is 0.
// Decays: per key channel (g [B, T, H·K]: HGRN2, GLA), or scalar, one per head and step (g [B, T, H]) or per head
// (g [H]: RetNet). The scalar mode is the same code with the kScalar template parameter: the gate tables hold one value
// per row instead of K (decay_index), and where the per-channel form needs a decay per (i, j, channel) the scalar one
// factors it out of the channel sum: A_ij = s·e^{G_i − G_j}·(q_i·k_j) and dq_i, dk_j from dA_ij·e^{G_i − G_j} (no
// reference-point factors or diagonal-block decay tables); its gate gradient is the per-channel one summed over the
// channels. Both modes compute the same function for a g broadcast over the channels, up to rounding.
// Both forms work on one (batch, head) pair at a time, on contiguous copies of that head's rows (gathered from q, k and
// v row-strided, in either decay mode: they may be column blocks of one projection's output), one OpenMP iteration per
// pair with per-thread scratch. The pairs are independent and each is computed by the same sequential code, so the
// result is the same bits for any number of threads.
#include "ops/gla_recurrence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cpu_math.h"
#include "ops/sequence_resets.h"

#ifdef HGRN_WITH_CUDA
#include "kernels/elementwise.h"
#include "kernels/gla_recurrence.h"
#endif

namespace hgrn {
namespace {

struct HeadDims {
  int64_t batch, time, heads, key_dim, value_dim;
  int64_t pairs() const { return batch * heads; }
  int64_t state_size() const { return key_dim * value_dim; }
};

// The shape of g: [B, T, H·K] (a log decay per key channel), [B, T, H] (one per head and step) or [H] (one per head,
// constant). The last two run the scalar mode.
enum class DecayKind { PerChannel, PerStep, PerHead };

// Where the decay of row t, key channel a lives in a gate table: [n][K] per channel, [n] in the scalar mode.
template <bool kScalar>
inline int64_t decay_index(int64_t t, int64_t a, int64_t K) {
  if constexpr (kScalar)
    return t;
  else
    return t * K + a;
}

// Chunk tiling of one sequence (spec 7.1). Sub-chunks of BC rows are the blocks of the intra-chunk score matrix:
// blocks below the diagonal use the reference-point factorisation, diagonal blocks are computed element-wise.
struct ChunkLayout {
  int64_t time = 0;
  int64_t chunk_size = 0;      // BT
  int64_t sub_chunk_size = 0;  // BC = min(16, BT)
  int64_t num_chunks = 0;      // NT = ceil(T / BT)

  ChunkLayout(int64_t time_steps, int64_t requested) : time(time_steps) {
    chunk_size = requested > 0 ? requested : default_chunk_size(time_steps);
    sub_chunk_size = std::min<int64_t>(16, chunk_size);
    num_chunks = (time + chunk_size - 1) / chunk_size;
  }
  int64_t begin(int64_t c) const { return c * chunk_size; }
  int64_t end(int64_t c) const { return std::min(time, begin(c) + chunk_size); }
  // The most rows a chunk actually has (a chunk length beyond T only ever yields one chunk of T rows).
  int64_t max_rows() const { return std::min(time, chunk_size); }
  // Saved score matrices of one sequence: chunk c's n×n matrix starts at score_offset(c) (only the last chunk can be
  // shorter than BT, so the earlier ones are all BT×BT).
  int64_t score_offset(int64_t c) const { return c * chunk_size * chunk_size; }
  int64_t scores_per_sequence() const {
    const int64_t last_rows = end(num_chunks - 1) - begin(num_chunks - 1);
    return score_offset(num_chunks - 1) + last_rows * last_rows;
  }

  // fla's choice: min(64, max(16, next_pow2(T))).
  static int64_t default_chunk_size(int64_t time_steps) {
    int64_t pow2 = 1;
    while (pow2 < time_steps) pow2 *= 2;
    return std::min<int64_t>(64, std::max<int64_t>(16, pow2));
  }
};

// ---------------------------------------------------------------------------------------------------------------------
// Small dense helpers. Element-wise loops vectorise as written; a dot product needs `omp simd` to be allowed to reorder
// its sum (the build has no -ffast-math). Either way the order is fixed at compile time, so results are reproducible.

template <typename T>
inline T dot(const T* a, const T* b, int64_t n) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y += alpha · x
template <typename T>
inline void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// dst [cols][rows] = srcᵀ for a row-major src [rows][cols].
template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// A [B, T, H·width] tensor of a call: its rows (one per batch and step) lie `stride` elements apart, H·width when it
// is contiguous, more for a column block of a wider tensor (a fused projection's output, or that one's gradient).
template <typename P>
struct Rows {
  P* data = nullptr;  // null: absent
  int64_t stride = 0;
  // Head h's first element in batch b's first row (`width` per head).
  P* head(const HeadDims& d, int64_t b, int64_t h, int64_t width) const {
    return data + b * d.time * stride + h * width;
  }
};

template <typename T>
Rows<T> rows_of(const Tensor& t) {
  return {t.data<std::remove_const_t<T>>(), t.row_stride()};
}

// Copies head h of batch b out of a [B, T, H·width] tensor into a contiguous [T, width] block.
template <typename T>
void gather_head(const Rows<const T>& src, const HeadDims& d, int64_t b, int64_t h, int64_t width, T* dst) {
  const T* base = src.head(d, b, h, width);
  for (int64_t t = 0; t < d.time; ++t) std::copy_n(base + t * src.stride, width, dst + t * width);
}

// Writes a contiguous [T, width] block into head h of batch b of a [B, T, H·width] tensor.
template <typename T>
void scatter_head(const T* src, const HeadDims& d, int64_t b, int64_t h, int64_t width, const Rows<T>& dst) {
  T* base = dst.head(d, b, h, width);
  for (int64_t t = 0; t < d.time; ++t) std::copy_n(src + t * width, width, base + t * dst.stride);
}

// Adds a contiguous [T, width] block into head h of batch b of a [B, T, H·width] gradient (backward accumulates).
template <typename T>
void scatter_add_head(const T* src, const HeadDims& d, int64_t b, int64_t h, int64_t width, const Rows<T>& dst) {
  T* base = dst.head(d, b, h, width);
  for (int64_t t = 0; t < d.time; ++t) axpy(T(1), src + t * width, base + t * dst.stride, width);
}

// The global tensors of one call (gradient pointers are null where no gradient is wanted or available).
template <typename T>
struct GlaIo {
  Rows<const T> q, k, v, g;
  DecayKind decay = DecayKind::PerChannel;
  const T* initial_state = nullptr;  // null: S_0 = 0
  // Forward results. saved_scores (chunk form, only when a backward will run): every chunk's A, [B·H][per sequence].
  Rows<T> output;
  T* final_state = nullptr;
  T* saved_scores = nullptr;
  // Backward inputs (null: that output's gradient is zero) and results (null: not wanted).
  const T* scores = nullptr;
  Rows<const T> d_output;
  const T* d_final_state = nullptr;
  Rows<T> dq, dk, dv, dg;
  T* d_initial_state = nullptr;
  const int32_t* resets = nullptr;  // [B, T]; null: none
};

// One thread's contiguous copies of the current head's rows and its scratch; allocated once per thread, reused for
// every (batch, head) pair that thread handles.
template <typename T>
struct HeadScratch {
  // The head's rows: [T][K], [T][K], [T][V], [T][Kg] (g, which the chunk form turns into its chunk-local cumsum G;
  // Kg = K per channel, 1 in the scalar mode; the decay tables and dg are [T][Kg] too).
  std::vector<T> q, k, v, gate;
  std::vector<T> step_decay;  // Naive: naive_decays' table; Chunk: with the next two, chunk_decays' tables
  std::vector<T> start_decay, exit_decay;
  std::vector<T> output;                               // [T][V]
  std::vector<T> states;  // Naive backward: S_0..S_T; Chunk: S^(0)..S^(NT)
  std::vector<T> scores;  // Chunk forward without a backward to come: A of one chunk, [BT][BT]
  // Reference-point factors of one sub-chunk ([BC][K], [BC][K], [BT][K], [BT][K]) and the running decays of one
  // diagonal block's row ([BC][K]); per-channel mode only.
  std::vector<T> query_decay, decayed_query, key_decay, decayed_key, diagonal_decay;
  // Backward.
  std::vector<T> d_output, dq, dk, dv, dg;  // [T][V], [T][K], [T][K], [T][V], [T][Kg]
  std::vector<T> d_state;                   // [K][V]: the running (naive) or initial-state gradient
  std::vector<T> d_exit_states;             // Chunk: dS_e of every chunk, [NT][K][V]
  std::vector<T> d_scores;                  // Chunk: dA of one chunk, [BT][BT]
  std::vector<T> state_enter_t, d_exit_t;   // Chunk: S_pᵀ and dS_eᵀ of one chunk, [V][K]
  std::vector<T> last_grad, last_row_dk_inter;  // Chunk: d_last and the last row's dk_inter, [K] each
  std::vector<T> row;                           // [max(K, V)] accumulator
  const int32_t* resets = nullptr;              // the current pair's sequence's reset flags [T] (null: none)

  HeadScratch(const HeadDims& d, RecurrenceMode mode, const ChunkLayout& layout, bool backward, bool keep_scores,
              bool scalar_decay) {
    const int64_t K = d.key_dim, V = d.value_dim, T_ = d.time, KV = d.state_size(), Kg = scalar_decay ? 1 : K;
    q.resize(T_ * K);
    k.resize(T_ * K);
    v.resize(T_ * V);
    gate.resize(T_ * Kg);
    output.resize(T_ * V);
    row.resize(std::max(K, V));
    if (backward) {
      d_output.resize(T_ * V);
      dq.resize(T_ * K);
      dk.resize(T_ * K);
      dv.resize(T_ * V);
      dg.resize(T_ * Kg);
      d_state.resize(KV);
    }
    step_decay.resize(T_ * Kg);
    if (mode == RecurrenceMode::Naive) {
      if (backward) states.resize((T_ + 1) * KV);
      return;
    }
    const int64_t BT = layout.max_rows(), BC = std::min(layout.sub_chunk_size, BT);
    start_decay.resize(T_ * Kg);
    exit_decay.resize(T_ * Kg);
    states.resize((layout.num_chunks + 1) * KV);
    if (!keep_scores && !backward) scores.resize(BT * BT);
    if (!scalar_decay) {
      query_decay.resize(BC * K);
      decayed_query.resize(BC * K);
      key_decay.resize(BT * K);
      decayed_key.resize(BT * K);
      diagonal_decay.resize(BC * K);
    }
    if (backward) {
      d_exit_states.resize(layout.num_chunks * KV);
      d_scores.resize(BT * BT);
      state_enter_t.resize(KV);
      d_exit_t.resize(KV);
      last_grad.resize(K);
      last_row_dk_inter.resize(K);
    }
  }
};

// One head's rows as contiguous row-major blocks, starting at some row (the chunk form passes a chunk's first row).
// Naive form: G holds g itself, step_decay that of naive_decays and the other tables are null. Chunk form: G holds the chunk-local cumsum and the
// decay tables are those of chunk_decays.
template <typename T>
struct HeadRows {
  const T* q;            // [n][K]
  const T* k;            // [n][K]
  const T* v;            // [n][V]
  // The gate tables: [n][Kg] (Kg = K per channel, 1 scalar), read at decay_index.
  const T* G;
  const T* step_decay;   // e^{g_t} (Naive: 0 at a reset step)
  const T* start_decay;  // e^{G_t}
  const T* exit_decay;   // e^{G_L − G_t}
  int64_t K, V, Kg;
  const int32_t* resets;  // [n] reset flags (null: none)
  HeadRows from_row(int64_t r) const {
    auto shift = [&](const T* p) { return p ? p + r * Kg : nullptr; };
    return {q + r * K,         k + r * K, v + r * V, G + r * Kg, shift(step_decay), shift(start_decay),
            shift(exit_decay), K,         V,         Kg,         resets ? resets + r : nullptr};
  }
  bool resets_at(int64_t t) const { return resets && resets[t] != 0; }
};

template <typename T>
HeadRows<T> head_rows(const HeadScratch<T>& s, const HeadDims& d) {
  auto table = [](const std::vector<T>& t) { return t.empty() ? nullptr : t.data(); };
  const int64_t Kg = static_cast<int64_t>(s.gate.size()) / d.time;
  return {s.q.data(),           s.k.data(),          s.v.data(), s.gate.data(), table(s.step_decay),
          table(s.start_decay), table(s.exit_decay), d.key_dim,  d.value_dim,   Kg,
          s.resets};
}

// Where the state restarts inside one chunk of n rows (its HeadRows' resets), as the chunk form's masks.
class ChunkSegments {
 public:
  ChunkSegments(const int32_t* flags, int64_t n) : resets_{flags} {
    first_ = resets_.first_in(0, n);
    last_ = resets_.last_in(0, n);
    if (!flags) return;
    segment_start_.resize(static_cast<size_t>(n));
    for (int64_t t = 0, start = 0; t < n; ++t) {
      if (resets_.at(t)) start = t;
      segment_start_[static_cast<size_t>(t)] = start;
    }
  }
  // Row t sees the state entering the chunk (no reset in rows 0..t).
  bool enters(int64_t t) const { return t < first_; }
  // Rows from this one on reach the state leaving the chunk (0 without a reset).
  int64_t first_exiting() const { return std::max<int64_t>(last_, 0); }
  // The state entering the chunk reaches the one leaving it (no reset at all).
  bool passes() const { return last_ < 0; }
  // For j <= i: row j's key reaches row i's query (no reset in rows j+1..i).
  bool pair(int64_t i, int64_t j) const {
    return segment_start_.empty() || j >= segment_start_[static_cast<size_t>(i)];
  }
  bool any() const { return !passes(); }

 private:
  SequenceResets resets_;
  int64_t first_ = 0, last_ = -1;
  std::vector<int64_t> segment_start_;  // [n]: the last reset row <= t, or 0 (empty without resets)
};

// ---------------------------------------------------------------------------------------------------------------------
// Naive form.

// The step decays e^{g_t} of one head's `time` rows of K gates each (the gate table's width) into step_decay, 0 at a
// reset step (the state restarts there).
template <typename T>
HGRN_VECTOR_CLONES void naive_decays(const T* g, const int32_t* resets, int64_t time, int64_t K, T* step_decay) {
  for (int64_t i = 0; i < time * K; ++i) step_decay[i] = cpu_exp(g[i]);
  if (resets)
    for (int64_t t = 0; t < time; ++t)
      if (resets[t] != 0) std::fill_n(step_decay + t * K, K, T(0));
}

// The step-by-step form's inner loops run over the value index j in blocks of kLanes, as GCC vector-extension lanes:
// every lane operation is one IEEE operation per element, so the machine's vector width cannot change a result, and
// a sum over j (dot products) goes lane by lane in block order, then adds the lanes in a fixed tree. A remainder of
// V mod kLanes columns is done one element at a time into the same lanes.
constexpr int64_t kLanes = 8;
template <typename T>
struct LanesOf {
  typedef T type __attribute__((vector_size(kLanes * sizeof(T))));
};

template <typename T, typename Lanes>
inline T sum_lanes(const Lanes& lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Runs the recurrence over one head's `time` rows (x.step_decay: naive_decays'). `state` holds S_0 on entry and S_T
// on exit. When `history` is given it receives S_0..S_T ((T+1)·K·V values), which the backward needs for the gate
// gradient; each step then writes its state there directly. Per step and block of columns, o's block accumulates over
// the key channels in order, in registers.
template <bool kScalar, typename T>
HGRN_VECTOR_CLONES void naive_forward_head(const HeadRows<T>& x, int64_t time, T scale, T* state, T* out,
                                           T* history) {
  using Lanes = typename LanesOf<T>::type;
  const int64_t K = x.K, V = x.V, KV = K * V, blocked = V - V % kLanes;
  if (history) std::copy_n(state, KV, history);
  for (int64_t t = 0; t < time; ++t) {
    const T* v_t = x.v + t * V;
    const T* prev = history ? history + t * KV : state;  // next is prev itself without a history: read, then written
    T* next = history ? history + (t + 1) * KV : state;
    const T* key = x.k + t * K;
    const T* query = x.q + t * K;
    T* o_t = out + t * V;
    for (int64_t j0 = 0; j0 < blocked; j0 += kLanes) {
      Lanes v_block, o_block = {};
      std::memcpy(&v_block, v_t + j0, sizeof v_block);
      for (int64_t c = 0; c < K; ++c) {
        Lanes s_block;
        std::memcpy(&s_block, prev + c * V + j0, sizeof s_block);
        s_block = x.step_decay[decay_index<kScalar>(t, c, K)] * s_block + key[c] * v_block;
        std::memcpy(next + c * V + j0, &s_block, sizeof s_block);
        o_block += (scale * query[c]) * s_block;
      }
      std::memcpy(o_t + j0, &o_block, sizeof o_block);
    }
    for (int64_t j = blocked; j < V; ++j) {
      T o = 0;
      for (int64_t c = 0; c < K; ++c) {
        next[c * V + j] = x.step_decay[decay_index<kScalar>(t, c, K)] * prev[c * V + j] + key[c] * v_t[j];
        o += (scale * query[c]) * next[c * V + j];
      }
      o_t[j] = o;
    }
  }
  if (history) std::copy_n(history + time * KV, KV, state);
}

// Reverse-time backward of the recurrence for one head. `d_state` holds dL/dS_T on entry and dL/dS_0 on exit;
// `history` is S_0..S_T from the forward. Per step, going back:
//   o_t = s·q_t S_t                          ⇒ dS_t += s·q_tᵀ dO_t,  dq_t = s·dO_t S_tᵀ
//   S_t = Diag(e^{g_t}) S_{t−1} + k_tᵀ v_t  ⇒ dk_t = dS_t v_tᵀ,  dv_t = k_t dS_t,
//                                              dg_t = e^{g_t} ⊙ rowsum(S_{t−1} ⊙ dS_t),  dS_{t−1} = Diag(e^{g_t}) dS_t.
// One pass over each key channel's row of the states does all of these (at a reset step the decay is 0: dg_t = 0
// and dS_{t−1} = 0). A scalar decay's dg_t is the sum of those rows' terms over the channels.
template <bool kScalar, typename T>
HGRN_VECTOR_CLONES void naive_backward_head(const HeadRows<T>& x, int64_t time, T scale, const T* history,
                                            const T* d_out, T* d_state, T* dq, T* dk, T* dv, T* dg) {
  using Lanes = typename LanesOf<T>::type;
  const int64_t K = x.K, V = x.V, KV = K * V, blocked = V - V % kLanes;
  for (int64_t t = time - 1; t >= 0; --t) {
    const T* state_t = history + (t + 1) * KV;
    const T* state_prev = history + t * KV;
    const T* d_out_t = d_out + t * V;
    const T* v_t = x.v + t * V;
    T* dv_t = dv + t * V;
    std::fill_n(dv_t, V, T(0));
    if constexpr (kScalar) dg[t] = 0;
    for (int64_t c = 0; c < K; ++c) {
      const T decay = x.step_decay[decay_index<kScalar>(t, c, K)], key = x.k[t * K + c], query = scale * x.q[t * K + c];
      const T* s_row = state_t + c * V;
      const T* prev_row = state_prev + c * V;
      T* ds_row = d_state + c * V;
      Lanes dq_lanes = {}, dk_lanes = {}, dg_lanes = {};
      for (int64_t j0 = 0; j0 < blocked; j0 += kLanes) {
        Lanes o, s_block, p, v_block, ds, dv_block;
        std::memcpy(&o, d_out_t + j0, sizeof o);
        std::memcpy(&s_block, s_row + j0, sizeof s_block);
        std::memcpy(&p, prev_row + j0, sizeof p);
        std::memcpy(&v_block, v_t + j0, sizeof v_block);
        std::memcpy(&ds, ds_row + j0, sizeof ds);
        std::memcpy(&dv_block, dv_t + j0, sizeof dv_block);
        dq_lanes += o * s_block;
        ds = ds + query * o;
        dk_lanes += ds * v_block;
        dv_block += key * ds;
        dg_lanes += p * ds;
        ds = decay * ds;
        std::memcpy(ds_row + j0, &ds, sizeof ds);
        std::memcpy(dv_t + j0, &dv_block, sizeof dv_block);
      }
      for (int64_t j = blocked; j < V; ++j) {
        const int64_t lane = j - blocked;
        dq_lanes[lane] += d_out_t[j] * s_row[j];
        const T ds = ds_row[j] + query * d_out_t[j];
        dk_lanes[lane] += ds * v_t[j];
        dv_t[j] += key * ds;
        dg_lanes[lane] += prev_row[j] * ds;
        ds_row[j] = decay * ds;
      }
      dq[t * K + c] = scale * sum_lanes<T>(dq_lanes);
      dk[t * K + c] = sum_lanes<T>(dk_lanes);
      if constexpr (kScalar)
        dg[t] += decay * sum_lanes<T>(dg_lanes);
      else
        dg[t * K + c] = decay * sum_lanes<T>(dg_lanes);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Chunk form. Conventions inside one chunk of n rows: local row indices, L = n − 1 the last row, G_t = Σ_{u ≤ t} g_u
// the chunk-local cumsum (non-increasing because g ≤ 0), S_p = S^(c) the state entering the chunk and dS_e the gradient
// w.r.t. the state leaving it. Every decay is e^{x} with x ≤ 0 (a difference G_i − G_j with i ≥ j, or a product of
// such factors), so nothing can overflow however strong the decay: it only underflows to 0, which is also the value
// being approximated.

// G = chunk-local cumulative sum of g (spec 7.1), in place, and the decay tables every stage reuses:
//   step_decay[t]  = e^{g_t}          (DiagonalBlockDecay)
//   start_decay[t] = e^{G_t}          (from the chunk's entry to row t: S_p's share of o_t, the q side of dS)
//   exit_decay[t]  = e^{G_L − G_t}    (from row t to the chunk's exit: the k side of the state update, dv, dk)
// Restarting the sum at every chunk keeps |G| bounded by BT steps of decay, so the differences keep their precision.
template <typename T>
void chunk_decays(T* gate, const ChunkLayout& layout, int64_t K, T* step_decay, T* start_decay, T* exit_decay) {
  for (int64_t i = 0; i < layout.time * K; ++i) step_decay[i] = std::exp(gate[i]);
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    const int64_t r0 = layout.begin(c), r1 = layout.end(c);
    for (int64_t t = r0 + 1; t < r1; ++t) axpy(T(1), gate + (t - 1) * K, gate + t * K, K);
    const T* G_last = gate + (r1 - 1) * K;
    for (int64_t t = r0; t < r1; ++t)
      for (int64_t a = 0; a < K; ++a) {
        start_decay[t * K + a] = std::exp(gate[t * K + a]);
        exit_decay[t * K + a] = std::exp(G_last[a] - gate[t * K + a]);
      }
  }
}

// Inter-chunk states (7.2 step 1): states[c] = S^(c), the state entering chunk c (states[0] = S_0, filled by the
// caller), and states[NT] = the final state:
//   S^(c+1) = Diag(e^{G_L}) S^(c) + Σ_t (k_t ⊙ e^{G_L − G_t})ᵀ v_t,
// with S^(c)'s term only where it passes the chunk and the sum only over the rows that exit it (ChunkSegments).
template <bool kScalar, typename T>
void chunk_states(const HeadRows<T>& head, const ChunkLayout& layout, T* states) {
  const int64_t K = head.K, V = head.V, KV = K * V;
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    const int64_t n = layout.end(c) - layout.begin(c);
    const HeadRows<T> x = head.from_row(layout.begin(c));
    const T* enter = states + c * KV;
    T* exit = states + (c + 1) * KV;
    const ChunkSegments segments(x.resets, n);
    for (int64_t a = 0; a < K; ++a) {
      const T chunk_decay = x.start_decay[decay_index<kScalar>(n - 1, a, K)];  // e^{G_L}
      for (int64_t j = 0; j < V; ++j) exit[a * V + j] = segments.passes() ? chunk_decay * enter[a * V + j] : T(0);
    }
    for (int64_t t = segments.first_exiting(); t < n; ++t)
      for (int64_t a = 0; a < K; ++a)
        axpy(x.k[t * K + a] * x.exit_decay[decay_index<kScalar>(t, a, K)], x.v + t * V, exit + a * V, V);
  }
}

// Reference-point factors for the block of query rows [a0, a1) against all key rows [0, a0) before it. With the
// reference n = G_{a0}:  e^{G_i − G_j} = e^{G_i − n} · e^{n − G_j}, and both exponents are ≤ 0 (i ≥ a0 > j and G is
// non-increasing). This turns the block of A into one product Q̂ K̂ᵀ instead of a decay per (i, j, feature).
//   query_decay[i − a0] = e^{G_i − n},  decayed_query = q ⊙ query_decay
//   key_decay[j]        = e^{n − G_j},  decayed_key   = k ⊙ key_decay
template <typename T>
void reference_point_factors(const HeadRows<T>& x, int64_t a0, int64_t a1, HeadScratch<T>& s) {
  const int64_t K = x.K;
  const T* reference = x.G + a0 * K;
  for (int64_t i = a0; i < a1; ++i)
    for (int64_t a = 0; a < K; ++a) {
      const T decay = std::exp(x.G[i * K + a] - reference[a]);
      s.query_decay[(i - a0) * K + a] = decay;
      s.decayed_query[(i - a0) * K + a] = x.q[i * K + a] * decay;
    }
  for (int64_t j = 0; j < a0; ++j)
    for (int64_t a = 0; a < K; ++a) {
      const T decay = std::exp(reference[a] - x.G[j * K + a]);
      s.key_decay[j * K + a] = decay;
      s.decayed_key[j * K + a] = x.k[j * K + a] * decay;
    }
}

// The decays e^{G_i − G_j} of a diagonal block [a0, a1)², a row i at a time: row i's decays are row i − 1's times
// λ_i = e^{g_i}, plus e^0 = 1 for j = i. All factors are ≤ 1, so, like the exponent differences, nothing can overflow
// (strong decay just underflows to 0), and an element costs one multiply rather than an exp of G_i − G_j, which is
// what dominated the cost of the chunk form. A product of ≤ BC − 1 factors is also at least as accurate as the
// difference of two cumsums.
template <typename T>
class DiagonalBlockDecay {
 public:
  DiagonalBlockDecay(const HeadRows<T>& x, int64_t a0, T* decay) : x_(x), a0_(a0), decay_(decay) {}
  // Advances to row i (rows must come in order a0, a0 + 1, ...).
  void advance_to(int64_t i) {
    const int64_t K = x_.K;
    const T* step = x_.step_decay + i * K;
    for (int64_t j = a0_; j < i; ++j) {
      T* d = decay_ + (j - a0_) * K;
      for (int64_t a = 0; a < K; ++a) d[a] *= step[a];
    }
    std::fill_n(decay_ + (i - a0_) * K, K, T(1));
  }
  // e^{G_i − G_j} for the current row i and a0 ≤ j ≤ i, as a K-vector.
  const T* to(int64_t j) const { return decay_ + (j - a0_) * x_.K; }

 private:
  HeadRows<T> x_;
  int64_t a0_;
  T* decay_;  // [BC][K]
};

// Sets the entries (i, j <= i) of an [n][n] score matrix (or its gradient) whose pair a reset separates to 0.
template <typename T>
void mask_pairs_across_resets(const ChunkSegments& segments, int64_t n, T* A) {
  if (!segments.any()) return;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j)
      if (!segments.pair(i, j)) A[i * n + j] = T(0);
}

// Intra-chunk scores (7.2 step 2), A [n][n] row-major:
//   A_ij = s · Σ_a q_ia k_ja e^{G_ia − G_ja} for j ≤ i, 0 for j > i.
// Rows are taken a sub-chunk [a0, a1) at a time. Columns before a0 lie strictly below the diagonal and use the
// reference-point factors; the diagonal block is element-wise (DiagonalBlockDecay), and its j > i entries are never
// formed (their decay would be e^{positive}). Pairs across a reset are then set to 0 (ChunkSegments::pair).
// Scalar mode: the decay leaves the channel sum, A_ij = s·e^{G_i − G_j}·(q_i·k_j), one exp per pair (G_i − G_j <= 0).
template <bool kScalar, typename T>
void intra_chunk_scores(const HeadRows<T>& x, int64_t n, int64_t sub_chunk, T scale, HeadScratch<T>& s, T* A) {
  const int64_t K = x.K;
  std::fill_n(A, n * n, T(0));
  if constexpr (kScalar) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j <= i; ++j)
        A[i * n + j] = scale * std::exp(x.G[i] - x.G[j]) * dot(x.q + i * K, x.k + j * K, K);
    mask_pairs_across_resets(ChunkSegments(x.resets, n), n, A);
    return;
  }
  for (int64_t a0 = 0; a0 < n; a0 += sub_chunk) {
    const int64_t a1 = std::min(n, a0 + sub_chunk);
    if (a0 > 0) {
      reference_point_factors(x, a0, a1, s);
      for (int64_t i = a0; i < a1; ++i)
        for (int64_t j = 0; j < a0; ++j)
          A[i * n + j] = scale * dot(s.decayed_query.data() + (i - a0) * K, s.decayed_key.data() + j * K, K);
    }
    DiagonalBlockDecay<T> decay(x, a0, s.diagonal_decay.data());
    for (int64_t i = a0; i < a1; ++i) {
      decay.advance_to(i);
      const T* q_i = x.q + i * K;
      for (int64_t j = a0; j <= i; ++j) {
        const T* k_j = x.k + j * K;
        const T* d = decay.to(j);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t a = 0; a < K; ++a) sum += q_i[a] * k_j[a] * d[a];
        A[i * n + j] = scale * sum;
      }
    }
  }
  mask_pairs_across_resets(ChunkSegments(x.resets, n), n, A);
}

// Output of one chunk (7.2 step 3): o_t = s·(q_t ⊙ e^{G_t}) S_p + Σ_{j ≤ t} A_tj v_j, S_p's term only for the rows
// it enters.
template <bool kScalar, typename T>
void chunk_output(const HeadRows<T>& x, int64_t n, const T* state_enter, const T* A, T scale, T* out) {
  const int64_t K = x.K, V = x.V;
  const ChunkSegments segments(x.resets, n);
  for (int64_t t = 0; t < n; ++t) {
    T* o_t = out + t * V;
    std::fill_n(o_t, V, T(0));
    if (segments.enters(t))
      for (int64_t a = 0; a < K; ++a)
        axpy(scale * x.q[t * K + a] * x.start_decay[decay_index<kScalar>(t, a, K)], state_enter + a * V, o_t, V);
    for (int64_t j = 0; j <= t; ++j) axpy(A[t * n + j], x.v + j * V, o_t, V);
  }
}

// Forward of one head (7.2): G and decays, states, then per chunk A and the output. `state` holds S_0 on entry, S_T
// on exit. `saved_scores` (this head's part) receives every chunk's A for the backward; null when none will run.
template <bool kScalar, typename T>
void chunk_forward_head(HeadScratch<T>& s, const HeadDims& d, const ChunkLayout& layout, T scale, T* state,
                        T* saved_scores) {
  const int64_t KV = d.state_size();
  const HeadRows<T> head = head_rows(s, d);
  chunk_decays(s.gate.data(), layout, head.Kg, s.step_decay.data(), s.start_decay.data(), s.exit_decay.data());
  std::copy_n(state, KV, s.states.data());
  chunk_states<kScalar>(head, layout, s.states.data());
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    const int64_t r0 = layout.begin(c), n = layout.end(c) - r0;
    const HeadRows<T> x = head.from_row(r0);
    T* A = saved_scores ? saved_scores + layout.score_offset(c) : s.scores.data();
    intra_chunk_scores<kScalar>(x, n, layout.sub_chunk_size, scale, s, A);
    chunk_output<kScalar>(x, n, s.states.data() + c * KV, A, scale, s.output.data() + r0 * d.value_dim);
  }
  std::copy_n(s.states.data() + layout.num_chunks * KV, KV, state);
}

// State gradients (7.3 step 2), in reverse over chunks: d_exit[c] = dS_e of chunk c, with d_exit[NT−1] = dS_T, and
//   dS^(c) = Diag(e^{G_L}) dS_e^(c) + s·Σ_t (q_t ⊙ e^{G_t})ᵀ dO_t,
// which is dS_e of chunk c − 1, or for c = 0 the initial state's gradient (left in d_initial); as in chunk_states, the
// first term only where S^(c) passes the chunk, the sum only over the rows it enters.
template <bool kScalar, typename T>
void chunk_state_grads(const HeadRows<T>& head, const T* d_out, const ChunkLayout& layout, T scale, T* d_exit,
                       T* d_initial) {
  const int64_t K = head.K, V = head.V, KV = K * V;
  for (int64_t c = layout.num_chunks - 1; c >= 0; --c) {
    const int64_t r0 = layout.begin(c), n = layout.end(c) - r0;
    const HeadRows<T> x = head.from_row(r0);
    const T* d_exit_c = d_exit + c * KV;
    T* d_enter = c > 0 ? d_exit + (c - 1) * KV : d_initial;
    const ChunkSegments segments(x.resets, n);
    for (int64_t a = 0; a < K; ++a) {
      const T chunk_decay = x.start_decay[decay_index<kScalar>(n - 1, a, K)];  // e^{G_L}
      for (int64_t j = 0; j < V; ++j)
        d_enter[a * V + j] = segments.passes() ? chunk_decay * d_exit_c[a * V + j] : T(0);
    }
    for (int64_t t = 0; segments.enters(t) && t < n; ++t)
      for (int64_t a = 0; a < K; ++a)
        axpy(scale * x.q[t * K + a] * x.start_decay[decay_index<kScalar>(t, a, K)], d_out + (r0 + t) * V,
             d_enter + a * V, V);
  }
}

// dv of one chunk (7.3 step 3): dv_j = Σ_{t ≥ j} A_tj dO_t + (k_j ⊙ e^{G_L − G_j}) dS_e (A masked by the forward;
// the second term for the rows that exit the chunk).
template <bool kScalar, typename T>
void chunk_value_grad(const HeadRows<T>& x, int64_t n, const T* A, const T* d_out, const T* d_exit, T* dv) {
  const int64_t K = x.K, V = x.V;
  std::fill_n(dv, n * V, T(0));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j <= t; ++j) axpy(A[t * n + j], d_out + t * V, dv + j * V, V);
  for (int64_t j = ChunkSegments(x.resets, n).first_exiting(); j < n; ++j)
    for (int64_t a = 0; a < K; ++a)
      axpy(x.k[j * K + a] * x.exit_decay[decay_index<kScalar>(j, a, K)], d_exit + a * V, dv + j * V, V);
}

// dA of one chunk (7.3 step 4): dA_tj = s·(dO_t · v_j) for j ≤ t, 0 above the diagonal (A is causal there) and
// across a reset (A is masked there).
template <typename T>
void chunk_score_grad(const HeadRows<T>& x, int64_t n, const T* d_out, T scale, T* dA) {
  const int64_t V = x.V;
  std::fill_n(dA, n * n, T(0));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j <= t; ++j) dA[t * n + j] = scale * dot(d_out + t * V, x.v + j * V, V);
  mask_pairs_across_resets(ChunkSegments(x.resets, n), n, dA);
}

// Intra-chunk dq, dk (7.3 step 5), accumulated into dq, dk:
//   dq_i += Σ_{j ≤ i} dA_ij k_j ⊙ e^{G_i − G_j},   dk_j += Σ_{i ≥ j} dA_ij q_i ⊙ e^{G_i − G_j}.
// Only the strictly lower pairs j < i are added here; the diagonal ones (j = i, decay 1) are held back until dg has
// been formed (see chunk_gate_grad) and added by add_gate_independent_terms. Same blocks as intra_chunk_scores: for
// query rows [a0, a1) against key rows j < a0, with the reference factors
//   dq_i += query_decay_i ⊙ Σ_j dA_ij decayed_key_j,   dk_j += key_decay_j ⊙ Σ_i dA_ij decayed_query_i;
// the diagonal block is element-wise (DiagonalBlockDecay, one decay shared by both terms).
// Scalar mode: with w_ij = dA_ij·e^{G_i − G_j}, dq_i += Σ_{j < i} w_ij k_j and dk_j += Σ_{i > j} w_ij q_i.
template <bool kScalar, typename T>
void intra_chunk_query_key_grads(const HeadRows<T>& x, int64_t n, int64_t sub_chunk, const T* dA, HeadScratch<T>& s,
                                 T* dq, T* dk) {
  const int64_t K = x.K;
  if constexpr (kScalar) {
    for (int64_t i = 1; i < n; ++i)
      for (int64_t j = 0; j < i; ++j) {
        const T w = dA[i * n + j] * std::exp(x.G[i] - x.G[j]);
        axpy(w, x.k + j * K, dq + i * K, K);
        axpy(w, x.q + i * K, dk + j * K, K);
      }
    return;
  }
  T* sum = s.row.data();
  for (int64_t a0 = 0; a0 < n; a0 += sub_chunk) {
    const int64_t a1 = std::min(n, a0 + sub_chunk);
    if (a0 > 0) {
      reference_point_factors(x, a0, a1, s);
      for (int64_t i = a0; i < a1; ++i) {
        std::fill_n(sum, K, T(0));
        for (int64_t j = 0; j < a0; ++j) axpy(dA[i * n + j], s.decayed_key.data() + j * K, sum, K);
        const T* decay = s.query_decay.data() + (i - a0) * K;
        for (int64_t a = 0; a < K; ++a) dq[i * K + a] += decay[a] * sum[a];
      }
      for (int64_t j = 0; j < a0; ++j) {
        std::fill_n(sum, K, T(0));
        for (int64_t i = a0; i < a1; ++i) axpy(dA[i * n + j], s.decayed_query.data() + (i - a0) * K, sum, K);
        const T* decay = s.key_decay.data() + j * K;
        for (int64_t a = 0; a < K; ++a) dk[j * K + a] += decay[a] * sum[a];
      }
    }
    DiagonalBlockDecay<T> decay(x, a0, s.diagonal_decay.data());
    for (int64_t i = a0; i < a1; ++i) {
      decay.advance_to(i);
      const T* q_i = x.q + i * K;
      T* dq_i = dq + i * K;
      for (int64_t j = a0; j < i; ++j) {
        const T w = dA[i * n + j];
        const T* k_j = x.k + j * K;
        const T* d = decay.to(j);
        T* dk_j = dk + j * K;
        for (int64_t a = 0; a < K; ++a) {
          dq_i[a] += w * k_j[a] * d[a];
          dk_j[a] += w * q_i[a] * d[a];
        }
      }
    }
  }
}

// Inter-chunk dq, dk (7.3 step 6), accumulated into dq, dk, and the gate gradient's d_last:
//   dq_t += s·e^{G_t} ⊙ (dO_t S_pᵀ)
//   dk_j += dk_inter_j = e^{G_L − G_j} ⊙ (v_j dS_eᵀ)
//   d_last = e^{G_L} ⊙ rowsum(S_p ⊙ dS_e) + Σ_j k_j ⊙ dk_inter_j    (G_L also scales S_p and every k in the update)
// With resets, the S_p terms only where S_p enters (dq) or passes (d_last), dk_inter only for rows that exit.
// The last row's dk_inter_L (decay 1) is held back like the diagonal scores and left in last_row_dk_inter; it is left
// out of d_last as well, since its two appearances cancel (see chunk_gate_grad). The products with S_pᵀ and dS_eᵀ are
// formed from the transposed states so that the inner loops run along K. d_last stays per channel in the scalar mode
// (chunk_gate_grad sums it).
template <bool kScalar, typename T>
void chunk_inter_query_key_grads(const HeadRows<T>& x, int64_t n, const T* d_out, const T* state_enter,
                                 const T* d_exit, T scale, HeadScratch<T>& s, T* dq, T* dk) {
  const int64_t K = x.K, V = x.V;
  const auto chunk_decay = [&](int64_t a) { return x.start_decay[decay_index<kScalar>(n - 1, a, K)]; };  // e^{G_L}
  T* last_grad = s.last_grad.data();
  T* sum = s.row.data();
  transpose(state_enter, K, V, s.state_enter_t.data());
  transpose(d_exit, K, V, s.d_exit_t.data());
  const ChunkSegments segments(x.resets, n);
  for (int64_t a = 0; a < K; ++a)
    last_grad[a] = segments.passes() ? chunk_decay(a) * dot(state_enter + a * V, d_exit + a * V, V) : T(0);
  for (int64_t t = 0; t < n; ++t) {
    if (segments.enters(t)) {
      std::fill_n(sum, K, T(0));
      for (int64_t j = 0; j < V; ++j) axpy(d_out[t * V + j], s.state_enter_t.data() + j * K, sum, K);
      for (int64_t a = 0; a < K; ++a) dq[t * K + a] += scale * x.start_decay[decay_index<kScalar>(t, a, K)] * sum[a];
    }

    std::fill_n(sum, K, T(0));
    for (int64_t j = 0; j < V; ++j) axpy(x.v[t * V + j], s.d_exit_t.data() + j * K, sum, K);
    T* dk_inter = t == n - 1 ? s.last_row_dk_inter.data() : dk + t * K;
    const bool exits = t >= segments.first_exiting();
    for (int64_t a = 0; a < K; ++a) {
      const T term = exits ? x.exit_decay[decay_index<kScalar>(t, a, K)] * sum[a] : T(0);
      if (t == n - 1) {
        dk_inter[a] = term;
      } else {
        dk_inter[a] += term;
        last_grad[a] += x.k[t * K + a] * term;
      }
    }
  }
}

// Gate gradient of one chunk (7.3 step 6):  dg_t = Σ_{u ≥ t in chunk} (q_u ⊙ dq_u − k_u ⊙ dk_u) + d_last.
// Why: q enters only as q ⊙ e^{G}, so ∂L/∂G_t ∋ q_t ⊙ dq_t; k only as k ⊙ e^{−G} ⇒ −k_t ⊙ dk_t; G_L additionally
// scales S_p and every k in the state update ⇒ d_last; and g_u is part of every G_t with t ≥ u in its chunk, which
// makes dg the reverse cumulative sum of ∂L/∂G. The sum runs from the last row backwards (rather than as
// r − cumsum(r) + sum(r)). dq, dk must not yet contain the terms whose decay is identically 1: a diagonal score's
// e^{G_i − G_i} and the last row's e^{G_L − G_L} in the state update do not depend on g, so in the sum they appear once
// with + and once with − and cancel exactly. In floating point those O(1) pairs would leave a rounding residue of
// ~eps·O(1), which swamps a true dg that strong decay makes tiny (~e^{−20}); held back, they cannot.
// With resets the sum runs within each segment: d_last belongs to the last one, and a reset row's own dg is exactly
// 0 (the loss does not depend on a gate whose decay a reset replaces; its segment's terms cancel in exact arithmetic,
// so summing them would only leave their rounding residue, as above).
// Scalar mode: G_t is every channel's, so its gradient is the channels' sum: dg_t = Σ_a d_last_a + Σ_{u ≥ t}
// (q_u·dq_u − k_u·dk_u).
template <bool kScalar, typename T>
void chunk_gate_grad(const HeadRows<T>& x, int64_t n, const T* dq, const T* dk, const T* last_grad, T* dg) {
  const int64_t K = x.K;
  if constexpr (kScalar) {
    T running = 0;
    for (int64_t a = 0; a < K; ++a) running += last_grad[a];
    for (int64_t t = n - 1; t >= 0; --t) {
      running += dot(x.q + t * K, dq + t * K, K) - dot(x.k + t * K, dk + t * K, K);
      dg[t] = running;
      if (x.resets_at(t)) dg[t] = running = T(0);
    }
    return;
  }
  for (int64_t a = 0; a < K; ++a) {
    T running = last_grad[a];
    for (int64_t t = n - 1; t >= 0; --t) {
      running += x.q[t * K + a] * dq[t * K + a] - x.k[t * K + a] * dk[t * K + a];
      dg[t * K + a] = running;
      if (x.resets_at(t)) dg[t * K + a] = running = T(0);
    }
  }
}

// Completes dq, dk with the gate-independent terms held back for chunk_gate_grad: the diagonal scores'
// dq_i += dA_ii k_i and dk_i += dA_ii q_i, and the last row's dk_inter_L.
template <typename T>
void add_gate_independent_terms(const HeadRows<T>& x, int64_t n, const T* dA, const T* last_row_dk_inter, T* dq,
                                T* dk) {
  const int64_t K = x.K;
  for (int64_t i = 0; i < n; ++i) {
    axpy(dA[i * n + i], x.k + i * K, dq + i * K, K);
    axpy(dA[i * n + i], x.q + i * K, dk + i * K, K);
  }
  axpy(T(1), last_row_dk_inter, dk + (n - 1) * K, K);
}

// Backward of one head (7.3): G and decays, the states S^(c) recomputed, dS_e per chunk in reverse, then each chunk on
// its own: dv (with the forward's A), dA, intra dq/dk, inter dq/dk and dg. Leaves the per-head gradients in s.dq, s.dk,
// s.dv, s.dg and the initial state's gradient in s.d_state, which holds dS_T on entry.
template <bool kScalar, typename T>
void chunk_backward_head(HeadScratch<T>& s, const HeadDims& d, const ChunkLayout& layout, T scale,
                         const T* initial_state, const T* saved_scores) {
  const int64_t K = d.key_dim, V = d.value_dim, KV = d.state_size();
  const HeadRows<T> head = head_rows(s, d);
  chunk_decays(s.gate.data(), layout, head.Kg, s.step_decay.data(), s.start_decay.data(), s.exit_decay.data());

  std::copy_n(initial_state, KV, s.states.data());
  chunk_states<kScalar>(head, layout, s.states.data());

  std::copy_n(s.d_state.data(), KV, s.d_exit_states.data() + (layout.num_chunks - 1) * KV);
  chunk_state_grads<kScalar>(head, s.d_output.data(), layout, scale, s.d_exit_states.data(), s.d_state.data());

  std::fill(s.dq.begin(), s.dq.end(), T(0));
  std::fill(s.dk.begin(), s.dk.end(), T(0));
  for (int64_t c = 0; c < layout.num_chunks; ++c) {
    const int64_t r0 = layout.begin(c), n = layout.end(c) - r0;
    const HeadRows<T> x = head.from_row(r0);
    const T* A = saved_scores + layout.score_offset(c);
    const T* d_out = s.d_output.data() + r0 * V;
    const T* state_enter = s.states.data() + c * KV;
    const T* d_exit = s.d_exit_states.data() + c * KV;
    T* dq = s.dq.data() + r0 * K;
    T* dk = s.dk.data() + r0 * K;

    chunk_value_grad<kScalar>(x, n, A, d_out, d_exit, s.dv.data() + r0 * V);
    chunk_score_grad(x, n, d_out, scale, s.d_scores.data());
    intra_chunk_query_key_grads<kScalar>(x, n, layout.sub_chunk_size, s.d_scores.data(), s, dq, dk);
    chunk_inter_query_key_grads<kScalar>(x, n, d_out, state_enter, d_exit, scale, s, dq, dk);
    chunk_gate_grad<kScalar>(x, n, dq, dk, s.last_grad.data(), s.dg.data() + r0 * head.Kg);
    add_gate_independent_terms(x, n, s.d_scores.data(), s.last_row_dk_inter.data(), dq, dk);
  }
}

// ---------------------------------------------------------------------------------------------------------------------
// Drivers: one OpenMP iteration per (batch, head) pair.

// Below this much work (multiply-adds of the step-by-step form, B·H·T·K·V) a call runs on one thread: starting and
// joining a team would cost more than the work itself (the finite-difference tests make thousands of tiny calls).
constexpr int64_t kMinParallelWork = 1 << 15;

bool worth_parallel(const HeadDims& d) {
  return d.pairs() > 1 && d.pairs() * d.time * d.state_size() >= kMinParallelWork;
}

// Copies the (b, h) pair's rows of q, k, v and g into the thread's scratch: where forward and backward both start.
template <typename T>
void gather_head_inputs(const GlaIo<T>& io, const HeadDims& d, int64_t b, int64_t h, HeadScratch<T>& s) {
  gather_head(io.q, d, b, h, d.key_dim, s.q.data());
  gather_head(io.k, d, b, h, d.key_dim, s.k.data());
  gather_head(io.v, d, b, h, d.value_dim, s.v.data());
  switch (io.decay) {
    case DecayKind::PerChannel: gather_head(io.g, d, b, h, d.key_dim, s.gate.data()); break;
    case DecayKind::PerStep: gather_head(io.g, d, b, h, 1, s.gate.data()); break;
    case DecayKind::PerHead: std::fill(s.gate.begin(), s.gate.end(), io.g.data[h]); break;
  }
  s.resets = io.resets ? io.resets + b * d.time : nullptr;
}

// The pair's [K][V] block of a [B·H][K][V] state or state gradient, or zeros where that tensor is absent (null: the
// initial state is S_0 = 0, or the final state's gradient is zero).
template <typename T>
void pair_state_or_zero(const T* states, int64_t pair, const HeadDims& d, T* dst) {
  const int64_t KV = d.state_size();
  if (states)
    std::copy_n(states + pair * KV, KV, dst);
  else
    std::fill_n(dst, KV, T(0));
}

template <bool kScalar, typename T>
void gla_forward_cpu(const GlaIo<T>& io, const HeadDims& d, const ChunkLayout& layout, RecurrenceMode mode,
                       T scale) {
  const int64_t V = d.value_dim, KV = d.state_size();
  const int64_t scores_per_pair = mode == RecurrenceMode::Chunk ? layout.scores_per_sequence() : 0;
#pragma omp parallel if (worth_parallel(d))
  {
    HeadScratch<T> s(d, mode, layout, /*backward=*/false, /*keep_scores=*/io.saved_scores != nullptr, kScalar);
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < d.pairs(); ++pair) {
      const int64_t b = pair / d.heads, h = pair % d.heads;
      gather_head_inputs(io, d, b, h, s);
      T* state = io.final_state + pair * KV;  // starts as S_0, ends as S_T
      pair_state_or_zero(io.initial_state, pair, d, state);
      if (mode == RecurrenceMode::Naive) {
        const HeadRows<T> x = head_rows(s, d);
        naive_decays(s.gate.data(), s.resets, d.time, x.Kg, s.step_decay.data());
        naive_forward_head<kScalar>(x, d.time, scale, state, s.output.data(), static_cast<T*>(nullptr));
      } else {
        T* saved = io.saved_scores ? io.saved_scores + pair * scores_per_pair : nullptr;
        chunk_forward_head<kScalar>(s, d, layout, scale, state, saved);
      }
      scatter_head(s.output.data(), d, b, h, V, io.output);
    }
  }
}

template <bool kScalar, typename T>
void gla_backward_cpu(const GlaIo<T>& io, const HeadDims& d, const ChunkLayout& layout, RecurrenceMode mode,
                        T scale) {
  const int64_t K = d.key_dim, V = d.value_dim, KV = d.state_size();
  const int64_t scores_per_pair = mode == RecurrenceMode::Chunk ? layout.scores_per_sequence() : 0;
#pragma omp parallel if (worth_parallel(d))
  {
    HeadScratch<T> s(d, mode, layout, /*backward=*/true, /*keep_scores=*/false, kScalar);
    std::vector<T> initial(KV);
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < d.pairs(); ++pair) {
      const int64_t b = pair / d.heads, h = pair % d.heads;
      gather_head_inputs(io, d, b, h, s);
      if (io.d_output.data)
        gather_head(io.d_output, d, b, h, V, s.d_output.data());
      else
        std::fill(s.d_output.begin(), s.d_output.end(), T(0));
      pair_state_or_zero(io.d_final_state, pair, d, s.d_state.data());
      pair_state_or_zero(io.initial_state, pair, d, initial.data());

      if (mode == RecurrenceMode::Naive) {
        const HeadRows<T> x = head_rows(s, d);
        naive_decays(s.gate.data(), s.resets, d.time, x.Kg, s.step_decay.data());
        naive_forward_head<kScalar>(x, d.time, scale, initial.data(), s.output.data(), s.states.data());
        naive_backward_head<kScalar>(x, d.time, scale, s.states.data(), s.d_output.data(), s.d_state.data(),
                                     s.dq.data(), s.dk.data(), s.dv.data(), s.dg.data());
      } else {
        chunk_backward_head<kScalar>(s, d, layout, scale, initial.data(), io.scores + pair * scores_per_pair);
      }

      if (io.dq.data) scatter_add_head(s.dq.data(), d, b, h, K, io.dq);
      if (io.dk.data) scatter_add_head(s.dk.data(), d, b, h, K, io.dk);
      if (io.dv.data) scatter_add_head(s.dv.data(), d, b, h, V, io.dv);
      if (io.dg.data) scatter_add_head(s.dg.data(), d, b, h, kScalar ? 1 : K, io.dg);
      if (io.d_initial_state) axpy(T(1), s.d_state.data(), io.d_initial_state + pair * KV, KV);
    }
  }
}

// An GlaIo with the inputs that forward and backward both read; the caller adds its outputs.
template <typename T>
GlaIo<T> io_with_inputs(const Var& q, const Var& k, const Var& v, const Var& g, DecayKind decay,
                        const Var& initial_state) {
  GlaIo<T> io;
  io.q = rows_of<const T>(q->value);
  io.k = rows_of<const T>(k->value);
  io.v = rows_of<const T>(v->value);
  io.g = rows_of<const T>(g->value);
  io.decay = decay;
  io.initial_state = initial_state ? initial_state->value.data<T>() : nullptr;
  return io;
}

// The gradient of an input read by rows (q, k, v, g) for the backward to add into: a column block of a fused
// projection's output gets its place in the projection's gradient (row-strided), zeroed where it is new. Null rows
// where x wants none.
template <typename T>
Rows<T> rows_gradient(const Var& x) {
  if (!wants_grad(x)) return {};
  bool accumulate = false;
  Tensor& grad = grad_buffer_for_write(x, &accumulate, GradLayout::RowStrided);
  if (!accumulate) grad.zero();
  return rows_of<T>(grad);
}

#ifdef HGRN_WITH_CUDA
// The row strides of q, k and v, which the kernels read in place (their gradients' are set by the backward).
GlaCudaRowStrides input_strides(const Var& q, const Var& k, const Var& v) {
  GlaCudaRowStrides s;
  s.q = q->value.row_stride();
  s.k = k->value.row_stride();
  s.v = v->value.row_stride();
  return s;
}

// The GPU backward forms the per-chunk states S^(c) only for dq, dk and dg: whether it reads them at all.
bool backward_reads_states(const Var& q, const Var& k, const Var& g) {
  return wants_grad(q) || wants_grad(k) || wants_grad(g);
}

const uint64_t* masks_or_null(const Tensor& t) {
  return t.defined() ? reinterpret_cast<const uint64_t*>(t.data<int64_t>()) : nullptr;
}

GlaCudaShape cuda_shape(const HeadDims& d) {
  GlaCudaShape s;
  s.batch = d.batch;
  s.time = d.time;
  s.heads = d.heads;
  s.key_dim = d.key_dim;
  s.value_dim = d.value_dim;
  return s;
}

// g's shape as the CUDA kernels name it (they read every shape as it is: the scalar ones run their scalar-decay mode).
GlaDecay cuda_decay(DecayKind decay) {
  switch (decay) {
    case DecayKind::PerChannel: return GlaDecay::PerChannel;
    case DecayKind::PerStep: return GlaDecay::PerStep;
    case DecayKind::PerHead: return GlaDecay::PerHead;
  }
  return GlaDecay::PerChannel;
}

// dst += src on the GPU, one dtype and shape: src contiguous, dst row-strided (a column block's gradient goes through
// a contiguous copy).
void add_into_rows(Tensor& dst, const Tensor& src) {
  if (dst.is_contiguous()) {
    cuda_accumulate(dst.raw_data(), src.raw_data(), dst.numel(), dst.dtype());
    return;
  }
  Tensor sum = Tensor::empty(dst.shape(), dst.dtype(), Device::CUDA);
  sum.copy_from(dst);
  cuda_accumulate(sum.raw_data(), src.raw_data(), sum.numel(), sum.dtype());
  dst.copy_from(sum);
}

// The CUDA backward: gradients of both outputs (either may be undefined) into the inputs that want one (+=). With
// `gates` (q, g and k are those gates), where this is the only gradient q, g and k get and q̂ and f̂ take fresh
// ones, the gates' backward runs in the recurrence's (GlaGatesEpilogue): q̂'s, f̂'s and γ's gradients are written
// here and dq, dk, dg never exist; otherwise they are formed for the gates' own backward.
void gla_backward_cuda(const Var& q, const Var& k, const Var& v, const Var& g, DecayKind decay,
                         const Var& initial_state, const Var& out, const Var& final_out, const Tensor& saved_scores,
                         const Tensor& kept_states, const Tensor& reset_masks, const HeadDims& dims, double scale,
                         const Hgrn2GatesOrigin* gates) {
  const GlaCudaShape shape = cuda_shape(dims);
  const Device device = Device::CUDA;
  if (out->grad.defined())
    HGRN_CHECK(out->grad.dtype() == out->value.dtype(), "gla_recurrence: output gradient dtype ",
               dtype_name(out->grad.dtype()), " differs from the output's ", dtype_name(out->value.dtype()));
  if (final_out->grad.defined())
    HGRN_CHECK(final_out->grad.dtype() == DType::F32, "gla_recurrence: final-state gradient must be fp32");
  const bool fuse_gates = gates && !q->grad.defined() && !k->grad.defined() && !g->grad.defined() &&
                          wants_grad(gates->q_hat) && wants_grad(gates->f_hat) && !gates->q_hat->grad.defined() &&
                          !gates->f_hat->grad.defined();
  const bool need_states = backward_reads_states(q, k, g);
  // The forward's states where it kept them, else scratch that the backward recomputes them into.
  const bool states_given = need_states && kept_states.defined();
  const Tensor states = !need_states ? Tensor()
                        : states_given
                            ? kept_states
                            : Tensor::empty({gla_cuda_states_elements(shape)}, q->value.dtype(), device);
  const Tensor d_scores = Tensor::empty({gla_cuda_scores_elements(shape)}, DType::F32, device);
  GlaCudaBackwardArgs a;
  a.q = q->value.raw_data();
  a.k = k->value.raw_data();
  a.v = v->value.raw_data();
  a.strides = input_strides(q, k, v);
  a.act = q->value.dtype();
  a.g = g->value.data<float>();
  a.decay = cuda_decay(decay);
  a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
  a.scale = static_cast<float>(scale);
  a.scores = saved_scores.raw_data();
  a.d_output = out->grad.defined() ? out->grad.raw_data() : nullptr;
  a.d_final_state = final_out->grad.defined() ? final_out->grad.data<float>() : nullptr;
  // Gradients that do not exist yet are written, not accumulated (no zero fill, no read-back).
  Tensor gate_partials;
  if (fuse_gates) {
    GlaGatesEpilogue& e = a.gates;
    const Tensor &q_hat = gates->q_hat->value, &f_hat = gates->f_hat->value;
    HGRN_CHECK(q_hat.dtype() == a.act && f_hat.dtype() == a.act, "gla_recurrence: the gates' q_hat and f_hat are ",
               dtype_name(q_hat.dtype()), "/", dtype_name(f_hat.dtype()), ", expected ", dtype_name(a.act));
    e.q_hat = q_hat.raw_data();
    e.q_hat_stride = q_hat.row_stride();
    e.f_hat = f_hat.raw_data();
    e.f_hat_stride = f_hat.row_stride();
    const int64_t width = dims.heads * dims.key_dim;
    if (gates->bounded) e.gamma_row = gates->gamma->value.data<float>() + gates->layer * width;
    // Fresh column blocks of the q/f/i split's gradient (checked above: neither has one yet), f̂'s asked for first
    // as the gates' own backward does.
    bool add_df = false, add_dq = false;
    const Tensor& df_hat = grad_buffer_for_write(gates->f_hat, &add_df, GradLayout::RowStrided);
    const Tensor& dq_hat = grad_buffer_for_write(gates->q_hat, &add_dq, GradLayout::RowStrided);
    HGRN_CHECK(!add_df && !add_dq, "gla_recurrence: internal error: the gates' fresh gradients would accumulate");
    e.df_hat = df_hat.raw_data();
    e.df_hat_stride = df_hat.row_stride();
    e.dq_hat = dq_hat.raw_data();
    e.dq_hat_stride = dq_hat.row_stride();
    if (gates->bounded && wants_grad(gates->gamma)) {
      e.dgamma_row = grad_buffer(gates->gamma).data<float>() + gates->layer * width;  // each layer adds its row
      gate_partials = Tensor::empty({gla_cuda_gate_partials_elements(shape)}, DType::F32, device);
      e.partials = gate_partials.data<float>();
    }
  }
  // A column block of a split gets its place in the split's gradient (row-strided).
  if (wants_grad(q) && !fuse_gates) {
    const Tensor& dq = grad_buffer_for_write(q, &a.accumulate_dq, GradLayout::RowStrided);
    a.dq = dq.raw_data();
    a.strides.dq = dq.row_stride();
  }
  // One Var passed again as k or v (as q, or v as k) gets that gradient too: the kernels write each gradient once,
  // having read all the old values first (dq and dk), or before dq and dk (dv, in bwd_dv), so one buffer as two of
  // them would keep only one write, onto uninitialised memory where it is fresh. The repeat is written into scratch
  // of its own (contiguous, fresh) and added into the Var's gradient after the kernels.
  Tensor dk_repeat, dv_repeat;
  if (wants_grad(k) && !fuse_gates) {
    if (k == q) {
      dk_repeat = Tensor::empty(k->value.shape(), a.act, device);
      a.dk = dk_repeat.raw_data();
      a.accumulate_dk = false;
    } else {
      const Tensor& dk = grad_buffer_for_write(k, &a.accumulate_dk, GradLayout::RowStrided);
      a.dk = dk.raw_data();
      a.strides.dk = dk.row_stride();
    }
  }
  if (wants_grad(v)) {
    if ((v == q && a.dq) || (v == k && a.dk)) {
      dv_repeat = Tensor::empty(v->value.shape(), a.act, device);
      a.dv = dv_repeat.raw_data();
      a.accumulate_dv = false;
    } else {
      const Tensor& dv = grad_buffer_for_write(v, &a.accumulate_dv, GradLayout::RowStrided);
      a.dv = dv.raw_data();
      a.strides.dv = dv.row_stride();
    }
  }
  a.dg = wants_grad(g) && !fuse_gates ? grad_buffer_for_write(g, &a.accumulate_dg).data<float>() : nullptr;
  // A [B, T, H] g's gradient with several K-tiles: the kernel sums each tile's channels apart, then adds them up.
  const int64_t dg_partials_elements = a.dg && decay == DecayKind::PerStep ? gla_cuda_dg_partials_elements(shape) : 0;
  const Tensor dg_partials =
      dg_partials_elements ? Tensor::empty({dg_partials_elements}, DType::F32, device) : Tensor();
  a.dg_partials = dg_partials.defined() ? dg_partials.data<float>() : nullptr;
  a.d_initial_state = wants_grad(initial_state) ? grad_buffer(initial_state).data<float>() : nullptr;
  a.states = need_states ? states.raw_data() : nullptr;
  a.states_given = states_given;
  a.reset_masks = masks_or_null(reset_masks);
  const Tensor d_states = Tensor::empty({gla_cuda_states_elements(shape)}, gla_cuda_state_gradients_dtype(a), device);
  a.d_states = d_states.raw_data();
  a.d_scores = d_scores.data<float>();
  gla_cuda_backward(shape, a);
  if (dk_repeat.defined()) add_into_rows(k->grad, dk_repeat);
  if (dv_repeat.defined()) add_into_rows(v->grad, dv_repeat);
}
#endif

}  // namespace

GlaOutputs gla_recurrence(Tape& tape, const Var& q, const Var& k, const Var& v, const Var& g,
                              const Var& initial_state, int64_t num_heads, double scale, RecurrenceMode mode,
                              int64_t chunk_size, std::shared_ptr<const Hgrn2GatesOrigin> gates, bool keep_states,
                              const Tensor& resets) {
  HGRN_CHECK(q && k && v && g, "gla_recurrence: q, k, v and g are required");
  HGRN_CHECK(!gates || (gates->q == q && gates->k == k && gates->g == g),
             "gla_recurrence: the gates' origin given is not that of these q, k and g");
  const Tensor& qv = q->value;
  HGRN_CHECK(qv.dim() == 3, "gla_recurrence: q must be [B, T, H*K], got ", shape_str(qv.shape()));
  HGRN_CHECK(num_heads > 0, "gla_recurrence: num_heads must be positive, got ", num_heads);
  const int64_t batch = qv.size(0), time = qv.size(1), key_features = qv.size(2);
  HGRN_CHECK(batch > 0 && time > 0 && key_features > 0, "gla_recurrence: empty q ", shape_str(qv.shape()));
  HGRN_CHECK(key_features % num_heads == 0, "gla_recurrence: q's width ", key_features, " is not divisible by ",
             num_heads, " heads");
  HGRN_CHECK(k->value.shape() == qv.shape(), "gla_recurrence: k ", shape_str(k->value.shape()), " must match q ",
             shape_str(qv.shape()));
  // K = 1 makes [B, T, H] q's shape: per channel then, the same thing.
  const Shape& g_shape = g->value.shape();
  const bool per_channel = g_shape == qv.shape(), per_step = g_shape == Shape{batch, time, num_heads},
             per_head = g_shape == Shape{num_heads};
  HGRN_CHECK(per_channel || per_step || per_head, "gla_recurrence: g ", shape_str(g_shape), " must match q ",
             shape_str(qv.shape()), ", be [", batch, ", ", time, ", ", num_heads,
             "] (a log decay per head and step) or [", num_heads, "] (a log decay per head)");
  const DecayKind decay = per_channel ? DecayKind::PerChannel : per_step ? DecayKind::PerStep : DecayKind::PerHead;
  HGRN_CHECK(decay != DecayKind::PerHead || !wants_grad(g),
             "gla_recurrence: a per-head log decay g is a constant and takes no gradient");
  HGRN_CHECK(decay == DecayKind::PerChannel || !gates,
             "gla_recurrence: the HGRN2 gates' origin comes with per-channel gates");
  const Tensor& vv = v->value;
  HGRN_CHECK(vv.dim() == 3 && vv.size(0) == batch && vv.size(1) == time && vv.size(2) > 0 &&
                 vv.size(2) % num_heads == 0,
             "gla_recurrence: v must be [", batch, ", ", time, ", H*V] with ", num_heads, " heads, got ",
             shape_str(vv.shape()));
  const HeadDims dims{batch, time, num_heads, key_features / num_heads, vv.size(2) / num_heads};
  const Shape state_shape{batch, num_heads, dims.key_dim, dims.value_dim};
  if (initial_state)
    HGRN_CHECK(initial_state->value.shape() == state_shape, "gla_recurrence: initial_state must be ",
               shape_str(state_shape), ", got ", shape_str(initial_state->value.shape()));
  const DType dtype = qv.dtype();
  // On the GPU (mixed precision): q, k, v in the activation dtype, g, the initial and final states fp32, the per-chunk
  // states (scratch of the forward and the backward) in the activation dtype. On the CPU: one dtype.
  const Device device = qv.device();
  const bool on_cuda = device == Device::CUDA;
  check_resets(resets, batch, time, device, "gla_recurrence");
  for (const Var& x : {q, k, v, g, initial_state}) {
    if (!x) continue;
    HGRN_CHECK(x->value.device() == device, "gla_recurrence: inputs mix ", device_name(device), " and ",
               device_name(x->value.device()));
    // q, k and v may be column blocks of one fused projection's output (linear_columns), read in place.
    const bool by_rows = x == q || x == k || x == v;
    HGRN_CHECK(by_rows ? x->value.is_row_strided() : x->value.is_contiguous(),
               "gla_recurrence: g and initial_state must be contiguous, q, k and v row-strided");
  }
  for (const Var& x : {k, v}) {
    HGRN_CHECK(x->value.dtype() == dtype, "gla_recurrence: inputs mix ", dtype_name(dtype), " and ",
               dtype_name(x->value.dtype()));
  }
  const DType gate_dtype = on_cuda ? DType::F32 : dtype;
  for (const Var& x : {g, initial_state}) {
    if (!x) continue;
    HGRN_CHECK(x->value.dtype() == gate_dtype, "gla_recurrence: ", x == g ? "g" : "initial_state", " must be ",
               dtype_name(gate_dtype), " here, got ", dtype_name(x->value.dtype()));
  }
  HGRN_CHECK(chunk_size >= 0, "gla_recurrence: chunk_size must be >= 0 (0 = automatic), got ", chunk_size);
  HGRN_CHECK(std::isfinite(scale), "gla_recurrence: scale must be finite, got ", scale);
  const ChunkLayout layout(time, chunk_size);

  // The same test op_output applies: a backward will be recorded iff the tape records and an input wants a gradient.
  bool records = false;
  if (tape.enabled())
    for (const Var& x : {q, k, v, g, initial_state}) records = records || wants_grad(x);

  Tensor output, final_state, saved_scores, kept_states, reset_masks;
  if (on_cuda) {
#ifdef HGRN_WITH_CUDA
    reset_masks = reset_chunk_masks(resets);  // kept for the backward
    // The CUDA kernels always run the chunk form with 64-step chunks (both modes compute the same function).
    const GlaCudaShape shape = cuda_shape(dims);
    output = Tensor::empty({batch, time, num_heads * dims.value_dim}, dtype, device);
    final_state = Tensor::empty(state_shape, DType::F32, device);
    if (records) saved_scores = Tensor::empty({gla_cuda_scores_elements(shape)}, dtype, device);
    const Tensor states = Tensor::empty({gla_cuda_states_elements(shape)}, dtype, device);
    GlaCudaForwardArgs a;
    a.q = qv.raw_data();
    a.k = k->value.raw_data();
    a.v = vv.raw_data();
    a.strides = input_strides(q, k, v);
    a.act = dtype;
    a.g = g->value.data<float>();
    a.decay = cuda_decay(decay);
    a.initial_state = initial_state ? initial_state->value.data<float>() : nullptr;
    a.scale = static_cast<float>(scale);
    a.output = output.raw_data();
    a.final_state = final_state.data<float>();
    a.scores = saved_scores.defined() ? saved_scores.raw_data() : nullptr;
    a.states = states.raw_data();
    a.reset_masks = masks_or_null(reset_masks);
    gla_cuda_forward(shape, a);
    if (records && keep_states && backward_reads_states(q, k, g)) kept_states = states;
#else
    throw Error("gla_recurrence: this hgrn was built without CUDA");
#endif
  } else {
    output = Tensor::empty({batch, time, num_heads * dims.value_dim}, dtype);
    final_state = Tensor::empty(state_shape, dtype);
    if (records && mode == RecurrenceMode::Chunk)
      saved_scores = Tensor::empty({dims.pairs() * layout.scores_per_sequence()}, dtype);
    HGRN_DISPATCH_FLOAT(dtype, "gla_recurrence", [&] {
      GlaIo<scalar_t> io = io_with_inputs<scalar_t>(q, k, v, g, decay, initial_state);
      io.output = rows_of<scalar_t>(output);
      io.final_state = final_state.data<scalar_t>();
      io.saved_scores = saved_scores.defined() ? saved_scores.data<scalar_t>() : nullptr;
      io.resets = resets.defined() ? resets.data<int32_t>() : nullptr;
      if (decay == DecayKind::PerChannel)
        gla_forward_cpu<false>(io, dims, layout, mode, static_cast<scalar_t>(scale));
      else
        gla_forward_cpu<true>(io, dims, layout, mode, static_cast<scalar_t>(scale));
    });
  }

  GlaOutputs result{op_output(tape, output, {q, k, v, g, initial_state}),
                      op_output(tape, final_state, {q, k, v, g, initial_state})};
  if (!result.output->requires_grad) return result;
  Var out = result.output, final_out = result.final_state;
  tape.record([q, k, v, g, decay, initial_state, out, final_out, saved_scores, kept_states, resets, reset_masks, dims,
               layout, mode, scale, gates] {
    // Either output may have received no gradient (the loss did not use it): it then contributes zero.
    if (!out->grad.defined() && !final_out->grad.defined()) return;
    if (q->value.device() == Device::CUDA) {
#ifdef HGRN_WITH_CUDA
      gla_backward_cuda(q, k, v, g, decay, initial_state, out, final_out, saved_scores, kept_states, reset_masks, dims,
                        scale, gates.get());
#else
      throw Error("gla_recurrence: this hgrn was built without CUDA");
#endif
      return;
    }
    HGRN_DISPATCH_FLOAT(q->value.dtype(), "gla_recurrence backward", [&] {
      GlaIo<scalar_t> io = io_with_inputs<scalar_t>(q, k, v, g, decay, initial_state);
      io.scores = saved_scores.defined() ? saved_scores.data<scalar_t>() : nullptr;
      if (out->grad.defined()) io.d_output = rows_of<const scalar_t>(out->grad);
      io.d_final_state = final_out->grad.defined() ? final_out->grad.data<scalar_t>() : nullptr;
      io.resets = resets.defined() ? resets.data<int32_t>() : nullptr;
      // Gradient buffers are allocated here, outside the parallel region (grad_buffer is not thread-safe).
      io.dq = rows_gradient<scalar_t>(q);
      io.dk = rows_gradient<scalar_t>(k);
      io.dv = rows_gradient<scalar_t>(v);
      io.dg = rows_gradient<scalar_t>(g);
      io.d_initial_state = wants_grad(initial_state) ? grad_buffer(initial_state).data<scalar_t>() : nullptr;
      if (decay == DecayKind::PerChannel)
        gla_backward_cpu<false>(io, dims, layout, mode, static_cast<scalar_t>(scale));
      else
        gla_backward_cpu<true>(io, dims, layout, mode, static_cast<scalar_t>(scale));
    });
  });
  return result;
}

}  // namespace hgrn
