/* Kiln's bf16 matmul on AMX tiles (AMX-BF16: tdpbf16ps, 16 rows x 16 columns x 32 inputs per instruction, fp32
 * accumulation) for --precision bf16 on Sapphire Rapids and later: bf16_matmul.c's call (the same arguments and
 * epilogue), with the weights packed for AMX's B operand. One tdpbf16ps does 8192 multiply-adds where a vdpbf16ps
 * does 32.
 *
 * x16   [M, K]              bf16 rows (K even), or NULL and
 * x     [M, K]              float32 rows, converted to bf16 here
 * w     [N/16, KP/2, 16, 2] bf16, KP = K rounded up to 32 (zeros past K): a B tile is 16 input pairs x 16 columns,
 *                           1 KiB contiguous
 * bias, res, out, out16     as bf16_matmul.c
 * A task computes rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16, 32 rows at a time: for each pair of
 * column blocks, 2 x 2 accumulator tiles (tiles 0..3; A tiles 4..5, B tiles 6..7) over all of K, each stored once
 * to a 1 KiB fp32 buffer from which the epilogue writes the output. Rows are read in place where 32 whole rows of
 * bf16 x with K a multiple of 32 are there, else copied (converted, zero-padded to 32 rows and KP inputs) into a
 * per-thread buffer. The process must hold the AMX tile state (kiln.runtime.hostinfo.enable_amx). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "avx512_matmul_epilogue.h"
#include "bf16_rows.h"

#define STEP 32 /* rows a step computes: two A tiles */

/* rows [r0, r0 + n) of x as STEP rows of KP bf16 (zeros past K and past row n) */
static void gather(const float *x, const uint16_t *x16, int K, int KP, int64_t r0, int n, uint16_t *dst) {
  for (int r = 0; r < STEP; ++r, dst += KP) {
    if (r >= n) {
      memset(dst, 0, (size_t)KP * 2);
      continue;
    }
    if (x16)
      memcpy(dst, x16 + (r0 + r) * K, (size_t)K * 2);
    else
      bf16_row(x + (r0 + r) * K, K, dst);
    memset(dst + K, 0, (size_t)(KP - K) * 2);
  }
}

/* the epilogue of accumulator tile `acc` (16 x 16 fp32): its first n rows, from output row r0, column block nb */
static void store_tile(const float *acc, const mm_epilogue *ep, int64_t r0, int n, int nb) {
  const __m512 bias = ep->bias ? _mm512_loadu_ps(ep->bias + nb * 16) : _mm512_setzero_ps();
  for (int t = 0; t < n; ++t) store(ep, _mm512_add_ps(_mm512_loadu_ps(acc + t * 16), bias), (r0 + t) * ep->N + nb * 16);
}

/* Prefetch of the weights the thread's next task reads (the next column group), into L2 a few lines per step
 * over the whole task, so streaming them from memory overlaps this task's tile products: a layer's weights are
 * read once per run and do not stay in cache between runs (ViT-B's are 170 MB in bf16). */
typedef struct {
  const char *next, *end;
  int per_step; /* lines per step of 32 inputs */
} prefetch;

static inline void prefetch_some(prefetch *pf) {
  for (int i = 0; i < pf->per_step && pf->next < pf->end; ++i, pf->next += 64) _mm_prefetch(pf->next, _MM_HINT_T1);
}

