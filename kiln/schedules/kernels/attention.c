/* Kiln's fused attention kernel, float32: out = softmax(scale * Q K^T + mask) V for one (batch x head,
 * block of query rows) task, with an online (streaming) softmax over blocks of KB keys, so no row of
 * scores longer than a block is ever stored: Whisper's 1500 x 1500 scores per head (54 MB a layer) are
 * never materialized. The matmuls are register tiles of R query rows: S = Q K^T by broadcasting Q and
 * loading K^T's vectors (R x KB/VL accumulators), P V by broadcasting P and loading V's vectors
 * (R x DV/VL accumulators). Written with GCC vector extensions so one source builds for AVX-512 (VL 16)
 * and AVX2 (VL 8): KILN_VL and KILN_ATTENTION name the build (kiln/schedules/kernels/__init__.py).
 *
 * q    [BH, M, D]    float32 (rows of queries)
 * kt   [BH, NB, D, KB] float32: the keys transposed and packed in blocks of KB keys (NB = N / KB rounded up,
 *                      zeros past N; kiln_attention_key_block() gives KB): each block's D x KB floats are
 *                      contiguous, so the scores' loop reads one stream (K^T's rows N floats apart each cost
 *                      a TLB miss per step; timings in benchmarks/history.md)
 * v    [BH, N, DV]   float32, DV a multiple of VL
 * mask additive, element (bh, i, j) at mask[(bh / mh_div % mh_mod) * mask_bh + i * mask_row + j]
 *      (strides 0 where it broadcasts), or NULL
 * out  [BH, M, DV]   float32
 * Rows [row0, row0 + rows) of head bh are computed. causal: key j > query i + causal_offset is masked.
 *
 * KILN_BF16 (AVX512-BF16, --precision bf16): both matmuls on vdpbf16ps, 2 multiply-adds per lane, accumulated
 * in float32; the softmax stays float32 and P is rounded to bf16 for P V. Then q is bf16 [BH, M, D] (D even),
 * kt bf16 pairs of features [BH, NB, D/2, KB, 2] and v bf16 pairs of keys [BH, NB * KB / 2, DV, 2] (zeros past
 * N, so no block of values is partial); each pair read as one int32.
 *
 * KILN_AMX (with KILN_BF16, AMX-BF16): the same operands and packing, both matmuls on AMX tiles for 16 query rows
 * at a time: S = Q K^T with Q's rows as A tiles (32 features) and a key block's [D/2, KB, 2] as B tiles (16 feature
 * pairs x 16 keys, KB * 4 bytes apart), stored into the scores' rows; O += P V with P's bf16 rows as A tiles (32 keys)
 * and V's [KB/2, DV, 2] as B tiles (16 key pairs x 16 features), O's rows loaded into and stored from the accumulator
 * tiles; the softmax between them as for vdpbf16ps. D a multiple of 32 (fuse_attention.build_for). */
#ifdef KILN_BF16
#include <immintrin.h>
typedef int32_t elem; /* a pair of bf16 */
#define PAIR 2
#else
typedef float elem;
#define PAIR 1
#endif
#include <math.h> /* INFINITY */
#include <stdint.h>
#include <string.h>

#ifndef KILN_VL
#define KILN_VL 16
#endif
#ifndef KILN_ATTENTION
#define KILN_ATTENTION kiln_attention_f32
#endif

#define VL KILN_VL
#ifdef KILN_AMX
#define R 16 /* query rows per tile: an AMX tile's rows */
#else
#define R (VL == 16 ? 6 : 4) /* query rows per register tile */
#endif
#define SV (VL == 16 ? 4 : 2) /* vectors of keys per pass of Q K^T: its tile is R x SV (24 of 32 zmm, 8 of 16 ymm) */
#define HALVES 2             /* passes of Q K^T per block: the softmax's per-block work amortized over 2 x SV vectors */
#define KV (SV * HALVES)     /* vectors of keys per block */
#define KB (KV * VL)         /* keys per block */
#define OV SV                /* output vectors per pass of P V: R x OV accumulators */
#define MAX_DV 256           /* output features a tile keeps in L1 */

typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef float vf_unaligned __attribute__((vector_size(VL * 4), aligned(4), may_alias));

