/* The epilogue of Kiln's bf16 conv kernels (bf16_conv.c: vdpbf16ps, amx_bf16_conv.c: AMX tiles), applied as each
 * output vector of 16 channels is stored: + bias (added by the caller), + residual (fp32, or bf16 with EP_RES16:
 * a bf16 build's residual stream), clamp to [lo, hi] (ReLU, ReLU6), written in fp32 and/or bf16 (kiln/compiler/passes/bf16_conv_kernel.py: Epilogue, its flags). */
#ifndef KILN_BF16_EPILOGUE_H
#define KILN_BF16_EPILOGUE_H
#include <immintrin.h>
#include <stdint.h>

enum { EP_BIAS = 1, EP_RES = 2, EP_CLAMP = 4, EP_F32 = 8, EP_BF16 = 16, EP_RES16 = 32 };

typedef struct {
  const float *bias, *res; /* res: uint16_t bf16 bits with EP_RES16 */
  float *out;
  uint16_t *out16;
  int flags;
  float lo, hi;
} epilogue;

/* v (the accumulator plus bias) at output offset o: residual, clamp, then the fp32 and/or bf16 store */
static inline void epilogue_store(const epilogue *ep, __m512 v, int64_t o) {
  const int flags = ep->flags;
  if (flags & EP_RES16) {
    const __m256i r = _mm256_loadu_si256((const __m256i *)((const uint16_t *)ep->res + o));
    v = _mm512_add_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(r), 16)));
  } else if (flags & EP_RES) {
    v = _mm512_add_ps(v, _mm512_loadu_ps(ep->res + o));
  }
  if (flags & EP_CLAMP) v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(ep->lo)), _mm512_set1_ps(ep->hi));
  if (flags & EP_F32) _mm512_storeu_ps(ep->out + o, v);
  if (flags & EP_BF16) _mm256_storeu_si256((__m256i *)(ep->out16 + o), (__m256i)_mm512_cvtneps_pbh(v));
}
#endif
