/* float32 -> bf16 rows for the AVX512-BF16 and AMX matmul kernels (bf16_matmul.c, amx_bf16_matmul.c): round to
 * nearest even, as vcvtne2ps2bf16 does (finite values). */
#ifndef KILN_BF16_ROWS_H
#define KILN_BF16_ROWS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* K floats of src -> K bf16 of dst */
static inline void bf16_row(const float *src, int K, uint16_t *dst) {
  int k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k));
    _mm512_storeu_si512((void *)(dst + k), (__m512i)v);
  }
  for (; k < K; ++k) {
    uint32_t u;
    memcpy(&u, src + k, 4);
    dst[k] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
}
#endif
