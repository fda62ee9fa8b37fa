/* Kiln's float32 convolution on AVX-512 FMAs: NCHW16c activations x OIHW16i16o weights (the blocked layout as is,
 * no packing), one output row per call, output-channel blocks [ob0, ob1) two at a time. A tile of T <= 14 pixels
 * of the row x NB <= 2 blocks of 16 output channels accumulates in 28 zmm registers over every tap and input
 * channel: per input channel 2 weight vectors, T broadcasts and 2T vfmadd231ps (FMA-bound: 16 loads for 28 FMAs),
 * and a prefetch of the weights PREFETCH input blocks ahead.
 * TVM 0.27's default x86 conv schedule ran ResNet-50's convs at 25-47% of this CPU's FMA peak on Sapphire Rapids
 * (benchmarks/history.md); this kernel, in a C harness, at 58-80%.
 *
 * data  [IB, H, W, 16]             fp32 (one image)
 * w     [OB, IB, KH, KW, 16, 16]   fp32: input channel x 16 outputs
 * out   [OB, OH, OW, 16]           fp32 (EP_F32) and/or out16 in bf16 bits (EP_BF16)
 * The same call and epilogue as bf16_conv.c (bf16_epilogue.h: + bias, + residual, clamp; kiln/compiler/passes/
 * f32_conv_kernel.py builds the caller), with the dilation (DH, DW) last. Rows outside the image are skipped;
 * where the row's taps reach columns outside it (padding), the taps' input rows are first copied with zero columns
 * into a per-thread buffer ([IB][rows][columns][16]), so every tile runs the same unbranched loop with constant
 * offsets (T and the stride SW, 1 or 2, are compile-time constants of each tile function). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_epilogue.h"

#define TILE 14
/* weights are prefetched this many input blocks ahead (72 KiB for a 3x3 conv): they stream from memory once per
 * run (ResNet-50: 100 MB), and the hardware prefetcher alone left the 512-channel 3x3 conv 30% slower with cold
 * weights in the C harness (1.34-1.41 -> 1.06-1.08 ms; 4 blocks ahead: 1.13-1.25) */
#define PREFETCH 8


/* rows: input rows [IB][.][RW][16] (plane floats apart per block); tap kh (kh0..kh1) reads row ih0 + kh * RS;
 * pixel t of the tile reads column c0 + t * SW + kw * DW (always inside the row); outputs at o, blocks ostride
 * apart */
#define DEFINE_TILE(NB, T, SW)                                                                                  \
  static void tile##NB##_##T##_##SW(const float *rows, int64_t plane, int RW, int ih0, int RS, int kh0, int kh1,  \
                                    int c0, int DW, const float *w, const epilogue *ep, int IB, int KH, int KW,  \
                                    int ob, int64_t o, int64_t ostride) {                                       \
    __m512 acc[NB][T];                                                                                          \
    for (int b = 0; b < NB; ++b)                                                                                \
      for (int t = 0; t < T; ++t) acc[b][t] = _mm512_setzero_ps();                                              \
    const int64_t wstride = (int64_t)IB * KH * KW * 256, wib = (int64_t)KH * KW * 256;                          \
    for (int kh = kh0; kh < kh1; ++kh)                                                                          \
      for (int kw = 0; kw < KW; ++kw) {                                                                         \
        const float *wk = w + (((int64_t)ob * IB * KH + kh) * KW + kw) * 256;                                   \
        const float *xk = rows + ((int64_t)(ih0 + kh * RS) * RW + c0 + kw * DW) * 16;                           \
        for (int ib = 0; ib < IB; ++ib, wk += wib, xk += plane) {                                               \
          _Pragma("GCC unroll 2") for (int c = 0; c < 16; ++c) {                                                \
            __m512 wv[NB];                                                                                      \
            for (int b = 0; b < NB; ++b) wv[b] = _mm512_loadu_ps(wk + b * wstride + c * 16);                   \
            for (int b = 0; b < NB; ++b)                                                                        \
              _mm_prefetch((const char *)(wk + PREFETCH * wib + b * wstride + c * 16), _MM_HINT_T0);            \
            _Pragma("GCC unroll 14") for (int t = 0; t < T; ++t) {                                              \
              __m512 xv = _mm512_set1_ps(xk[t * SW * 16 + c]);                                                  \
              _Pragma("GCC unroll 2") for (int b = 0; b < NB; ++b) acc[b][t] = _mm512_fmadd_ps(xv, wv[b], acc[b][t]); \
            }                                                                                                   \
          }                                                                                                     \
        }                                                                                                       \
      }                                                                                                         \
    for (int b = 0; b < NB; ++b) {                                                                              \
      const __m512 bias =                                                                                       \
          ep->flags & EP_BIAS ? _mm512_loadu_ps(ep->bias + (int64_t)(ob + b) * 16) : _mm512_setzero_ps();       \
      for (int t = 0; t < T; ++t) epilogue_store(ep, _mm512_add_ps(acc[b][t], bias), o + b * ostride + t * 16); \
    }                                                                                                           \
  }