/* one vbroadcastss ((vf){0} + x is an add first, since -0.0 + 0 is not -0.0; a loop of lane stores is lane inserts) */
#if VL == 16
static inline vf splat(float x) { return (vf){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
#else
static inline vf splat(float x) { return (vf){x, x, x, x, x, x, x, x}; }
#endif
static inline vf load(const float *p) { return *(const vf_unaligned *)p; }
static inline void store(float *p, vf v) { *(vf_unaligned *)p = v; }

/* The softmax's exp in base 2: the scores are put in log2 units by the FMA that subtracts their row's running max,
 * so P = 2^t for t <= 0, max relative error about 4e-7, 2^-inf = 0, a NaN stays NaN. AVX-512: 2^n 2^f with n =
 * round(t), a degree-5 polynomial for 2^f on [-1/2, 1/2] and vscalefps for 2^n (8 instructions); a masked block's
 * scores (-inf where masked) are clamped at -150 first (2^-150 is 0). AVX2: Cephes' range reduction and degree-6
 * polynomial of e^(t ln 2), 0 below e^-87. */
#if VL == 16
#include <immintrin.h>
/* 2^f for f in [-1/2, 1/2]. The bf16 build rounds P to bf16 (relative step 2^-8) for P V: a degree-3 polynomial
 * (relative error 7.5e-5) is exact enough there; float32 takes degree 5 (about 4e-7). */
static inline vf pow2_fraction(vf fv) {
  __m512 f = (__m512)fv;
#ifdef KILN_BF16
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(5.5170249193906784e-2f), f, _mm512_set1_ps(2.4260790646076202e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93260908126831e-1f));
  return (vf)_mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999282956123352e-1f));
#else
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.3395285932347178e-3f), f, _mm512_set1_ps(9.670767933130264e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550340563058853e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022211134433746e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471824645996e-1f));
  return (vf)_mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
#endif
}
static inline vf vexp2(vf t) {
  __m512 n = _mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return (vf)_mm512_scalef_ps((__m512)pow2_fraction((vf)_mm512_sub_ps((__m512)t, n)), n);
}
static inline vf vexp2_masked(vf t) { return vexp2((vf)_mm512_max_ps((__m512)t, _mm512_set1_ps(-150.0f))); }
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
static inline float hmax(vf v) { return _mm512_reduce_max_ps((__m512)v); }
static inline float hsum(vf v) { return _mm512_reduce_add_ps((__m512)v); }
#else
static inline vf vexp(vf x) {
  vi small = x < -87.0f;
  x = (vf)((vi)x & ~small) + (vf)((vi)splat(-87.0f) & small);
  vf t = x * 1.44269504088896341f + 0.5f;
  vf fx = __builtin_convertvector(__builtin_convertvector(t, vi), vf);
  fx -= (vf)((vi)splat(1.0f) & (vi)(fx > t));
  vf r = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  vi n = __builtin_convertvector(fx, vi);
  vf scale = (vf)((n + 127) << 23);
  return (vf)((vi)(p * scale) & ~small);
}
static inline vf vexp2(vf t) { return vexp(t * 0.69314718055994531f); }
static inline vf vexp2_masked(vf t) { return vexp2(t); }
static inline vf vmax(vf a, vf b) {
  vi gt = a > b;
  return (vf)(((vi)a & gt) | ((vi)b & ~gt));
}

/* horizontal max and sum in log2(VL) shuffle steps */
static inline float hmax(vf v) {
  for (int w = VL / 2; w >= 1; w /= 2) {
    vi idx;
    for (int l = 0; l < VL; ++l) idx[l] = (l + w) % VL;
    v = vmax(v, __builtin_shuffle(v, idx));
  }
  return v[0];
}

static inline float hsum(vf v) {
  for (int w = VL / 2; w >= 1; w /= 2) {
    vi idx;
    for (int l = 0; l < VL; ++l) idx[l] = (l + w) % VL;
    v += __builtin_shuffle(v, idx);
  }
  return v[0];
}
#endif

typedef struct {
  const float *mask;
  int64_t mask_bh, mask_row;
  int mh_div, mh_mod;
  int causal, causal_offset;
} masking;

/* S[R][NV * VL] for query rows qi[R] over keys [j0, j0 + NV * VL) of kt (ldk: its row stride), NV <= SV:
 * one function per NV so the accumulators stay in registers; a partial last block computes only its vectors.
 * DP: the elems of a row of q (D, or D / 2 pairs). */
