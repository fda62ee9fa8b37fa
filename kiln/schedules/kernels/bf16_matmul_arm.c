/* Kiln's bf16 matmul micro-kernel for --precision bf16 on arm64 with the BF16 extension (Graviton3, Neoverse V1/N2):
 * the arm64 build of bf16_matmul.c, with the same symbol, arguments and epilogue flags, so one TIR call
 * (kiln/compiler/passes/bf16_matmul_kernel.py) serves both arches. out[M, N] = epilogue(x[M, K] x w), w in bf16
 * (packed at compile time), accumulated in float32 by bfmmla: a 2 x 4 block of x times a 4 x 2 block of w into a
 * 2 x 2 float32 tile, 16 multiply-adds per instruction where an fp32 fmla does 4. TVM 0.27 cannot emit bfmmla (its
 * LLVM code generator has no bfloat vector type).
 *
 * x16   [M, K]                bf16 rows (K even), converted by the producer's kernel, or NULL and
 * x     [M, K]                float32 rows, converted to bf16 here (an odd K)
 * w     [N/8, K4, 4, 2, 4]    bf16 bits, K4 = K/4 rounded up (zeros past K): for each 8 columns and 4 inputs,
 *                             4 column pairs x 2 columns x 4 inputs (bfmmla's right operand, one register a pair)
 * bias, res, out, out16, flags: as bf16_matmul.c. tile_rows is the x86 kernel's and is not used here.
 * A task computes rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16. It copies up to MAX_ROWS rows of x at a
 * time into pairs of rows interleaved by 4 inputs (bfmmla's left operand, zeros past K and past the last row),
 * then runs register tiles of 8 rows x 8 columns (16 accumulators, 4 weight and 1 row-pair registers) over all
 * of K, each 8-column block's weights (K x 16 bytes) staying in L1 while every row tile reads them. */
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#define MAX_ROWS 48 /* rows of x a task interleaves at once (the copy lives on the stack) */

#define KILN_STORE16(p, v) vst1_bf16((bfloat16_t *)(p), vcvt_bf16_f32(v))
#include "neon_epilogue.h"

/* one row's 4 inputs from k (fewer past K: zeros) as bf16, from bf16 or float32 rows */
static inline bfloat16x4_t quad(const uint16_t *x16, const float *x, int k, int K) {
  if (k + 4 <= K) return x16 ? vld1_bf16((const bfloat16_t *)(x16 + k)) : vcvt_bf16_f32(vld1q_f32(x + k));
  float f[4] = {0, 0, 0, 0};
  uint16_t h[4] = {0, 0, 0, 0};
  for (int i = 0; k + i < K; ++i) {
    if (x16) h[i] = x16[k + i];
    else f[i] = x[k + i];
  }
  return x16 ? vld1_bf16((const bfloat16_t *)h) : vcvt_bf16_f32(vld1q_f32(f));
}

/* rows [0, padded) of x as bfmmla's left operands: row pairs [padded/2, K4, 2, 4], zeros past rows and K */
static void interleave(const uint16_t *x16, const float *x, int K, int K4, int rows, int padded, bfloat16_t *xb) {
  for (int r = 0; r < padded; ++r) {
    bfloat16_t *dst = xb + ((int64_t)(r / 2) * K4) * 8 + (r % 2) * 4;
    if (r >= rows) {
      for (int q = 0; q < K4; ++q) memset(dst + q * 8, 0, 8);
      continue;
    }
    const uint16_t *s16 = x16 ? x16 + (int64_t)r * K : NULL;
    const float *s32 = x16 ? NULL : x + (int64_t)r * K;
    for (int q = 0; q < K4; ++q) vst1_bf16(dst + q * 8, quad(s16, s32, 4 * q, K));
  }
}