#define TILES_SW(NB, SW) DEFINE_TILE(NB, 1, SW) DEFINE_TILE(NB, 2, SW) DEFINE_TILE(NB, 3, SW) DEFINE_TILE(NB, 4, SW) \
  DEFINE_TILE(NB, 5, SW) DEFINE_TILE(NB, 6, SW) DEFINE_TILE(NB, 7, SW) DEFINE_TILE(NB, 8, SW) DEFINE_TILE(NB, 9, SW) \
  DEFINE_TILE(NB, 10, SW) DEFINE_TILE(NB, 11, SW) DEFINE_TILE(NB, 12, SW) DEFINE_TILE(NB, 13, SW)             \
  DEFINE_TILE(NB, 14, SW)
TILES_SW(1, 1) TILES_SW(2, 1) TILES_SW(1, 2) TILES_SW(2, 2)
typedef void (*tile_fn)(const float *, int64_t, int, int, int, int, int, int, int, const float *, const epilogue *, int,
                        int, int, int, int64_t, int64_t);
#define ROW(NB, SW) {tile##NB##_1_##SW, tile##NB##_2_##SW, tile##NB##_3_##SW, tile##NB##_4_##SW, tile##NB##_5_##SW, \
  tile##NB##_6_##SW, tile##NB##_7_##SW, tile##NB##_8_##SW, tile##NB##_9_##SW, tile##NB##_10_##SW, tile##NB##_11_##SW, \
  tile##NB##_12_##SW, tile##NB##_13_##SW, tile##NB##_14_##SW}
static const tile_fn TILES[2][2][TILE] = {{ROW(1, 1), ROW(2, 1)}, {ROW(1, 2), ROW(2, 2)}};

static __thread float *pad_buf;
static __thread size_t pad_cap;

int kiln_f32_conv2d_nchw16c(const float *data, const float *w, const float *bias, const float *res, float *out,
                            uint16_t *out16, int flags, float lo, float hi, int IB, int H, int W, int OH, int OW,
                            int KH, int KW, int SH, int SW, int PT, int PL, int ob0, int ob1, int oh, int DH, int DW) {
  const epilogue ep = {bias, res, out, out16, flags, lo, hi};
  if (SW < 1 || SW > 2) return -1; /* f32_conv_kernel.applies: strides 1 and 2 */
  /* the taps inside the image: rows ih0 + kh * DH in [0, H) */
  const int ih0 = oh * SH - PT, kh0 = ih0 < 0 ? (-ih0 + DH - 1) / DH : 0;
  const int kh1 = H - ih0 <= 0 ? 0 : ((H - ih0 + DH - 1) / DH < KH ? (H - ih0 + DH - 1) / DH : KH);
  const int need = (OW - 1) * SW + (KW - 1) * DW + 1; /* columns the row's taps span, from -PL */
  const float *rows = data;
  int64_t plane = (int64_t)H * W * 16;
  int RW = W, r0 = ih0, RS = DH, c0 = -PL;
  if (PL > 0 || need - PL > W) { /* columns outside the image: the taps' rows with zero columns, in a buffer */
    const int n = kh1 > kh0 ? kh1 - kh0 : 0;
    const size_t size = (size_t)IB * n * need * 16;
    if (size > pad_cap) {
      free(pad_buf);
      pad_buf = aligned_alloc(64, (size * 4 + 63) / 64 * 64);
      pad_cap = pad_buf ? size : 0;
      if (!pad_buf) return -1;
    }
    for (int ib = 0; ib < IB; ++ib)
      for (int r = 0; r < n; ++r) {
        float *dst = pad_buf + ((int64_t)ib * n + r) * need * 16;
        const float *src = data + (((int64_t)ib * H + ih0 + (kh0 + r) * DH) * W) * 16;
        for (int c = 0; c < need; ++c) {
          const int iw = c - PL;
          _mm512_storeu_ps(dst + c * 16, iw >= 0 && iw < W ? _mm512_loadu_ps(src + iw * 16) : _mm512_setzero_ps());
        }
      }
    rows = pad_buf, plane = (int64_t)n * need * 16, RW = need, r0 = -kh0, RS = 1, c0 = 0;
  }
  const int tiles = (OW + TILE - 1) / TILE, per = (OW + tiles - 1) / tiles;
  const int64_t ostride = (int64_t)OH * OW * 16;
  for (int ob = ob0; ob < ob1; ob += 2)
    for (int ow0 = 0; ow0 < OW; ow0 += per) {
      int T = OW - ow0 < per ? OW - ow0 : per;
      TILES[SW - 1][ob + 1 < ob1][T - 1](rows, plane, RW, r0, RS, kh0, kh1, c0 + ow0 * SW, DW, w, &ep, IB, KH, KW, ob,
                                         ((int64_t)ob * OH + oh) * OW * 16 + ow0 * 16, ostride);
    }
  return 0;
}