/* acc + a * b: a float32 FMA, or on bf16 pairs vdpbf16ps (2 products a lane); bcast: one elem to every lane */
#ifdef KILN_BF16
static inline vf bcast(elem x) { return (vf)_mm512_set1_epi32(x); }
static inline vf madd(vf acc, vf a, vf b) { return (vf)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b); }
#else
static inline vf bcast(elem x) { return splat(x); }
static inline vf madd(vf acc, vf a, vf b) { return acc + a * b; }
#endif
static inline vf load_elems(const elem *p) { return load((const float *)p); }

#ifndef KILN_AMX
#define DEFINE_SCORES(NV)                                                                                        \
  static void scores##NV(const elem *const qi[R], const elem *kt, int64_t ldk, int DP, vf s[R][KV], int c0) {     \
    vf acc[R][NV];                                                                                               \
    for (int r = 0; r < R; ++r)                                                                                  \
      for (int c = 0; c < NV; ++c) acc[r][c] = splat(0.0f);                                                      \
    for (int d = 0; d < DP; ++d) {                                                                               \
      const elem *k = kt + (int64_t)d * ldk;                                                                     \
      vf kv[NV];                                                                                                 \
      for (int c = 0; c < NV; ++c) kv[c] = load_elems(k + c * VL);                                               \
      for (int r = 0; r < R; ++r) {                                                                              \
        vf q = bcast(qi[r][d]);                                                                                  \
        for (int c = 0; c < NV; ++c) acc[r][c] = madd(acc[r][c], q, kv[c]);                                      \
      }                                                                                                          \
    }                                                                                                            \
    for (int r = 0; r < R; ++r)                                                                                  \
      for (int c = 0; c < NV; ++c) s[r][c0 + c] = acc[r][c];                                                     \
  }
DEFINE_SCORES(1)
DEFINE_SCORES(2)
#if SV > 2
DEFINE_SCORES(3)
DEFINE_SCORES(4)
#endif

static void scores(int nv, const elem *const qi[R], const elem *kt, int64_t ldk, int D, vf s[R][KV], int c0) {
  switch (nv) {
    case 1: scores1(qi, kt, ldk, D, s, c0); break;
#if SV > 2
    case 3: scores3(qi, kt, ldk, D, s, c0); break;
    case 4: scores4(qi, kt, ldk, D, s, c0); break;
#endif
    default: scores2(qi, kt, ldk, D, s, c0); break;
  }
}

#endif

/* The mask on S[R][KB] over keys [j0, j0 + KB): + the additive mask, -inf past the valid keys and, causal,
 * past each query's position; whole vectors of the mask are loaded, the partial one lane by lane. */
static void apply_mask(const masking *mk, int bh, const int i[R], int j0, int valid, vf s[R][KV]) {
  vi lane;
  for (int l = 0; l < VL; ++l) lane[l] = l;
  const float *base = mk->mask ? mk->mask + (int64_t)(bh / mk->mh_div % mk->mh_mod) * mk->mask_bh + j0 : NULL;
  vf ninf = splat(-INFINITY);
  for (int r = 0; r < R; ++r) {
    const float *row = base ? base + (int64_t)i[r] * mk->mask_row : NULL;
    for (int c = 0; c < KV; ++c) {
      vi j = lane + c * VL; /* key index - j0 */
      vi dead = j >= valid;
      if (mk->causal) dead |= j > i[r] + mk->causal_offset - j0;
      if (row && (c + 1) * VL <= valid) {
        s[r][c] += load(row + c * VL);
      } else if (row) {
        for (int l = 0; c * VL + l < valid; ++l) s[r][c][l] += row[c * VL + l];
      }
      s[r][c] = (vf)(((vi)s[r][c] & ~dead) | ((vi)ninf & dead));
    }
  }
}

#define LOG2E 1.44269504088896341f

/* A block whose scores may be -inf or whose scale is not positive: S scaled, then the mask. */
static void scale_and_mask(const masking *mk, int bh, const int idx[R], int j0, int valid, int nv, float scale,
                           vf s[R][KV]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < nv; ++c) s[r][c] *= scale;
  apply_mask(mk, bh, idx, j0, valid, s);
}

/* The online softmax over one block of scores s (times c: log2 units): running max m and sum l per row (in log2 units
 * and plain), P = 2^(c s - m) into p, and alpha = 2^(m_old - m), the factor the rows' outputs so far are scaled by.
 * Written rows inner, so the R rows' reductions and exp chains (each ~10 dependent instructions) interleave: row by
 * row, their latency held the kernel at 93 GFLOP/s a core on ViT's heads (benchmarks/history.md). */
