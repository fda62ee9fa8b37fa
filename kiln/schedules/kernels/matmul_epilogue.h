/* What the matmul kernels' epilogues share across ISAs (the AVX-512 bf16_matmul.c, the NEON neon_epilogue.h): the
 * epilogue's flags and arguments, and the rational approximations of erf and tanh its GELU uses (Eigen's: odd
 * numerator in x, even denominator, inputs clamped to where they saturate). */
#ifndef KILN_MATMUL_EPILOGUE_H
#define KILN_MATMUL_EPILOGUE_H
#include <stdint.h>

enum { MM_RES = 1, MM_GELU_ERF = 2, MM_GELU_TANH = 4, MM_RELU = 8 }; /* fuse_bf16_matmul_epilogue.py: FLAGS */

typedef struct {
  const float *bias, *res;
  float *out;
  uint16_t *out16;
  int flags, N;
} mm_epilogue;

static const float ERF_A[7] = {-1.60960333262415e-02f, -2.95459980854025e-03f, -7.34990630326855e-04f,
                               -5.69250639462346e-05f, -2.10102402082508e-06f, 2.77068142495902e-08f,
                               -2.72614225801306e-10f};
static const float ERF_B[5] = {-1.42647390514189e-02f, -7.37332916720468e-03f, -1.68282697438203e-03f,
                               -2.13374055278905e-04f, -1.45660718464996e-05f};
static const float TANH_A[7] = {4.89352455891786e-03f,  6.37261928875436e-04f,  1.48572235717979e-05f,
                                5.12229709037114e-08f,  -8.60467152213735e-11f, 2.00018790482477e-13f,
                                -2.76076847742355e-16f};
static const float TANH_B[4] = {4.89352518554385e-03f, 2.26843463243900e-03f, 1.18534705686654e-04f,
                                1.19825839466702e-06f};

#endif
