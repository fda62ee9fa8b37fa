/* Kiln's float32 matmul micro-kernel on AVX-512: out[M, N] = epilogue(x[M, K] x w), w packed at compile time.
 * The same task split, register tiles and epilogue as bf16_matmul.c (its symbol's arguments too, so one PrimFunc
 * shape calls either), with fp32 FMAs. Against TVM's schedule of the same tile (schedules/rules/matmul.py) it
 * keeps rows that do not fill a tile on a tile of their own row count (31 rows: five 6-row tiles and one 1-row
 * tile, where the padded schedule computed 32 or 36), adds the bias and the fused activation and residual as the
 * accumulators are stored (no float32 intermediate written and read back), and splits the work into the same
 * large tasks on every thread count; timings in benchmarks/history.md.
 *
 * x     [M, K]            float32 rows
 * w     [N/16, K, 16]     float32: 16 columns of every input, one contiguous stream per block of columns
 * bias  [N]               float32, or NULL
 * res   [M, N]            float32 residual (flags & MM_RES), or NULL
 * out   [M, N]            float32
 * A task computes rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16: CHUNK rows at a time through every column
 * group of G blocks, each group over the chunk's rows, so the chunk of x stays in L2 while the task's groups read
 * it and a group's weights (G x K x 64 bytes) while the chunk's row tiles do. Where x is past L2, a task takes
 * several groups whose weights fit there (bf16_matmul_kernel.tasks), so x streams from L3 once per task, not once
 * per group (Whisper's 1500 x 384 x 1536).
 * Register tiles: 6 rows x 4 blocks or 8 rows x 3 (tile_rows; 24 of the 32 zmm as accumulators), each over all
 * of K; the last rows of a task that do not fill one take the tile of their row count. */
#include <immintrin.h>
#include <stdint.h>

#include "avx512_matmul_epilogue.h"

/* Prefetch of the weights the thread's next task reads (the next column group), into L2 a few lines every PF_EVERY
 * inputs over the whole task, as amx_bf16_matmul.c does: a layer's weights come from memory each run (ViT-B's 340
 * MB), and at few rows a group's tile products are too short to hide its stream (CLIP's 50 rows: 117 -> 132-141
 * GFLOP/s a core with cold weights; 197 rows unchanged; benchmarks/history.md). Tasks of at most PF_MAX_ROWS rows. */
#define PF_EVERY 4
#define PF_MAX_ROWS 64 /* tasks of more rows hide the stream (197: unchanged), and warm weights ran 5-10% slower */
typedef struct {
  const char *next, *end;
  int per_step; /* lines per PF_EVERY inputs */
} prefetch;

/* one input k of a tile: NB weight vectors, R broadcasts of x, R x NB FMAs */
#define TILE_STEP(R, NB, k)                                                                                            \
  do {                                                                                                            \
    __m512 wv[NB];                                                                                                \
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_ps(wp + ((int64_t)b * K + (k)) * 16);                      \
    for (int r = 0; r < R; ++r) {                                                                                 \
      __m512 xv = _mm512_set1_ps(x[(int64_t)r * K + (k)]);                                                        \
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(xv, wv[b], acc[r][b]);                             \
    }                                                                                                             \
  } while (0)

/* R rows x NB blocks over all of K; PF: with the prefetch's lines every PF_EVERY inputs (a build of its own: the
 * check in the loop of every tile spilled accumulators and cost 3-10% where it prefetched nothing) */
#define DEFINE_TILE_PF(R, NB, NAME, PF)                                                                           \
  static void NAME(const float *x, const float *w, const mm_epilogue *ep, int64_t r0, int K, int nb, prefetch *pf) { \
    __m512 acc[R][NB];                                                                                            \
    for (int r = 0; r < R; ++r)                                                                                   \
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();                                               \
    const float *wp = w + (int64_t)nb * K * 16;                                                                   \
    const char *next = pf->next, *end = pf->end;                                                                  \
    const int per = pf->per_step;                                                                                 \
    for (int k = 0; k < K; ++k) {                                                                                 \
      if (PF && !(k & (PF_EVERY - 1)))                                                                            \
        for (int i = 0; i < per; ++i, next += 64)                                                                 \
          if (next < end) _mm_prefetch(next, _MM_HINT_T1);                                                        \
      TILE_STEP(R, NB, k);                                                                                        \
    }                                                                                                             \
    if (PF) pf->next = next < end ? next : end;                                                                   \
    for (int b = 0; b < NB; ++b) {                                                                                \
      __m512 bv = ep->bias ? _mm512_loadu_ps(ep->bias + (nb + b) * 16) : _mm512_setzero_ps();                     \
      for (int r = 0; r < R; ++r) store(ep, _mm512_add_ps(acc[r][b], bv), (r0 + r) * ep->N + (nb + b) * 16);      \
    }                                                                                                             \
  }
