/* Kiln's bf16 matmul micro-kernel for --precision bf16 on AVX512-BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids):
 * out[M, N] = x[M, K] x w (bf16, packed at compile time) (+ bias), accumulated in float32 by vdpbf16ps: 16 outputs x 2 inputs per instruction, twice the multiply-adds
 * of an fp32 FMA. TVM 0.27 cannot emit vdpbf16ps (its LLVM code generator has no bfloat vector type), so this
 * file is compiled into each artifact's library and called from TIR (kiln/compiler/passes/bf16_matmul_kernel.py).
 *
 * x16  [M, K]            bf16 rows (K even), converted by the producer's kernel (its epilogue), or NULL and
 * x    [M, K]            float32 rows, converted to bf16 here, 48 rows at a time (an odd K)
 * w    [N/16, K2, 16, 2] bf16 bits, K2 = K/2 rounded up (a zero row past an odd K): input pairs x 16 outputs
 * bias [N]               float32, or NULL
 * out  [M, N]            float32
 * A task computes rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16; its register tiles are R rows x NB <= 4
 * blocks (24 of the 32 zmm as accumulators), each over all of K. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define R 6
#define MAX_ROWS 48 /* rows of float32 x a task converts at once (its bf16 copy lives on the stack) */

/* rows of x as bf16 pairs (round to nearest even; a zero past an odd K) */
static void to_bf16(const float *x, int K, int K2, int rows, int32_t *xb) {
  for (int r = 0; r < rows; ++r) {
    const float *src = x + (int64_t)r * K;
    uint16_t *dst = (uint16_t *)(xb + (int64_t)r * K2);
    int k = 0;
    for (; k + 32 <= K; k += 32) {
      __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16), _mm512_loadu_ps(src + k));
      _mm512_storeu_si512((void *)(dst + k), (__m512i)v);
    }
    for (; k < K; ++k) { /* round to nearest even, as vcvtne2ps2bf16 (finite values) */
      uint32_t u;
      memcpy(&u, src + k, 4);
      dst[k] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    if (K % 2) dst[K] = 0;
  }
}

#define DEFINE_TILE(NB)                                                                                           \
  static void tile##NB(const int32_t *xb, const uint16_t *w, const float *bias, float *out, int N, int K2,        \
                       int rows, int nb) {                                                                        \
    __m512 acc[R][NB];                                                                                            \
    for (int r = 0; r < R; ++r)                                                                                   \
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();                                               \
    const int32_t *xr[R];                                                                                         \
    for (int r = 0; r < R; ++r) xr[r] = xb + (int64_t)(r < rows ? r : rows - 1) * K2;                             \
    const uint16_t *wp = w + (int64_t)nb * K2 * 32;                                                               \
    for (int k = 0; k < K2; ++k) {                                                                                \
      __m512bh wv[NB];                                                                                            \
      for (int b = 0; b < NB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512((const void *)(wp + ((int64_t)b * K2 + k) * 32)); \
      for (int r = 0; r < R; ++r) {                                                                               \
        __m512bh xv = (__m512bh)_mm512_set1_epi32(xr[r][k]);                                                      \
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);                          \
      }                                                                                                           \
    }                                                                                                             \
    for (int b = 0; b < NB; ++b) {                                                                                \
      __m512 bv = bias ? _mm512_loadu_ps(bias + (nb + b) * 16) : _mm512_setzero_ps();                             \
      for (int r = 0; r < rows && r < R; ++r) _mm512_storeu_ps(out + (int64_t)r * N + (nb + b) * 16, _mm512_add_ps(acc[r][b], bv)); \
    }                                                                                                             \
  }
DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(3)
DEFINE_TILE(4)

typedef void (*tile_fn)(const int32_t *, const uint16_t *, const float *, float *, int, int, int, int);
static const tile_fn TILES[4] = {tile1, tile2, tile3, tile4};

/* one task: rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16; a column group of 4 blocks at a time over
 * all the task's rows, so the group's weights (4 x K2 x 64 bytes) stay in L2 while every row tile reads them */
int kiln_bf16_matmul(const float *x, const int32_t *x16, const uint16_t *w, const float *bias, float *out, int M,
                     int N, int K, int m0, int rows, int nb0, int nb1) {
  int K2 = (K + 1) / 2;
  int end = m0 + rows < M ? m0 + rows : M;
  for (int r0 = m0; r0 < end; r0 += MAX_ROWS) {
    int n = end - r0 < MAX_ROWS ? end - r0 : MAX_ROWS;
    const int32_t *xb;
    if (x16) {
      xb = x16 + (int64_t)r0 * K2;
    } else {
      int32_t *buf = (int32_t *)__builtin_alloca(sizeof(int32_t) * (size_t)n * K2);
      to_bf16(x + (int64_t)r0 * K, K, K2, n, buf);
      xb = buf;
    }
    for (int nb = nb0; nb < nb1; nb += 4) {
      int blocks = nb1 - nb < 4 ? nb1 - nb : 4;
      for (int r = 0; r < n; r += R)
        TILES[blocks - 1](xb + (int64_t)r * K2, w, bias, out + (int64_t)(r0 + r) * N, N, K2, n - r, nb);
    }
  }
  return 0;
}
