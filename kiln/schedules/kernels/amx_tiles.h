/* What Kiln's AMX kernels share (amx_bf16_matmul.c, amx_bf16_conv.c, attention.c's KILN_AMX build): loading the
 * tile configuration (palette 1) and a per-thread scratch buffer. */
#ifndef KILN_AMX_TILES_H
#define KILN_AMX_TILES_H
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* Configure the tiles: 0..5 (accumulators, A operands) of a_rows rows, 6..7 (B operands: 16 input pairs) of 16,
 * every row 64 bytes. The asm takes the configuration's address, so its stores stay before ldtilecfg: GCC 12
 * dropped them from a stack configuration in attention.c, which then died with a #GP at the first call. */
static inline void load_tiles(int a_rows) {
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = t >= 6 ? 16 : a_rows;
  }
  __asm__ volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

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
