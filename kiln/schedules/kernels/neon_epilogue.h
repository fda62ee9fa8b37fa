/* The epilogue of Kiln's arm64 matmul kernels (bf16_matmul_arm.c: bfmmla, fp16_matmul_arm.c: fp16 fmla), on 4
 * columns of an output row at a time while they are in registers: + bias (added by the caller), the activation
 * (GELU in its erf or tanh form, ReLU), + residual, stored in float32 and/or the kernel's 16-bit type (KILN_STORE16,
 * defined by the including kernel). The flags are bf16_matmul.c's (fuse_bf16_matmul_epilogue.py: FLAGS). */
#ifndef KILN_NEON_EPILOGUE_H
#define KILN_NEON_EPILOGUE_H
#include <arm_neon.h>
#include <stdint.h>

#include "matmul_epilogue.h"

/* odd polynomial p(x) / even q(x) in x^2: Eigen's rational erf and tanh (clamped), max error 4e-7 */
static inline float32x4_t rational(float32x4_t x, const float *a, int na, const float *b, int nb) {
  float32x4_t x2 = vmulq_f32(x, x), p = vdupq_n_f32(a[na - 1]), q = vdupq_n_f32(b[nb - 1]);
  for (int i = na - 2; i >= 0; --i) p = vfmaq_f32(vdupq_n_f32(a[i]), p, x2);
  for (int i = nb - 2; i >= 0; --i) q = vfmaq_f32(vdupq_n_f32(b[i]), q, x2);
  return vdivq_f32(vmulq_f32(p, x), q);
}

static inline float32x4_t clamp(float32x4_t x, float lim) {
  return vminq_f32(vmaxq_f32(x, vdupq_n_f32(-lim)), vdupq_n_f32(lim));
}

/* GELU: 0.5 v (1 + erf(v / sqrt 2)), or its tanh form 0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) */
static inline float32x4_t activate(float32x4_t v, int flags) {
  if (flags & MM_RELU) return vmaxq_f32(v, vdupq_n_f32(0.0f));
  float32x4_t t;
  if (flags & MM_GELU_ERF) {
    t = rational(clamp(vmulq_f32(v, vdupq_n_f32(0.70710678118654752f)), 4.0f), ERF_A, 7, ERF_B, 5);
  } else if (flags & MM_GELU_TANH) {
    float32x4_t inner = vfmaq_f32(v, vmulq_f32(vmulq_f32(v, v), v), vdupq_n_f32(0.044715f));
    t = rational(clamp(vmulq_f32(inner, vdupq_n_f32(0.79788456080286536f)), 7.90531110763549805f), TANH_A, 7,
                 TANH_B, 4);
  } else {
    return v;
  }
  return vmulq_f32(vmulq_f32(v, vdupq_n_f32(0.5f)), vaddq_f32(t, vdupq_n_f32(1.0f)));
}

/* the epilogue of 4 columns of output row r (offset o = r * N + column), bias already added */
static inline void store(const mm_epilogue *ep, float32x4_t v, int64_t o) {
  v = activate(v, ep->flags);
  if (ep->flags & MM_RES) v = vaddq_f32(v, vld1q_f32(ep->res + o));
  if (ep->out) vst1q_f32(ep->out + o, v);
  if (ep->out16) KILN_STORE16(ep->out16 + o, v);
}
#endif