static void softmax_block(vf s[R][KV], int nv, float c, int masked, float m[R], float l[R], float alpha[R],
                          float p[R][KB]) {
  vf mx[R], sum[R], vb[R], vc = splat(c), shift = splat(0.0f); /* shift's lane r: m_old - m of row r */
  int empty[R]; /* rows whose keys so far were all masked: alpha 0 */
  for (int r = 0; r < R; ++r) {
    mx[r] = s[r][0];
    for (int k = 1; k < nv; ++k) mx[r] = vmax(mx[r], s[r][k]);
  }
  for (int r = 0; r < R; ++r) {
    float mnew = hmax(mx[r]) * c;
    if (mnew < m[r]) mnew = m[r];
    /* a row whose keys so far are all masked: exp of 0, as softmax gives over equal (masked) scores */
    float base = mnew == -INFINITY ? 0.0f : mnew;
    empty[r] = m[r] == -INFINITY;
    shift[r] = empty[r] ? 0.0f : m[r] - base;
    m[r] = mnew;
    vb[r] = splat(-base);
    sum[r] = splat(0.0f);
  }
  vf a = vexp2(shift);
  for (int r = 0; r < R; ++r) alpha[r] = empty[r] ? 0.0f : a[r];
  for (int k = 0; k < nv; ++k)
    for (int r = 0; r < R; ++r) {
      vf e = masked ? vexp2_masked(s[r][k] * vc + vb[r]) : vexp2(s[r][k] * vc + vb[r]);
      store(p[r] + k * VL, e);
      sum[r] += e;
    }
  for (int r = 0; r < R; ++r) l[r] = l[r] * alpha[r] + hsum(sum[r]);
}

/* P as the elems P V reads: float32, or bf16 pairs of keys (pp's rows hold 16 pairs past KB / 2: a last vector
 * of 16 keys converts with 16 zeros) */
#ifdef KILN_BF16
#define PP_ROW (KB / 2 + VL)
static void p_elems(float p[R][KB], int keys, elem pp[R][PP_ROW]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < keys; c += 2 * VL) {
      __m512 hi = c + VL < keys ? _mm512_loadu_ps(p[r] + c + VL) : _mm512_setzero_ps();
      _mm512_storeu_si512((void *)(pp[r] + c / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, _mm512_loadu_ps(p[r] + c)));
    }
}
#endif

#ifdef KILN_AMX
#include "amx_tiles.h"

/* S = Q K^T over nv vectors of 16 keys of a block: qt's 16 rows ldq bytes apart, kt the block's [DP][KB] pairs;
 * up to 4 accumulator tiles (keys) at a time, one A tile of 32 features per step */
static void amx_scores(const elem *qt, int64_t ldq, const elem *kt, int DP, int nv, vf s[R][KV]) {
  for (int c0 = 0; c0 < nv; c0 += 4) {
    const int n = nv - c0 < 4 ? nv - c0 : 4;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int d = 0; d < DP; d += 16) {
      const elem *k = kt + (int64_t)d * KB + c0 * 16;
      _tile_loadd(4, qt + d, ldq);
      _tile_loadd(6, k, KB * 4);
      _tile_dpbf16ps(0, 4, 6);
      if (n > 1) {
        _tile_loadd(7, k + 16, KB * 4);
        _tile_dpbf16ps(1, 4, 7);
      }
      if (n > 2) {
        _tile_loadd(6, k + 32, KB * 4);
        _tile_dpbf16ps(2, 4, 6);
      }
      if (n > 3) {
        _tile_loadd(7, k + 48, KB * 4);
        _tile_dpbf16ps(3, 4, 7);
      }
    }
    _tile_stored(0, &s[0][c0], sizeof(s[0]));
    if (n > 1) _tile_stored(1, &s[0][c0 + 1], sizeof(s[0]));
    if (n > 2) _tile_stored(2, &s[0][c0 + 2], sizeof(s[0]));
    if (n > 3) _tile_stored(3, &s[0][c0 + 3], sizeof(s[0]));
  }
}

/* O = alpha O + P V over one block of `keys` keys: P's rows of bf16 pairs pe (pe_row elems apart, zeros past keys
 * to a multiple of 32), vb the block's [KB/2][DV] pairs of keys (zeros past N); 4 accumulator tiles of 16
 * features at a time, loaded from and stored to O's rows */
