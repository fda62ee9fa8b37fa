/* Kiln's bf16 convolution micro-kernel: NCHW16c bf16 activations x packed bf16 weights -> fp32,
 * one vdpbf16ps (AVX512-BF16: 16 outputs x 2 inputs) per step, T <= 8 output pixels x NB <= 2
 * blocks of 16 output channels accumulating in registers over every input channel and tap. TVM 0.27
 * cannot emit vdpbf16ps itself (its LLVM code generator has no bfloat vector type), so this file is
 * compiled into each artifact's library and called from TIR (kiln/compiler/passes/bf16_conv_kernel.py).
 *
 * data  [IB, H, W, 16]              bf16 bits (one image)
 * w     [OB, IB, KH, KW, 8, 16, 2]  bf16 bits: input-channel pairs x 16 outputs x 2
 * out   [OB, OH, OW, 16]            fp32 (EP_F32) and/or out16, the same in bf16 bits (EP_BF16);
 *                                   output-channel blocks [ob0, ob1) are written
 * Padding is implicit: rows outside the image are skipped, columns outside it read zeros.
 * Epilogue, applied in registers as each tile is stored (kiln/compiler/passes/fuse_bf16_epilogue.py):
 * + bias [OB, 16] (EP_BIAS), + res [OB, OH, OW, 16] fp32 (EP_RES; bf16 with EP_RES16), clamp to [lo, hi]
 * (EP_CLAMP: ReLU, ReLU6), in this order.
 *
 * One function per (NB, T), so every accumulator index is a constant and the NB x T accumulators stay
 * in registers (with a run-time pixel count they lived on the stack: a load and a store around every
 * vdpbf16ps; ResNet-50's bf16 convs ran at about half the bf16 peak). */
#include <immintrin.h>
#include <stdint.h>

#define TILE 8

#include "bf16_epilogue.h"

static const uint16_t ZEROS[16] __attribute__((aligned(64))) = {0};

#define DEFINE_TILE(NB, T)                                                                                                     \
  static void tile##NB##_##T(const uint16_t *data, const uint16_t *w, const epilogue *ep, int IB, int H, int W, int OH, int OW, int KH,  \
                             int KW, int SH, int SW, int PT, int PL, int ob, int oh, int ow0) {                                  \
    __m512 acc[NB][T];                                                                                                         \
    for (int b = 0; b < NB; ++b)                                                                                               \
      for (int t = 0; t < T; ++t) acc[b][t] = _mm512_setzero_ps();                                                             \
    const int64_t wstride = (int64_t)IB * KH * KW * 256; /* one output-channel block of weights */                             \
    for (int ib = 0; ib < IB; ++ib) {                                                                                          \
      for (int kh = 0; kh < KH; ++kh) {                                                                                        \
        int ih = oh * SH - PT + kh;                                                                                            \
        if (ih < 0 || ih >= H) continue;                                                                                       \
        const uint16_t *row = data + ((int64_t)ib * H + ih) * W * 16;                                                          \
        for (int kw = 0; kw < KW; ++kw) {                                                                                      \
          const uint16_t *x[T]; /* each pixel's input column, or zeros outside the image */                                  \
          for (int t = 0; t < T; ++t) {                                                                                        \
            int iw = (ow0 + t) * SW - PL + kw;                                                                                 \
            x[t] = iw >= 0 && iw < W ? row + (int64_t)iw * 16 : ZEROS;                                                        \
          }                                                                                                                    \
          const uint16_t *wp = w + ((((int64_t)ob * IB + ib) * KH + kh) * KW + kw) * 256;                                      \
          for (int p = 0; p < 8; ++p) {                                                                                        \
            __m512bh wv[NB];                                                                                                   \
            for (int b = 0; b < NB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512((const void *)(wp + b * wstride + p * 32));      \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; ++t) {                                                              \
              __m512bh xv = (__m512bh)_mm512_set1_epi32(*(const int32_t *)(x[t] + p * 2));                                     \
              _Pragma("GCC unroll 2") for (int b = 0; b < NB; ++b) acc[b][t] = _mm512_dpbf16_ps(acc[b][t], xv, wv[b]);          \
            }                                                                                                                  \
          }                                                                                                                    \
        }                                                                                                                      \
      }                                                                                                                        \
    }                                                                                                                          \
    const int flags = ep->flags;                                                                                               \
    for (int b = 0; b < NB; ++b) {                                                                                             \
      const int64_t o = (((int64_t)(ob + b) * OH + oh) * OW + ow0) * 16;                                                       \
      const __m512 bias = flags & EP_BIAS ? _mm512_loadu_ps(ep->bias + (int64_t)(ob + b) * 16) : _mm512_setzero_ps();          \
      for (int t = 0; t < T; ++t) epilogue_store(ep, _mm512_add_ps(acc[b][t], bias), o + t * 16);                             \
    }                                                                                                                          \
  }

#define DEFINE_TILES(NB) \
  DEFINE_TILE(NB, 1) DEFINE_TILE(NB, 2) DEFINE_TILE(NB, 3) DEFINE_TILE(NB, 4) DEFINE_TILE(NB, 5) DEFINE_TILE(NB, 6) DEFINE_TILE(NB, 7) DEFINE_TILE(NB, 8)
DEFINE_TILES(1)
DEFINE_TILES(2)

typedef void (*tile_fn)(const uint16_t *, const uint16_t *, const epilogue *, int, int, int, int, int, int, int, int, int, int, int, int, int, int);
static const tile_fn TILES[2][TILE] = {{tile1_1, tile1_2, tile1_3, tile1_4, tile1_5, tile1_6, tile1_7, tile1_8},
                                       {tile2_1, tile2_2, tile2_3, tile2_4, tile2_5, tile2_6, tile2_7, tile2_8}};

int kiln_bf16_conv2d_nchw16c(const uint16_t *data, const uint16_t *w, const float *bias, const float *res, float *out, uint16_t *out16,
                             int flags, float lo, float hi, int IB, int H, int W, int OH, int OW, int KH, int KW, int SH, int SW, int PT, int PL, int ob0,
                             int ob1, int oh) {
  const epilogue ep = {bias, res, out, out16, flags, lo, hi};
  for (int ob = ob0; ob < ob1; ob += 2)
    for (int ow0 = 0; ow0 < OW; ow0 += TILE) {
      int T = OW - ow0 < TILE ? OW - ow0 : TILE;
      TILES[ob + 1 < ob1][T - 1](data, w, &ep, IB, H, W, OH, OW, KH, KW, SH, SW, PT, PL, ob, oh, ow0);
    }
  return 0;
}
