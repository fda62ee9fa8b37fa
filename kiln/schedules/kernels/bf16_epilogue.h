/* The epilogue of Kiln's bf16 conv kernels (bf16_conv.c: vdpbf16ps, amx_bf16_conv.c: AMX tiles), applied as each
 * output vector of 16 channels is stored: + bias (added by the caller), + residual (fp32, or bf16 with EP_RES16:
 * a bf16 build's residual stream), GELU (erf or tanh form: a conv1d front end's), clamp to [lo, hi] (ReLU, ReLU6), written in fp32 and/or bf16 (kiln/compiler/passes/bf16_conv_kernel.py: Epilogue, its flags).
 * f32_conv.c (the float32 conv on AVX-512 FMAs) stores through it too. */
#ifndef KILN_BF16_EPILOGUE_H
#define KILN_BF16_EPILOGUE_H
#include <immintrin.h>
#include <stdint.h>

#include "avx512_matmul_epilogue.h" /* activate: GELU, erf or tanh form */

enum { EP_BIAS = 1, EP_RES = 2, EP_CLAMP = 4, EP_F32 = 8, EP_BF16 = 16, EP_RES16 = 32, EP_GELU_ERF = 64, EP_GELU_TANH = 128 };

typedef struct {
  const float *bias, *res; /* res: uint16_t bf16 bits with EP_RES16 */
  float *out;
  uint16_t *out16;
  int flags;
  float lo, hi;
} epilogue;

/* v rounded to bf16 (to nearest even), as 16 x 16 bits: vcvtneps2bf16 where the build has AVX512-BF16 (the bf16
 * kernels), else the same rounding in integer ops (f32_conv.c, built for AVX-512F alone; NaN is not special-cased:
 * an fp32 conv writes bf16 only for a bf16 cast after it) */
static inline __m256i bf16_bits(__m512 v) {
#ifdef __AVX512BF16__
  return (__m256i)_mm512_cvtneps_pbh(v);
#else
  const __m512i x = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
#endif
}

/* v (the accumulator plus bias) at output offset o: residual, clamp, then the fp32 and/or bf16 store */
static inline void epilogue_store(const epilogue *ep, __m512 v, int64_t o) {
  const int flags = ep->flags;
  if (flags & EP_RES16) {
    const __m256i r = _mm256_loadu_si256((const __m256i *)((const uint16_t *)ep->res + o));
    v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r), 16)));
  } else if (flags & EP_RES) {
    v = _mm512_add_ps(v, _mm512_loadu_ps(ep->res + o));
  }
  if (flags & (EP_GELU_ERF | EP_GELU_TANH)) v = activate(v, flags & EP_GELU_ERF ? MM_GELU_ERF : MM_GELU_TANH);
  if (flags & EP_CLAMP) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(ep->lo)), _mm512_set1_ps(ep->hi));
  if (flags & EP_F32) _mm512_storeu_ps(ep->out + o, v);
  if (flags & EP_BF16) _mm256_storeu_si256((__m256i *)(ep->out16 + o), bf16_bits(v));
}
#endif
