/* What Kiln's AMX kernels share (amx_bf16_matmul.c, amx_bf16_conv.c, attention.c's KILN_AMX build): the tile
 * configuration (palette 1) and a per-thread scratch buffer. */
#ifndef KILN_AMX_TILES_H
#define KILN_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* every tile 16 rows of 64 bytes; static data, not stores the compiler might move past ldtilecfg (GCC 12 moved a
 * stack configuration's in attention.c: a #GP at the first call) */
static const tile_config TILES16 __attribute__((aligned(64))) = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

static __thread uint16_t *scratch_buf;
static __thread size_t scratch_cap;

/* the calling thread's buffer of at least n bf16 (64-byte aligned, kept for its next call), or NULL */
static inline uint16_t *scratch(size_t n) {
  if (n > scratch_cap) {
    free(scratch_buf);
    scratch_buf = (uint16_t *)aligned_alloc(64, (n * 2 + 63) / 64 * 64);
    scratch_cap = scratch_buf ? n : 0;
  }
  return scratch_buf;
}
#endif
