/* Kiln's bf16 convolution on AMX tiles (AMX-BF16: tdpbf16ps, 16 pixels x 16 outputs x 32 inputs per
 * instruction, fp32 accumulation): the same call as bf16_conv.c's kiln_bf16_conv2d_nchw16c (one output
 * row, output-channel blocks [ob0, ob1), the same epilogue), with weights packed for AMX.
 *
 * data  [IB, H, W, 16]     bf16 bits (one image)
 * w     [OB, KP/2, 16, 2]  bf16 bits: B tiles; input k = ((kh * IB + ib) * KW + kw) * 16 + c, zero from K up
 *                          (K = KH * KW * IB * 16, KP = K rounded up to 32)
 * out   [OB, OH, OW, 16]   fp32 (EP_F32) and/or out16 in bf16 bits (EP_BF16)
 *
 * A tile's A operand is 16 rows of 32 contiguous bf16, and NCHW16c data has 16 per pixel: the pixels'
 * receptive fields are first gathered into [pixels, KP] (zeros for padding) in a per-thread buffer (gather: a
 * row's KW taps of one block are one contiguous run; the RGB stem's, 4 taps of its 16 blocked channels, gathered
 * twice as fast as tap by tap). Then for each block of up to 2 x 2 accumulator tiles
 * (pixel tiles x channel blocks; with their A and B tiles, the 8 tile registers) the kernel accumulates
 * over all of K and stores each tile once to a 1 KiB fp32 buffer, from which the epilogue writes the
 * output ([OB, OH, OW, 16]: a pixel range is contiguous per block). Tiles hold `rows` pixels (at most 16,
 * chosen by the caller to pad the map least: bf16_conv_kernel.amx_pixel_rows); the last may be partial.
 * The process must hold the AMX tile state (arch_prctl; kiln.runtime.hostinfo.enable_amx). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "bf16_epilogue.h"

/* one stored 16 x 16 fp32 tile of pixels [p, p + n) and channel block ob -> the output, with the epilogue */
static void store_tile(const float *acc, const epilogue *ep, int64_t plane, int ob, int64_t p, int n) {
  const int64_t o = ((int64_t)ob * plane + p) * 16;
  const int flags = ep->flags;
  const __m512 bias = flags & EP_BIAS ? _mm512_loadu_ps(ep->bias + (int64_t)ob * 16) : _mm512_setzero_ps();
  for (int t = 0; t < n; ++t) epilogue_store(ep, _mm512_add_ps(_mm512_loadu_ps(acc + t * 16), bias), o + t * 16);
}

/* BM pixel tiles x BN channel blocks: C tiles 0..3, A tiles 4..5, B tiles 6..7 (tile numbers are immediates) */
#define DEFINE_BLOCK(BM, BN)                                                                                           \
  static void block##BM##BN(const uint16_t *a, const uint16_t *w, const epilogue *ep, int64_t kp, int rows,           \
                            int64_t plane, int ob, int64_t p0, int np, int m0) {                                       \
    float acc[16 * 16] __attribute__((aligned(64)));                                                                   \
    _tile_zero(0);                                                                                                     \
    if (BN > 1) _tile_zero(1);                                                                                         \
    if (BM > 1) _tile_zero(2);                                                                                         \
    if (BM > 1 && BN > 1) _tile_zero(3);                                                                               \
    const uint16_t *a0 = a + (int64_t)m0 * rows * kp, *a1 = a0 + (int64_t)rows * kp;                                   \
    const uint16_t *w0 = w + (int64_t)ob * kp * 16, *w1 = w0 + kp * 16;                                                \
    for (int64_t k = 0; k < kp; k += 32) {                                                                             \
      _tile_loadd(4, a0 + k, kp * 2);                                                                                  \
      _tile_loadd(6, w0 + k * 16, 64);                                                                                 \
      _tile_dpbf16ps(0, 4, 6);                                                                                         \
      if (BN > 1) {                                                                                                    \
        _tile_loadd(7, w1 + k * 16, 64);                                                                               \
        _tile_dpbf16ps(1, 4, 7);                                                                                       \
      }                                                                                                                \
      if (BM > 1) {                                                                                                    \
        _tile_loadd(5, a1 + k, kp * 2);                                                                                \
        _tile_dpbf16ps(2, 5, 6);                                                                                       \
        if (BN > 1) _tile_dpbf16ps(3, 5, 7);                                                                           \
      }                                                                                                                \
    }                                                                                                                  \
    for (int i = 0; i < BM; ++i) {                                                                                     \
      int q0 = (m0 + i) * rows, n = np - q0 < rows ? np - q0 : rows;                                                   \
      for (int j = 0; j < BN; ++j) {                                                                                   \
        if (i == 0 && j == 0) _tile_stored(0, acc, 64);                                                                \
        if (i == 0 && j == 1) _tile_stored(1, acc, 64);                                                                \
        if (i == 1 && j == 0) _tile_stored(2, acc, 64);                                                                \
        if (i == 1 && j == 1) _tile_stored(3, acc, 64);                                                                \
        if (n > 0) store_tile(acc, ep, plane, ob + j, p0 + q0, n);                                                     \
      }                                                                                                                \
    }                                                                                                                  \
  }
