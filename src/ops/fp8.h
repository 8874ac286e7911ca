// fp8.h: the reference arithmetic of FP8 training on the CPU: the two OCP FP8 formats and their conversions, per-tensor
// delayed scaling (Transformer Engine's default recipe) and the scaled FP8 GEMM as cuBLASLt defines it. These are the
// building blocks that a GPU FP8 path is tested against (docs/fp8.md), and Fp8CodesOut, where an op writes codes.
#pragma once
#include <cstdint>
#include <vector>

namespace hgrn {

// E4M3: OCP "E4M3FN", bias 7, 3 mantissa bits, largest finite 448, no infinities, NaN = S.1111.111 (for weights and
// activations). E5M2: bias 15, 2 mantissa bits, largest finite 57344, IEEE infinities S.11111.00 and NaNs
// S.11111.{01,10,11} (for gradients).
enum class Fp8Format { E4M3, E5M2 };

const char* fp8_format_name(Fp8Format format);
float fp8_max_finite(Fp8Format format);  // 448 or 57344

// fp32 -> FP8 code, bit for bit CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format), the cast Transformer
// Engine's scaled casts use: round to nearest, ties to even (subnormal results included); |x| beyond the largest finite
// value, infinities included, saturates to ±max finite (a scaled cast must never make an infinity or, in E4M3, a NaN
// out of a finite overflow); a result that rounds to zero keeps x's sign; every NaN gives 0x7F (sign dropped).
uint8_t fp8_from_float(float x, Fp8Format format);

// FP8 code -> fp32, exact for every non-NaN code (infinities stay infinities); a NaN code gives 0x7FFFFFFF, CUDA's
// canonical NaN (what its fp8 -> half -> float conversion gives).
float fp8_to_float(uint8_t code, Fp8Format format);

// out[i] = fp8_from_float(x[i] * scale): the product rounded to fp32 first, as a GPU kernel computes it.
void fp8_quantize(const float* x, int64_t n, float scale, Fp8Format format, uint8_t* out);

// max |x[i]| with the GPU's fmaxf rule (every NaN element skipped, signalling ones too; an infinity kept): the amax a
// cast kernel reports; the order of the reduction then cannot change the result. 0 for n = 0.
float fp8_amax(const float* x, int64_t n);

// FP8 codes that an op writes in place of its output (its producer-side cast: a projection's input made as codes, with
// no act-dtype copy): codes[i] = fp8_from_float(out[i] · *scale) with out[i] first rounded to the op's dtype, so the
// codes are those of the output cast afterwards; *amax, where not null, folds max |out[i]| as a cast does. The
// pointers live where the op runs.
struct Fp8CodesOut {
  uint8_t* codes = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
  Fp8Format format = Fp8Format::E4M3;
};

// Delayed scaling of one tensor: the scale used at a step comes from the amaxes of earlier steps. The state is flat
// (a float vector, an index and a float) so that it checkpoints as is.
struct Fp8ScalingState {
  std::vector<float> amax_history;  // a ring of the last N steps' amaxes; [position] is the current step's
  int64_t position = 0;
  float scale = 1.0f;  // the quantising multiplier: code = fp8(x · scale)
};

// A fresh state: history of `history_length` zeros (Transformer Engine's default length is 1024), scale 1.
Fp8ScalingState fp8_scaling_state(int64_t history_length);

// Folds a quantisation's amax into the current step's slot (fmaxf: several casts of one tensor in a step keep the
// largest; a NaN amax is skipped).
void fp8_record_amax(Fp8ScalingState& state, float amax);

// End of a step: Transformer Engine's delayed-scaling update with the "max" amax algorithm, one rule a line:
//  - if the current step's amax is 0 (nothing recorded), nothing moves: history, position and scale stay;
//  - amax = max over the whole history (the current step's and the N - 1 before it);
//  - the ring advances and the new current slot (the oldest amax) is zeroed;
//  - if amax is finite and > 0: scale = (fp8_max · 2^-margin) / amax in fp32 (fp8_max · 2^-margin first, as TE does);
//  - otherwise (an infinite amax in the window) the previous scale stays;
//  - a scale that overflows to infinity (a tiny amax) becomes FLT_MAX.
// margin >= 0 shrinks the scale by 2^margin to leave headroom (TE's default 0).
void fp8_update_scale(Fp8ScalingState& state, Fp8Format format, int margin);

// The dequantising factor 1 / scale (fp32 division), which cuBLASLt takes as the A/B scale (fp8_gemm_cpu).
inline float fp8_scale_inverse(float scale) { return 1.0f / scale; }

// The FP8 GEMM as cuBLASLt computes it with CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER set, in hgrn's row-major form:
// C = (a_scale_inv · b_scale_inv) · op(A)·op(B) + beta·C, with A and B FP8 codes [m, k] / [k, n] after op (row-major,
// leading dimensions lda / ldb), C fp32. cuBLASLt's A/B scales *multiply* (they "convert data in matrix A to the compute
// data type range", i.e. dequantise), so they are the inverses 1/scale of the quantising scales, as Transformer
// Engine passes them. Every product of two FP8 values is exact in fp32; they are summed in fp32 and the factor
// a_scale_inv · b_scale_inv (one fp32 product) is applied to the sum. The summation order is not cuBLASLt's (its
// result is only comparable within a tolerance). E5M2 × E5M2 is refused, as cuBLASLt refuses it.
void fp8_gemm_cpu(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint8_t* a, int64_t lda,
                  Fp8Format a_format, float a_scale_inv, const uint8_t* b, int64_t ldb, Fp8Format b_format,
                  float b_scale_inv, float beta, float* c, int64_t ldc);

}  // namespace hgrn
