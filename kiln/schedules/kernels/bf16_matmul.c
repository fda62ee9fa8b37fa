/* Kiln's bf16 matmul micro-kernel for --precision bf16 on AVX512-BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids):
 * out[M, N] = epilogue(x[M, K] x w) with w in bf16 (packed at compile time), accumulated in float32 by vdpbf16ps:
 * 16 outputs x 2 inputs per instruction, twice the multiply-adds of an fp32 FMA. TVM 0.27 cannot emit vdpbf16ps
 * (its LLVM code generator has no bfloat vector type), so this file is compiled into each artifact's library and
 * called from TIR (kiln/compiler/passes/bf16_matmul_kernel.py, fuse_bf16_matmul_epilogue.py).
 *
 * x16   [M, K]            bf16 rows (K even), converted by the producer's kernel (its epilogue), or NULL and
 * x     [M, K]            float32 rows, converted to bf16 here, 48 rows at a time (an odd K)
 * w     [N/16, K2, 16, 2] bf16, K2 = K/2 rounded up (a zero row past an odd K): input pairs x 16 outputs
 * bias  [N]               float32, or NULL
 * res   [M, N]            float32 residual (flags & MM_RES), or NULL
 * out   [M, N]            float32, or NULL;  out16 [M, N] bf16 (what the next bf16 matmul reads), or NULL
 * The epilogue, on each 16-column vector while it is in registers: + bias, then the activation (GELU in its erf
 * or tanh form, ReLU), then + residual; stored in float32 and/or bf16.
 * A task computes rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16; its register tiles are 6 rows x 4 blocks
 * or 8 rows x 3 (tile_rows: 24 of the 32 zmm as accumulators either way), each over all of K. 8 x 3 fills a
 * 128-row matmul exactly (6 x 4 computes 132 rows) and loads fewer weight vectors per row; where x is larger
 * than L2 (M > 256 at K = 768), its extra column groups re-read x and 6 x 4 is faster
 * (bf16_matmul_kernel.tile_rows). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "avx512_matmul_epilogue.h"
#include "bf16_rows.h"

#define MAX_ROWS 48 /* rows of float32 x a task converts at once (its bf16 copy lives on the stack) */

/* rows of x as bf16 pairs (a zero past an odd K) */
static void to_bf16(const float *x, int K, int K2, int rows, int32_t *xb) {
  for (int r = 0; r < rows; ++r) {
    uint16_t *dst = (uint16_t *)(xb + (int64_t)r * K2);
    bf16_row(x + (int64_t)r * K, K, dst);
    if (K % 2) dst[K] = 0;
  }
}

#define DEFINE_TILE(R, NB)                                                                                        \
  static void tile##R##x##NB(const int32_t *xb, const uint16_t *w, const mm_epilogue *ep, int64_t r0, int K2,     \
                             int rows, int nb) {                                                                  \
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
      __m512 bv = ep->bias ? _mm512_loadu_ps(ep->bias + (nb + b) * 16) : _mm512_setzero_ps();                     \
      for (int r = 0; r < rows && r < R; ++r)                                                                     \
        store(ep, _mm512_add_ps(acc[r][b], bv), (r0 + r) * ep->N + (nb + b) * 16);                                \
    }                                                                                                             \
  }
DEFINE_TILE(6, 1)
DEFINE_TILE(6, 2)
DEFINE_TILE(6, 3)
DEFINE_TILE(6, 4)
DEFINE_TILE(8, 1)
DEFINE_TILE(8, 2)
DEFINE_TILE(8, 3)

typedef void (*tile_fn)(const int32_t *, const uint16_t *, const mm_epilogue *, int64_t, int, int, int);
static const tile_fn TILES6[4] = {tile6x1, tile6x2, tile6x3, tile6x4};
static const tile_fn TILES8[3] = {tile8x1, tile8x2, tile8x3};

/* one task: rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16; a column group of G blocks at a time over
 * all the task's rows, so the group's weights (G x K2 x 64 bytes) stay in L2 while every row tile reads them */
int kiln_bf16_matmul(const float *x, const int32_t *x16, const uint16_t *w, const float *bias, const float *res,
                     float *out, uint16_t *out16, int flags, int tile_rows, int M, int N, int K, int m0, int rows, int nb0,
                     int nb1) {
  const mm_epilogue ep = {bias, res, out, out16, flags, N};
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
    const int R = tile_rows == 8 ? 8 : 6, G = R == 8 ? 3 : 4; /* G: blocks of 16 columns a tile holds */
    const tile_fn *tiles = R == 8 ? TILES8 : TILES6;
    for (int nb = nb0; nb < nb1; nb += G) {
      int blocks = nb1 - nb < G ? nb1 - nb : G;
      for (int r = 0; r < n; r += R)
        tiles[blocks - 1](xb + (int64_t)r * K2, w, &ep, r0 + r, K2, n - r, nb);
    }
  }
  return 0;
}