DEFINE_BLOCK(1, 1)
DEFINE_BLOCK(1, 2)
DEFINE_BLOCK(2, 1)
DEFINE_BLOCK(2, 2)

/* one run of n bf16 (a multiple of 16) from src to dst */
static inline void copy_run(uint16_t *dst, const uint16_t *src, int n) {
  int e = 0;
  for (; e + 32 <= n; e += 32) _mm512_storeu_si512(dst + e, _mm512_loadu_si512(src + e));
  if (e < n) _mm256_storeu_si256((__m256i *)(dst + e), _mm256_loadu_si256((const __m256i *)(src + e)));
}

/* The receptive fields of pixels [p0, p0 + n) into rows of kp bf16 (rows n..n_rows zero), in (kh, ib, kw, c)
 * order: a pixel's KW taps of one input row and block are KW x 16 contiguous bf16 in NCHW16c, one run to copy
 * where the pixel's field is inside the image; at its edges, tap by tap with zeros for the padding. */
static void gather(const uint16_t *data, uint16_t *a, int64_t kp, int IB, int H, int W, int OW, int KH, int KW, int SH,
                   int SW, int PT, int PL, int p0, int n, int n_rows) {
  const int run = KW * 16;
  const int64_t k = (int64_t)KH * IB * run, plane = (int64_t)H * W * 16;
  int oh = p0 / OW, ow = p0 % OW;
  for (int q = 0; q < n_rows; ++q) {
    uint16_t *dst = a + (int64_t)q * kp;
    if (q >= n) {
      memset(dst, 0, (size_t)kp * 2);
      continue;
    }
    const int ih0 = oh * SH - PT, iw0 = ow * SW - PL;
    if (ih0 >= 0 && ih0 + KH <= H && iw0 >= 0 && iw0 + KW <= W) {
      const uint16_t *src = data + ((int64_t)ih0 * W + iw0) * 16;
      for (int kh = 0; kh < KH; ++kh, src += (int64_t)W * 16)
        for (int ib = 0; ib < IB; ++ib, dst += run) copy_run(dst, src + ib * plane, run);
    } else {
      for (int kh = 0; kh < KH; ++kh) {
        const int ih = ih0 + kh;
        for (int ib = 0; ib < IB; ++ib)
          for (int kw = 0; kw < KW; ++kw, dst += 16) {
            const int iw = iw0 + kw;
            if (ih >= 0 && ih < H && iw >= 0 && iw < W)
              _mm256_storeu_si256((__m256i *)dst,
                                  _mm256_loadu_si256((const __m256i *)(data + ib * plane + ((int64_t)ih * W + iw) * 16)));
            else
              _mm256_storeu_si256((__m256i *)dst, _mm256_setzero_si256());
          }
      }
    }
    memset(a + (int64_t)q * kp + k, 0, (size_t)(kp - k) * 2);
    if (++ow == OW) ow = 0, ++oh;
  }
}

int kiln_amx_bf16_conv2d_nchw16c(const uint16_t *data, const uint16_t *w, const float *bias, const float *res,
                                 float *out, uint16_t *out16, int flags, float lo, float hi, int IB, int H, int W,
                                 int OH, int OW, int KH, int KW, int SH, int SW, int PT, int PL, int ob0, int ob1,
                                 int p0, int np, int rows) {
  const epilogue ep = {bias, res, out, out16, flags, lo, hi};
  const int64_t k = (int64_t)KH * KW * IB * 16, kp = (k + 31) / 32 * 32, plane = (int64_t)OH * OW;
  if (p0 + np > plane) np = (int)(plane - p0);
  if (np <= 0) return 0;
  if (rows > np) rows = np;
  const int tiles = (np + rows - 1) / rows;
  uint16_t *a = scratch((size_t)tiles * rows * kp);
  if (!a) return -1;
  gather(data, a, kp, IB, H, W, OW, KH, KW, SH, SW, PT, PL, p0, np, tiles * rows);
  load_tiles(rows);
  int m = 0;
  for (; m + 2 <= tiles; m += 2) {
    int ob = ob0;
    for (; ob + 2 <= ob1; ob += 2) block22(a, w, &ep, kp, rows, plane, ob, p0, np, m);
    if (ob < ob1) block21(a, w, &ep, kp, rows, plane, ob, p0, np, m);
  }
  if (m < tiles) {
    int ob = ob0;
    for (; ob + 2 <= ob1; ob += 2) block12(a, w, &ep, kp, rows, plane, ob, p0, np, m);
    if (ob < ob1) block11(a, w, &ep, kp, rows, plane, ob, p0, np, m);
  }
  _tile_release();
  return 0;
}
