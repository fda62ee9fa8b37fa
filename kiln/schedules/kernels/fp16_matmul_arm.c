/* Kiln's fp16 matmul micro-kernel for --precision fp16 on arm64 with fp16 arithmetic (Armv8.2 fullfp16: Graviton2/3,
 * Cortex-A76 and later): out[M, N] = epilogue(x[M, K] x w), w in fp16 (packed at compile time), multiply-adds by
 * fmla .8h (8 fp16 lanes: twice the multiply-adds of an fp32 fmla) into fp16 partial sums over FLUSH inputs, which
 * are then widened and added to float32 accumulators: the sum over K is float32, each partial sum fp16. TVM computes
 * fp16 matmuls that accumulate in float32 by widening every operand (fcvtl) and fp32 fmla .4s. The arguments are
 * bf16_matmul.c's (one TIR call, kiln/compiler/passes/fp16_matmul_kernel.py), with fp16 for bf16:
 *
 * x16   [M, K]              fp16 rows, converted by the producer's kernel (its epilogue), or NULL and
 * x     [M, K]              float32 rows, converted to fp16 here
 * w     [N/16, 2, K, 8]     fp16: for each 8 columns, every input's 8 weights
 * bias, res, out, out16 (fp16), flags: as bf16_matmul.c. tile_rows is the x86 kernel's and is not used here.
 * A task computes rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16; its register tiles are 4 rows x 16
 * columns (8 fp16 partial sums, 16 float32 accumulators), each over all of K. */
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_ROWS 48 /* rows of float32 x a task converts at once (its fp16 copy lives on the stack) */
#define FLUSH 16    /* inputs summed in fp16 before the float32 add: 11-bit partial sums over 16 products */
#define KILN_STORE16(p, v) vst1_f16((float16_t *)(p), vcvt_f16_f32(v))
#include "neon_epilogue.h"

/* rows of float32 x as fp16 */
static void to_fp16(const float *x, int K, int rows, float16_t *xh) {
  for (int64_t i = 0, n = (int64_t)rows * K; i < n; ++i) xh[i] = (float16_t)x[i];
}

/* input j of the 8 in xv[r] (its lane) times the 8 weights of blocks a and b, into the partial sums */
#define LANE(j)                                                                                                  \
  do {                                                                                                           \
    float16x8_t a = vld1q_f16(w0 + (int64_t)(k + j) * 8), b = vld1q_f16(w1 + (int64_t)(k + j) * 8);             \
    for (int r = 0; r < 4; ++r) {                                                                                \
      h[r][0] = vfmaq_laneq_f16(h[r][0], a, xv[r], j);                                                           \
      h[r][1] = vfmaq_laneq_f16(h[r][1], b, xv[r], j);                                                           \
    }                                                                                                            \
  } while (0)

/* the fp16 partial sums of inputs [k0, k1) of 4 rows x 16 columns */
static inline void partial(const float16_t *const xr[4], const float16_t *w0, const float16_t *w1, int k0, int k1,
                           float16x8_t h[4][2]) {
  int k = k0;
  for (; k + 8 <= k1; k += 8) {
    float16x8_t xv[4];
    for (int r = 0; r < 4; ++r) xv[r] = vld1q_f16(xr[r] + k);
    LANE(0);
    LANE(1);
    LANE(2);
    LANE(3);
    LANE(4);
    LANE(5);
    LANE(6);
    LANE(7);
  }
  for (; k < k1; ++k) { /* K not a multiple of 8 */
    float16x8_t a = vld1q_f16(w0 + (int64_t)k * 8), b = vld1q_f16(w1 + (int64_t)k * 8);
    for (int r = 0; r < 4; ++r) {
      h[r][0] = vfmaq_n_f16(h[r][0], a, xr[r][k]);
      h[r][1] = vfmaq_n_f16(h[r][1], b, xr[r][k]);
    }
  }
}

/* 4 rows (x: the first, ldx apart; `rows` of them real) x the 16 columns from c0 (w0, w1: their two blocks) */
static void tile4(const float16_t *x, const float16_t *w0, const float16_t *w1, const mm_epilogue *ep, int64_t r0,
                  int K, int rows, int c0) {
  const float16_t *xr[4];
  for (int r = 0; r < 4; ++r) xr[r] = x + (int64_t)(r < rows ? r : rows - 1) * K;
  float32x4_t acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = vdupq_n_f32(0.0f);
  for (int k0 = 0; k0 < K; k0 += FLUSH) {
    float16x8_t h[4][2];
    for (int r = 0; r < 4; ++r) h[r][0] = h[r][1] = vdupq_n_f16(0);
    partial(xr, w0, w1, k0, k0 + FLUSH < K ? k0 + FLUSH : K, h);
    for (int r = 0; r < 4; ++r)
      for (int b = 0; b < 2; ++b) {
        acc[r][2 * b] = vaddq_f32(acc[r][2 * b], vcvt_f32_f16(vget_low_f16(h[r][b])));
        acc[r][2 * b + 1] = vaddq_f32(acc[r][2 * b + 1], vcvt_high_f32_f16(h[r][b]));
      }
  }
  for (int c = 0; c < 4; ++c) {
    float32x4_t bv = ep->bias ? vld1q_f32(ep->bias + c0 + 4 * c) : vdupq_n_f32(0.0f);
    for (int r = 0; r < rows && r < 4; ++r) store(ep, vaddq_f32(acc[r][c], bv), (r0 + r) * ep->N + c0 + 4 * c);
  }
}

/* one task: rows [m0, m0 + rows) x column blocks [nb0, nb1) of 16 */
int kiln_fp16_matmul(const float *x, const float16_t *x16, const float16_t *w, const float *bias, const float *res,
                     float *out, uint16_t *out16, int flags, int tile_rows, int M, int N, int K, int m0, int rows, int nb0,
                     int nb1) {
  (void)tile_rows;
  const mm_epilogue ep = {bias, res, out, out16, flags, N};
  int end = m0 + rows < M ? m0 + rows : M;
  for (int r0 = m0; r0 < end; r0 += MAX_ROWS) {
    int n = end - r0 < MAX_ROWS ? end - r0 : MAX_ROWS;
    const float16_t *xb = x16 + (int64_t)r0 * K;
    if (!x16) {
      float16_t *buf = (float16_t *)__builtin_alloca(sizeof(float16_t) * (size_t)n * K);
      to_fp16(x + (int64_t)r0 * K, K, n, buf);
      xb = buf;
    }
    for (int nb = nb0; nb < nb1; ++nb) {
      const float16_t *w0 = w + (int64_t)nb * 2 * K * 8, *w1 = w0 + (int64_t)K * 8;
      for (int r = 0; r < n; r += 4) tile4(xb + (int64_t)r * K, w0, w1, &ep, r0 + r, K, n - r, nb * 16);
    }
  }
  return 0;
}