/* R rows (xb: their row pairs) x 8 columns from c0 (wb: their packed weights), stored through the epilogue */
#define DEFINE_TILE(R)                                                                                            \
  static void tile##R(const bfloat16_t *xb, const bfloat16_t *wb, const mm_epilogue *ep, int64_t r0, int K4,     \
                      int rows, int c0) {                                                                         \
    float32x4_t acc[R / 2][4];                                                                                    \
    for (int i = 0; i < R / 2; ++i)                                                                               \
      for (int p = 0; p < 4; ++p) acc[i][p] = vdupq_n_f32(0.0f);                                                  \
    for (int q = 0; q < K4; ++q) {                                                                                \
      bfloat16x8_t wv[4];                                                                                         \
      for (int p = 0; p < 4; ++p) wv[p] = vld1q_bf16(wb + ((int64_t)q * 4 + p) * 8);                              \
      for (int i = 0; i < R / 2; ++i) {                                                                           \
        bfloat16x8_t xv = vld1q_bf16(xb + ((int64_t)i * K4 + q) * 8);                                             \
        for (int p = 0; p < 4; ++p) acc[i][p] = vbfmmlaq_f32(acc[i][p], xv, wv[p]);                               \
      }                                                                                                           \
    }                                                                                                             \
    for (int h = 0; h < 2; ++h) { /* columns c0 + 4h ..: accumulators of column pairs 2h and 2h + 1 */           \
      float32x4_t bv = ep->bias ? vld1q_f32(ep->bias + c0 + 4 * h) : vdupq_n_f32(0.0f);                           \
      for (int i = 0; i < R / 2 && 2 * i < rows; ++i) {                                                           \
        float64x2_t a = vreinterpretq_f64_f32(acc[i][2 * h]), b = vreinterpretq_f64_f32(acc[i][2 * h + 1]);       \
        int64_t o = (r0 + 2 * i) * ep->N + c0 + 4 * h;                                                            \
        store(ep, vaddq_f32(vreinterpretq_f32_f64(vzip1q_f64(a, b)), bv), o);                                     \
        if (2 * i + 1 < rows) store(ep, vaddq_f32(vreinterpretq_f32_f64(vzip2q_f64(a, b)), bv), o + ep->N);       \
      }                                                                                                           \
    }                                                                                                             \
  }
DEFINE_TILE(8)
DEFINE_TILE(4)

/* one task: rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16 (two blocks of 8 in the packed weights) */
int kiln_bf16_matmul(const float *x, const int32_t *x16, const uint16_t *w, const float *bias, const float *res,
                     float *out, uint16_t *out16, int flags, int tile_rows, int M, int N, int K, int m0, int rows, int nb0,
                     int nb1) {
  (void)tile_rows;
  const mm_epilogue ep = {bias, res, out, out16, flags, N};
  const int K4 = (K + 3) / 4;
  const uint16_t *xh = (const uint16_t *)x16;
  int end = m0 + rows < M ? m0 + rows : M;
  for (int r0 = m0; r0 < end; r0 += MAX_ROWS) {
    int n = end - r0 < MAX_ROWS ? end - r0 : MAX_ROWS, padded = (n + 7) / 8 * 8;
    bfloat16_t *xb = (bfloat16_t *)__builtin_alloca(sizeof(bfloat16_t) * 4 * (size_t)padded * K4);
    interleave(xh ? xh + (int64_t)r0 * K : NULL, xh ? NULL : x + (int64_t)r0 * K, K, K4, n, padded, xb);
    for (int c = 2 * nb0; c < 2 * nb1; ++c) { /* blocks of 8 columns */
      const bfloat16_t *wb = (const bfloat16_t *)w + (int64_t)c * K4 * 32;
      for (int r = 0; r < n; r += 8) {
        const bfloat16_t *xr = xb + (int64_t)(r / 2) * K4 * 8;
        if (n - r > 4) tile8(xr, wb, &ep, r0 + r, K4, n - r, c * 8);
        else tile4(xr, wb, &ep, r0 + r, K4, n - r, c * 8);
      }
    }
  }
  return 0;
}