static void values(float o[R][MAX_DV], const float alpha[R], const elem *pe, int pe_row, const elem *vb, int keys,
                   int DV) {
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < DV; e += VL) store(o[r] + e, load(o[r] + e) * alpha[r]);
  const int64_t ldo = MAX_DV * 4, ldv = (int64_t)DV * 4, ldp = (int64_t)pe_row * 4;
  for (int e0 = 0; e0 < DV; e0 += 4 * VL) {
    const int n = (DV - e0) / VL < 4 ? (DV - e0) / VL : 4;
    _tile_loadd(0, o[0] + e0, ldo);
    if (n > 1) _tile_loadd(1, o[0] + e0 + 16, ldo);
    if (n > 2) _tile_loadd(2, o[0] + e0 + 32, ldo);
    if (n > 3) _tile_loadd(3, o[0] + e0 + 48, ldo);
    for (int j = 0; j < keys; j += 32) {
      const elem *v = vb + (int64_t)j / 2 * DV + e0;
      _tile_loadd(4, pe + j / 2, ldp);
      _tile_loadd(6, v, ldv);
      _tile_dpbf16ps(0, 4, 6);
      if (n > 1) {
        _tile_loadd(7, v + 16, ldv);
        _tile_dpbf16ps(1, 4, 7);
      }
      if (n > 2) {
        _tile_loadd(6, v + 32, ldv);
        _tile_dpbf16ps(2, 4, 6);
      }
      if (n > 3) {
        _tile_loadd(7, v + 48, ldv);
        _tile_dpbf16ps(3, 4, 7);
      }
    }
    _tile_stored(0, o[0] + e0, ldo);
    if (n > 1) _tile_stored(1, o[0] + e0 + 16, ldo);
    if (n > 2) _tile_stored(2, o[0] + e0 + 32, ldo);
    if (n > 3) _tile_stored(3, o[0] + e0 + 48, ldo);
  }
}
#else
/* O = alpha O + P V over one block of `keys` keys (a multiple of VL): vb's rows of DV elems, one per key (a pair
 * of keys in bf16); pe: P's rows as elems */
static void values(float o[R][MAX_DV], const float alpha[R], const elem *pe, int pe_row, const elem *vb, int keys,
                   int DV) {
  const int steps = keys / PAIR;
  for (int e0 = 0; e0 < DV; e0 += OV * VL) {
    int ne = DV - e0 < OV * VL ? (DV - e0) / VL : OV;
    if (ne == OV) {
      vf acc[R][OV];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < OV; ++c) acc[r][c] = load(o[r] + e0 + c * VL) * alpha[r];
      for (int j = 0; j < steps; ++j) {
        const elem *vr = vb + (int64_t)j * DV + e0;
        vf vv[OV];
        for (int c = 0; c < OV; ++c) vv[c] = load_elems(vr + c * VL);
        for (int r = 0; r < R; ++r) {
          vf pr = bcast(pe[r * pe_row + j]);
          for (int c = 0; c < OV; ++c) acc[r][c] = madd(acc[r][c], pr, vv[c]);
        }
      }
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < OV; ++c) store(o[r] + e0 + c * VL, acc[r][c]);
    } else {
      for (int c = 0; c < ne; ++c) {
        vf acc[R];
        for (int r = 0; r < R; ++r) acc[r] = load(o[r] + e0 + c * VL) * alpha[r];
        for (int j = 0; j < steps; ++j) {
          vf vv = load_elems(vb + (int64_t)j * DV + e0 + c * VL);
          for (int r = 0; r < R; ++r) acc[r] = madd(acc[r], bcast(pe[r * pe_row + j]), vv);
        }
        for (int r = 0; r < R; ++r) store(o[r] + e0 + c * VL, acc[r]);
      }
    }
  }
}

#endif