#define DEFINE_TILE(R, NB) DEFINE_TILE_PF(R, NB, tile##R##x##NB, 0) DEFINE_TILE_PF(R, NB, pf##R##x##NB, 1)
#define DEFINE_ROWS(R) DEFINE_TILE(R, 1) DEFINE_TILE(R, 2) DEFINE_TILE(R, 3)
DEFINE_ROWS(1)
DEFINE_ROWS(2)
DEFINE_ROWS(3)
DEFINE_ROWS(4)
DEFINE_ROWS(5)
DEFINE_ROWS(6)
DEFINE_ROWS(7)
DEFINE_ROWS(8)
DEFINE_TILE(1, 4)
DEFINE_TILE(2, 4)
DEFINE_TILE(3, 4)
DEFINE_TILE(4, 4)
DEFINE_TILE(5, 4)
DEFINE_TILE(6, 4)

typedef void (*tile_fn)(const float *, const float *, const mm_epilogue *, int64_t, int, int, prefetch *);
/* [prefetch][rows][blocks - 1]: each build's tiles (6 x 4 is the widest of 4 blocks, 8 x 3 of 3) */
#define ROW4(P, R) {P##R##x1, P##R##x2, P##R##x3, P##R##x4}
#define ROW3(P, R) {P##R##x1, P##R##x2, P##R##x3, 0}
#define BUILD(P) \
  {{0, 0, 0, 0}, ROW4(P, 1), ROW4(P, 2), ROW4(P, 3), ROW4(P, 4), ROW4(P, 5), ROW4(P, 6), ROW3(P, 7), ROW3(P, 8)}
static const tile_fn TILES[2][9][4] = {BUILD(tile), BUILD(pf)};

#define CHUNK 48 /* rows a task takes through all its column groups before the next rows (x's chunk stays in L2) */

/* the prefetch of the next task's column group (blocks [nb1, nb1 + nb1 - nb0)), spread over this task's steps */
static prefetch next_task(const float *w, int blocks, int K, int m0, int end, int nb0, int nb1, int R, int G) {
  const int nn = nb1 + (nb1 - nb0) < blocks ? nb1 + (nb1 - nb0) : blocks;
  prefetch pf = {(const char *)(w + (int64_t)nb1 * K * 16), (const char *)(w + (int64_t)nn * K * 16), 0};
  if (nn <= nb1 || end <= m0 || end - m0 > PF_MAX_ROWS) return pf; /* no next group, no rows, or enough to hide it */
  int64_t tiles = 0;
  for (int c0 = m0; c0 < end; c0 += CHUNK) tiles += ((end - c0 < CHUNK ? end - c0 : CHUNK) + R - 1) / R;
  const int64_t steps = tiles * ((nb1 - nb0 + G - 1) / G) * ((K + PF_EVERY - 1) / PF_EVERY);
  pf.per_step = (int)(((int64_t)(nn - nb1) * K + steps - 1) / steps); /* a line per input of the next group */
  return pf;
}

/* x16 and out16 are bf16_matmul.c's bf16 input and output: never given to this kernel (NULL) */
int kiln_f32_matmul(const float *x, const void *x16, const float *w, const float *bias, const float *res, float *out,
                    uint16_t *out16, int flags, int tile_rows, int M, int N, int K, int m0, int rows, int nb0,
                    int nb1) {
  (void)x16;
  const mm_epilogue ep = {bias, res, out, out16, flags, N};
  const int end = m0 + rows < M ? m0 + rows : M;
  const int R = tile_rows == 8 ? 8 : 6, G = R == 8 ? 3 : 4; /* G: blocks of 16 columns a tile holds */
  prefetch pf = next_task(w, N / 16, K, m0, end, nb0, nb1, R, G);
  for (int c0 = m0; c0 < end; c0 += CHUNK) {
    const int c1 = end - c0 < CHUNK ? end : c0 + CHUNK;
    for (int nb = nb0; nb < nb1; nb += G) {
      const int blocks = nb1 - nb < G ? nb1 - nb : G;
      for (int r = c0; r < c1; r += R) {
        const int n = c1 - r < R ? c1 - r : R;
        TILES[pf.per_step > 0][n][blocks - 1](x + (int64_t)r * K, w, &ep, r, K, nb, &pf);
      }
    }
  }
  return 0;
}
