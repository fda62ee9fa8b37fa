/* Kiln's bf16 convolution micro-kernel: NCHW16c bf16 activations x packed bf16 weights -> fp32,
 * one vdpbf16ps (AVX512-BF16: 16 outputs x 2 inputs) per step, 8 output pixels x 16 output
 * channels accumulating in registers over every input channel and tap. TVM 0.27 cannot emit
 * vdpbf16ps itself (its LLVM code generator has no bfloat vector type), so this file is compiled
 * into each artifact's library and called from TIR (kiln/compiler/legalize.py).
 *
 * data  [IB, H, W, 16]              bf16 bits (one image)
 * w     [OB, IB, KH, KW, 8, 16, 2]  bf16 bits: input-channel pairs x 16 outputs x 2
 * out   [OB, OH, OW, 16]            fp32; output-channel blocks [ob0, ob1) are written
 * Padding is implicit (taps outside the image are skipped). */
#include <immintrin.h>
#include <stdint.h>

#define TILE 8

/* TILE output pixels x NB output-channel blocks: each broadcast input pair feeds NB vdpbf16ps */
#define DEFINE_TILE(NB)                                                                                                        \
  static inline void tile##NB(const uint16_t *data, const uint16_t *w, float *out, int IB, int H, int W, int OH, int OW, int KH,  \
                              int KW, int SH, int SW, int PT, int PL, int ob, int oh, int ow0, int T) {                         \
    __m512 acc[NB][TILE];                                                                                                      \
    for (int b = 0; b < NB; ++b)                                                                                               \
      for (int t = 0; t < TILE; ++t) acc[b][t] = _mm512_setzero_ps();                                                          \
    const int64_t wstride = (int64_t)IB * KH * KW * 256; /* one output-channel block of weights */                             \
    for (int ib = 0; ib < IB; ++ib) {                                                                                          \
      for (int kh = 0; kh < KH; ++kh) {                                                                                        \
        int ih = oh * SH - PT + kh;                                                                                            \
        if (ih < 0 || ih >= H) continue;                                                                                       \
        const uint16_t *row = data + ((int64_t)ib * H + ih) * W * 16;                                                          \
        for (int kw = 0; kw < KW; ++kw) {                                                                                      \
          int t0 = 0, t1 = T; /* output pixels whose input column is inside the image */                                       \
          while (t0 < T && (ow0 + t0) * SW - PL + kw < 0) ++t0;                                                                \
          while (t1 > t0 && (ow0 + t1 - 1) * SW - PL + kw >= W) --t1;                                                          \
          const uint16_t *wp = w + ((((int64_t)ob * IB + ib) * KH + kh) * KW + kw) * 256;                                      \
          for (int p = 0; p < 8; ++p) {                                                                                        \
            __m512bh wv[NB];                                                                                                   \
            for (int b = 0; b < NB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512((const void *)(wp + b * wstride + p * 32));      \
            for (int t = t0; t < t1; ++t) {                                                                                    \
              int iw = (ow0 + t) * SW - PL + kw;                                                                               \
              __m512bh x = (__m512bh)_mm512_set1_epi32(*(const int32_t *)(row + (int64_t)iw * 16 + p * 2));                    \
              for (int b = 0; b < NB; ++b) acc[b][t] = _mm512_dpbf16_ps(acc[b][t], x, wv[b]);                                  \
            }                                                                                                                  \
          }                                                                                                                    \
        }                                                                                                                      \
      }                                                                                                                        \
    }                                                                                                                          \
    for (int b = 0; b < NB; ++b) {                                                                                             \
      float *o = out + (((int64_t)(ob + b) * OH + oh) * OW + ow0) * 16;                                                        \
      for (int t = 0; t < T; ++t) _mm512_storeu_ps(o + t * 16, acc[b][t]);                                                     \
    }                                                                                                                          \
  }

DEFINE_TILE(1)
DEFINE_TILE(2)

int kiln_bf16_conv2d_nchw16c(const uint16_t *data, const uint16_t *w, float *out, int IB, int H, int W, int OH, int OW, int KH, int KW,
                             int SH, int SW, int PT, int PL, int ob0, int ob1, int oh) {
  for (int ob = ob0; ob < ob1; ob += 2)
    for (int ow0 = 0; ow0 < OW; ow0 += TILE) {
      int T = OW - ow0 < TILE ? OW - ow0 : TILE;
      if (ob + 1 < ob1)
        tile2(data, w, out, IB, H, W, OH, OW, KH, KW, SH, SW, PT, PL, ob, oh, ow0, T);
      else
        tile1(data, w, out, IB, H, W, OH, OW, KH, KW, SH, SW, PT, PL, ob, oh, ow0, T);
    }
  return 0;
}