/* One tile of R query rows over every key block: online softmax, O accumulated in o[R][DV]. */
static void tile(const elem *q, const elem *kt, const elem *v, const masking *mk, float *out,
                 int bh, int M, int N, int D, int DV, float scale, int row) {
  const int DP = D / PAIR; /* elems of a row of q, of a column of a key block */
  const elem *qi[R];
  int idx[R];
  for (int r = 0; r < R; ++r) {
    idx[r] = row + r < M ? row + r : M - 1; /* past the last row: recompute it, store nothing */
    qi[r] = q + (int64_t)idx[r] * DP;
  }
#ifdef KILN_AMX
  elem qbuf[R * 128] __attribute__((aligned(64))); /* a last partial tile's rows, zeros past M (DP <= 128) */
  const elem *qt = qi[0];
  if (row + R > M) {
    memset(qbuf, 0, sizeof(elem) * R * DP);
    memcpy(qbuf, qi[0], sizeof(elem) * (M - row) * DP);
    qt = qbuf;
  }
#endif
  float o[R][MAX_DV] __attribute__((aligned(64)));
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    memset(o[r], 0, sizeof(float) * DV);
  }
  int need_mask = mk->mask != NULL || mk->causal;
  for (int j0 = 0; j0 < N; j0 += KB) {
    int valid = N - j0 < KB ? N - j0 : KB;
    int tail = valid < KB;
    vf s[R][KV] __attribute__((aligned(64)));
    int nv = (valid + VL - 1) / VL; /* a partial last block: only its vectors */
#ifdef KILN_AMX
    amx_scores(qt, (int64_t)DP * 4, kt + (int64_t)j0 * DP, DP, nv, s);
#else
    for (int c0 = 0; c0 < nv; c0 += SV)
      scores(nv - c0 < SV ? nv - c0 : SV, qi, kt + (int64_t)j0 * DP + c0 * VL, KB, DP, s, c0);
#endif
    /* an unmasked block (scale > 0) keeps Q K^T as it is: the scale and log2 e fold into one FMA before the exp */
    int masked = need_mask || tail || !(scale > 0.0f);
    if (masked) scale_and_mask(mk, bh, idx, j0, valid, nv, scale, s);
    float alpha[R], p[R][KB] __attribute__((aligned(64)));
    softmax_block(s, nv, masked ? LOG2E : scale * LOG2E, masked, m, l, alpha, p);
#ifdef KILN_BF16
    elem pp[R][PP_ROW] __attribute__((aligned(64)));
    p_elems(p, nv * VL, pp);
    values(o, alpha, &pp[0][0], PP_ROW, v + (int64_t)j0 / 2 * DV, nv * VL, DV); /* v zero-padded to whole blocks */
#else
    values(o, alpha, &p[0][0], KB, v + (int64_t)j0 * DV, valid, DV); /* a partial block: its valid keys only */
#endif
  }
  for (int r = 0; r < R && row + r < M; ++r) {
    vf inv = splat(l[r] > 0.0f ? 1.0f / l[r] : 0.0f); /* a row with every key masked by -inf: 0 (not NaN) */
    float *dst = out + (int64_t)(row + r) * DV;
    for (int e = 0; e < DV; e += VL) store(dst + e, load(o[r] + e) * inv);
  }
}

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
/* the keys per block this build packs K^T by (kiln_attention_f32_key_block, ..._avx2_key_block) */
int CAT(KILN_ATTENTION, _key_block)(void) { return KB; }

int KILN_ATTENTION(const elem *q, const elem *kt, const elem *v, const float *mask, float *out, int M, int N, int D,
                   int DV, float scale, int64_t mask_bh, int64_t mask_row, int mh_div, int mh_mod, int causal,
                   int causal_offset, int bh, int row0, int rows) {
  if (DV % VL || DV > MAX_DV || D % PAIR) return -1;
#ifdef KILN_AMX
  if (D % 32 || D > 256) return -1;
  load_tiles(16);
#endif
  const int nb = (N + KB - 1) / KB, DP = D / PAIR;
  const elem *qh = q + (int64_t)bh * M * DP, *kth = kt + (int64_t)bh * nb * DP * KB;
  float *oh = out + (int64_t)bh * M * DV;
#ifdef KILN_BF16
  const elem *vh = v + (int64_t)bh * nb * (KB / 2) * DV; /* packed to whole blocks */
#else
  const elem *vh = v + (int64_t)bh * N * DV; /* P V reads a partial last block's valid keys only */
#endif
  masking mk = {mask, mask_bh, mask_row, mh_div > 0 ? mh_div : 1, mh_mod > 0 ? mh_mod : 1, causal, causal_offset};
  int end = row0 + rows < M ? row0 + rows : M;
  for (int row = row0; row < end; row += R) tile(qh, kth, vh, &mk, oh, bh, M, N, D, DV, scale, row);
#ifdef KILN_AMX
  _tile_release();
#endif
  return 0;
}