/* BM row tiles x BN column blocks over all of K; a: the step's rows (lda bytes apart), n of them valid */
#define DEFINE_BLOCK(BM, BN)                                                                                           \
  static void block##BM##BN(const uint16_t *a, int64_t lda, const uint16_t *w, int K2P, const mm_epilogue *ep,       \
                            int64_t r0, int n, int nb, prefetch *pf) {                                                 \
    float acc[16 * 16] __attribute__((aligned(64)));                                                                   \
    _tile_zero(0);                                                                                                     \
    if (BN > 1) _tile_zero(1);                                                                                         \
    if (BM > 1) _tile_zero(2);                                                                                         \
    if (BM > 1 && BN > 1) _tile_zero(3);                                                                               \
    const char *a0 = (const char *)a, *a1 = a0 + 16 * lda;                                                             \
    const uint16_t *w0 = w + (int64_t)nb * K2P * 32, *w1 = w0 + (int64_t)K2P * 32;                                     \
    for (int64_t k2 = 0; k2 < K2P; k2 += 16) {                                                                         \
      prefetch_some(pf);                                                                                               \
      _tile_loadd(4, a0 + k2 * 4, lda);                                                                                \
      _tile_loadd(6, w0 + k2 * 32, 64);                                                                                \
      _tile_dpbf16ps(0, 4, 6);                                                                                         \
      if (BN > 1) {                                                                                                    \
        _tile_loadd(7, w1 + k2 * 32, 64);                                                                              \
        _tile_dpbf16ps(1, 4, 7);                                                                                       \
      }                                                                                                                \
      if (BM > 1) {                                                                                                    \
        _tile_loadd(5, a1 + k2 * 4, lda);                                                                              \
        _tile_dpbf16ps(2, 5, 6);                                                                                       \
        if (BN > 1) _tile_dpbf16ps(3, 5, 7);                                                                           \
      }                                                                                                                \
    }                                                                                                                  \
    const int n0 = n < 16 ? n : 16;                                                                                    \
    _tile_stored(0, acc, 64);                                                                                          \
    store_tile(acc, ep, r0, n0, nb);                                                                                   \
    if (BN > 1) {                                                                                                      \
      _tile_stored(1, acc, 64);                                                                                        \
      store_tile(acc, ep, r0, n0, nb + 1);                                                                             \
    }                                                                                                                  \
    if (BM > 1) {                                                                                                      \
      _tile_stored(2, acc, 64);                                                                                        \
      store_tile(acc, ep, r0 + 16, n - 16, nb);                                                                        \
    }                                                                                                                  \
    if (BM > 1 && BN > 1) {                                                                                            \
      _tile_stored(3, acc, 64);                                                                                        \
      store_tile(acc, ep, r0 + 16, n - 16, nb + 1);                                                                    \
    }                                                                                                                  \
  }
DEFINE_BLOCK(1, 1)
DEFINE_BLOCK(1, 2)
DEFINE_BLOCK(2, 1)
DEFINE_BLOCK(2, 2)

int kiln_amx_bf16_matmul(const float *x, const uint16_t *x16, const uint16_t *w, const float *bias, const float *res,
                         float *out, uint16_t *out16, int flags, int tile_rows, int M, int N, int K, int m0, int rows,
                         int nb0, int nb1) {
  (void)tile_rows;
  const mm_epilogue ep = {bias, res, out, out16, flags, N};
  const int KP = (K + 31) / 32 * 32, K2P = KP / 2;
  const int end = m0 + rows < M ? m0 + rows : M;
  uint16_t *buf = scratch((size_t)STEP * KP);
  if (!buf) return -1;
  load_tiles(16);
  /* the next task's weights: the column group after this one (tasks() numbers a thread's tasks by column) */
  const int blocks = N / 16, nn = nb1 + (nb1 - nb0) < blocks ? nb1 + (nb1 - nb0) : blocks;
  const int64_t panel = (int64_t)K2P * 64, steps = ((end - m0 + STEP - 1) / STEP) * ((nb1 - nb0 + 1) / 2) * (K2P / 16);
  prefetch pf = {(const char *)(w + (int64_t)nb1 * K2P * 32), (const char *)(w + (int64_t)nn * K2P * 32), 0};
  if (nn > nb1) pf.per_step = (int)(((nn - nb1) * panel / 64 + steps - 1) / steps);
  for (int64_t r0 = m0; r0 < end; r0 += STEP) {
    const int n = end - r0 < STEP ? (int)(end - r0) : STEP;
    const uint16_t *a = buf;
    int64_t lda = (int64_t)KP * 2;
    if (x16 && n == STEP && K == KP) {
      a = x16 + r0 * K;
    } else {
      gather(x, x16, K, KP, r0, n, buf);
    }
    int nb = nb0;
    if (n > 16) {
      for (; nb + 2 <= nb1; nb += 2) block22(a, lda, w, K2P, &ep, r0, n, nb, &pf);
      if (nb < nb1) block21(a, lda, w, K2P, &ep, r0, n, nb, &pf);
    } else {
      for (; nb + 2 <= nb1; nb += 2) block12(a, lda, w, K2P, &ep, r0, n, nb, &pf);
      if (nb < nb1) block11(a, lda, w, K2P, &ep, r0, n, nb, &pf);
    }
  }
  _tile_release();
  return 0;
}
