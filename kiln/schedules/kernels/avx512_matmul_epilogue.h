/* The epilogue of Kiln's AVX-512 matmul kernels (bf16_matmul.c: vdpbf16ps, f32_matmul.c: fp32 FMAs), on each
 * 16-column output vector while it is in registers: the activation (GELU in its erf or tanh form, ReLU), then
 * + residual; stored in float32 and/or (where the build has AVX512-BF16) bf16. The caller adds the bias. */
#ifndef KILN_AVX512_MATMUL_EPILOGUE_H
#define KILN_AVX512_MATMUL_EPILOGUE_H
#include <immintrin.h>
#include <stdint.h>

#include "matmul_epilogue.h"

/* odd polynomial p(x) / even q(x) in x^2: Eigen's rational erf and tanh (clamped), max error 4e-7 */
static inline __m512 rational(__m512 x, const float *a, int na, const float *b, int nb) {
  __m512 x2 = _mm512_mul_ps(x, x), p = _mm512_set1_ps(a[na - 1]), q = _mm512_set1_ps(b[nb - 1]);
  for (int i = na - 2; i >= 0; --i) p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(a[i]));
  for (int i = nb - 2; i >= 0; --i) q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(b[i]));
  __m512 r = _mm512_rcp14_ps(q); /* 1 / q to 14 bits, then one Newton step (vdivps costs 5 cycles a vector) */
  r = _mm512_mul_ps(r, _mm512_fnmadd_ps(q, r, _mm512_set1_ps(2.0f)));
  return _mm512_mul_ps(_mm512_mul_ps(p, x), r);
}

static inline __m512 clamp(__m512 x, float lim) {
  return _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-lim)), _mm512_set1_ps(lim));
}

/* GELU: 0.5 v (1 + erf(v / sqrt 2)), or its tanh form 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) */
static inline __m512 activate(__m512 v, int flags) {
  if (flags & MM_RELU) return _mm512_max_ps(v, _mm512_setzero_ps());
  __m512 t;
  if (flags & MM_GELU_ERF) {
    t = rational(clamp(_mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f)), 4.0f), ERF_A, 7, ERF_B, 5);
  } else if (flags & MM_GELU_TANH) {
    __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(v, v), v), _mm512_set1_ps(0.044715f), v);
    t = rational(clamp(_mm512_mul_ps(inner, _mm512_set1_ps(0.79788456080286536f)), 7.90531110763549805f), TANH_A,
                 7, TANH_B, 4);
  } else {
    return v;
  }
  return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0.5f)), _mm512_add_ps(t, _mm512_set1_ps(1.0f)));
}

/* the epilogue of one 16-column vector of output row r (its offset o = r * N + column) */
static inline void store(const mm_epilogue *ep, __m512 v, int64_t o) {
  v = activate(v, ep->flags);
  if (ep->flags & MM_RES) v = _mm512_add_ps(v, _mm512_loadu_ps(ep->res + o));
  if (ep->out) _mm512_storeu_ps(ep->out + o, v);
#ifdef __AVX512BF16__
  if (ep->out16) _mm256_storeu_si256((__m256i *)(ep->out16 + o), (__m256i)_mm512_cvtneps_pbh(v));
#endif
}
#endif
