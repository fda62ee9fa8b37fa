"""Register-tile arithmetic of the default schedules: which divisors, vector widths and conv tiles a
kernel's loops take on a target, given its vector lanes and registers. Plain integers, no TVM: the
rules (rules.py, winograd.py, dwpw.py) apply what these choose."""

from __future__ import annotations

NARROW_REGISTERS = 16  # AVX2's ymm registers: blocked convs take conv_register_tile at or below this
NARROW_ACCUMULATORS = 8  # its conv tile's accumulators (with up to 4 weight vectors and a broadcast)
NARROW_WEIGHT_VECTORS = 4


def divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


CACHE_BYTES = 512 << 10  # what a core's L2 keeps of one operand: half of Zen 4's 1 MB, all of Zen 3's 512 KB
MAX_TILE_VECTORS = 8  # column vectors of a matmul register tile
ROUND_ROWS_GAIN = 1.25  # round a matmul's rows up when the free tile does this many more FMAs per load (128 rows
# keep their 4 x 4 tile, near peak, 2.0 FMAs per load against 6 x 4's 2.4; benchmarks/history.md)


def max_tile_rows(v: int, registers: int) -> int:
    """The most rows of a register tile of v column vectors: r * v accumulators, v weight vectors and one
    broadcast within the registers."""
    return max(1, (registers - v - 1) // v)


def matmul_tile(rows: int | None, vectors: int, registers: int) -> tuple[int, int]:
    """(r, v): a matmul register tile of r rows x v column vectors, v a divisor of the vectors (at most
    MAX_TILE_VECTORS), r a divisor of `rows` (any r when rows is None), r * v accumulators plus v weight
    vectors and one broadcast within the registers, the most FMAs per load (r * v / (r + v))."""
    best, best_key = (1, 1), (0.0, 0)
    for v in range(1, min(vectors, MAX_TILE_VECTORS) + 1):
        if vectors % v:
            continue
        cap = max_tile_rows(v, registers)
        r = cap if rows is None else divisor_at_most(rows, cap)
        key = (r * v / (r + v), r * v)
        if key > best_key:
            best, best_key = (r, v), key
    return best


def round_to_tile(rows: int, tile) -> int | None:
    """The row count a matmul's rows are rounded up to (the padding rows computed and dropped) when no divisor of
    `rows` gives a register tile within ROUND_ROWS_GAIN of the best tile; None when the rows tile well as they
    are. tile(rows or None) -> (r, v): the best tile whose r divides `rows`, or any r for None."""
    r, v = tile(None)
    have = tile(rows)
    if rows % r == 0 or r * v / (r + v) <= ROUND_ROWS_GAIN * have[0] * have[1] / sum(have):
        return None
    return -(-rows // r) * r


def rounded_rows(rows: int, vectors: int, registers: int) -> int | None:
    """round_to_tile for the float32 matmul tile: 197 tokens (prime) have only 1-row tiles, which read a weight
    vector per FMA (far below peak; timings in benchmarks/history.md), where 6 x 4 zmm tiles read one per 2.4 FMAs.
    Rounded to the free tile with the least padded work per FMA per load (rows' * (r + v) / (r * v)): 31 rows
    become 32 (4 x 6), not 36 (6 x 4, 16% more work at the same loads per FMA)."""
    if round_to_tile(rows, lambda m: matmul_tile(m, vectors, registers)) is None:
        return None
    best, best_cost = None, float("inf")
    for v in range(1, min(vectors, MAX_TILE_VECTORS) + 1):
        if vectors % v:
            continue
        r = max_tile_rows(v, registers)
        padded = -(-rows // r) * r
        cost = padded * (r + v) / (r * v)
        if (cost, padded) < (best_cost, best or 0):
            best, best_cost = padded, cost
    return best


def padded_tile(rows: int, vectors: int, registers: int) -> tuple[int, int, int, int]:
    """(padded rows, padded vectors, r, v): the row and column-vector counts rounded up to a register tile of
    r x v, chosen for the least padded work per FMA per load ((rows' x vectors') * (r + v) / (r * v)), against
    the unpadded divisor tile (matmul_tile). Attention's [197, 64] x [64, 197] per head: 197 rows and 13
    vectors (both primes) tile 1 x 1 unpadded; padded to 198 x 14 they tile 6 x 2 or 3 x 7."""
    r0, v0 = matmul_tile(rows, vectors, registers)
    best, best_cost = (rows, vectors, r0, v0), rows * vectors * (r0 + v0) / (r0 * v0) / ROUND_ROWS_GAIN
    for v in range(1, MAX_TILE_VECTORS + 1):
        r = max_tile_rows(v, registers)
        pr, pv = -(-rows // r) * r, -(-vectors // v) * v
        cost = pr * pv * (r + v) / (r * v)
        if cost < best_cost:
            best, best_cost = (pr, pv, r, v), cost
    return best


def vector_width(n: int, lanes: int) -> int:
    """The widest power-of-two width up to `lanes` that divides n (whole SIMD registers: 1000
    outputs vectorize by 8, not by 10), else the largest divisor up to `lanes`."""
    p = lanes
    while p >= 4:
        if n % p == 0:
            return p
        p //= 2
    return divisor_at_most(n, lanes)


def conv_register_tile(width: int, blocks: int, registers: int) -> tuple[int, int] | None:
    """(pixels, output-channel blocks) of a blocked conv's register tile on a target with 16 vector
    registers (AVX2): t | width pixels x b | blocks channel blocks, at most NARROW_ACCUMULATORS
    accumulators and 4 weight vectors, the most FMAs per load (t broadcasts + b weight vectors for
    t x b FMAs), then more channel blocks. None on 32-register targets (AVX-512, NEON): they keep the
    row tile of up to 8 pixels, which beat this tile and a 16-accumulator one on Zen 4. On Zen 3 the
    row tile ran ResNet-50's 1x1 convs well below 2 pixels x 4 blocks (7 x 1 on 7-wide maps). 12
    accumulators measured no faster than 8 (timings in benchmarks/history.md, "AVX2" and "AVX-512")."""
    if registers > NARROW_REGISTERS:
        return None
    best, best_key = (1, 1), (0.0, 0)
    for b in range(1, min(blocks, NARROW_WEIGHT_VECTORS) + 1):
        if blocks % b:
            continue
        t = divisor_at_most(width, NARROW_ACCUMULATORS // b)
        key = (t * b / (t + b), b)
        if key > best_key:
            best, best_key = (t, b), key
    return best
