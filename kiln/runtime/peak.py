"""This CPU's measured fp32 FMA, bf16 and int8 dot-product peaks and its memory bandwidth: the roofline a kernel's
GFLOP/s and bytes/s are set against (`kiln profile`; benchmarks/peak.py measures the FMA peak longer).
A peak is a loop of 12 independent chains of one instruction (the fp32 FMA on AVX-512, else AVX2; AVX512-BF16's
vdpbf16ps, two multiply-adds a lane; AVX512-VNNI's vpdpbusd, four int8 ones) built with the system C compiler and
run in N processes at once (one per thread the model uses); without a C compiler or those instructions, numpy's
float32 matmul stands in for the FMA peak (a little under it) and a dot-product unit's peak is None. Cached per
process."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

# WIDTH: 512 (AVX-512) or 256 (AVX2); N: FMA instructions per chain (the loop runs N / 12 rounds)
SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#ifdef DPBUSD /* vpdpbusd: per 32-bit lane four uint8 x int8 products added to the int32 accumulator */
#define V __m512i
#define SET _mm512_set1_epi32
#define F(x) x = _mm512_dpbusd_epi32(x, b, c);
#define ADD _mm512_add_epi32
#define LANES 16
#define FLOPS_PER_LANE 8
#elif defined(DPBF16) /* vdpbf16ps: per lane two bf16 products added to the float32 accumulator */
#define V __m512
#define SET _mm512_set1_ps
#define F(x) x = _mm512_dpbf16_ps(x, (__m512bh)_mm512_castps_si512(b), (__m512bh)_mm512_castps_si512(c));
#define ADD _mm512_add_ps
#define LANES 16
#define FLOPS_PER_LANE 4
#elif WIDTH == 512
#define V __m512
#define SET _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define LANES 16
#else
#define V __m256
#define SET _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define LANES 8
#endif
#ifndef F
#define F(x) x = FMA(x, b, c);
#define FLOPS_PER_LANE 2
#endif
int main(void) {
  V b = SET(1.0000001f), c = SET(1e-7f); /* as bf16 pairs (DPBF16): small products, no overflow; DPBUSD: 1, 0 */
  V a0 = SET(0), a1 = SET(1), a2 = SET(2), a3 = SET(3), a4 = SET(4), a5 = SET(5), a6 = SET(6), a7 = SET(7),
    a8 = SET(8), a9 = SET(9), a10 = SET(10), a11 = SET(11);
  long n = (long)(N) / 12;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    F(a0) F(a1) F(a2) F(a3) F(a4) F(a5) F(a6) F(a7) F(a8) F(a9) F(a10) F(a11)
    __asm__ volatile("" : : "v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5), "v"(a6), "v"(a7), "v"(a8), "v"(a9),
                     "v"(a10), "v"(a11));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  V r = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));
  r = ADD(r, ADD(ADD(a8, a9), ADD(a10, a11)));
  printf("%.1f %g\n", n * 12.0 * LANES * FLOPS_PER_LANE / s / 1e9, ((float *)&r)[0]);
  return 0;
}
"""
FLAGS = {512: ["-mavx512f", "-mfma"], 256: ["-mavx2", "-mfma"]}
UNITS = {  # the dot-product loops: name -> (flags, method)
    "bf16": (["-mavx512f", "-mavx512bf16", "-DWIDTH=512", "-DDPBF16"], "vdpbf16ps"),
    "int8": (["-mavx512f", "-mavx512vnni", "-DWIDTH=512", "-DDPBUSD"], "vpdpbusd"),
}


def build_fma(directory: str | Path, n: int = 24_000_000) -> tuple[Path, int] | None:
    """Compile the FMA loop (n FMAs per run) in `directory`: (executable, vector width), or None
    without a C compiler or AVX2/AVX-512 (on the compiler or this CPU)."""
    for width, flags in FLAGS.items():
        exe = _build(directory, f"fma{width}", [*flags, f"-DWIDTH={width}"], n)
        if exe is not None:
            return exe, width
    return None


def build_unit(directory: str | Path, unit: str, n: int = 24_000_000) -> Path | None:
    """Compile the loop of UNITS[unit] in `directory`, or None without a C compiler or that instruction."""
    return _build(directory, unit, UNITS[unit][0], n)


def _build(directory, name: str, flags: list[str], n: int) -> Path | None:
    """The loop built with `flags` and run once (a CPU without the instruction dies of SIGILL: None)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    src = Path(directory) / "peak.c"
    src.write_text(SOURCE)
    exe = Path(directory) / name
    r = subprocess.run([cc, "-O2", *flags, f"-DN={n}", str(src), "-o", str(exe)], capture_output=True)
    if r.returncode == 0 and subprocess.run([str(exe)], capture_output=True).returncode == 0:
        return exe
    return None


def run_at_once(exe: Path, procs: int) -> list[float]:
    """GFLOP/s of each of `procs` copies of the FMA loop run at once."""
    ps = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    return [float(p.communicate()[0].split()[0]) for p in ps]


def _best_of(exe: Path, threads: int, tries: int) -> float:
    """GFLOP/s of the loop on `threads` cores at once, the best of `tries` (a busy neighbour only lowers it)."""
    return round(max(sum(run_at_once(exe, threads)) for _ in range(tries)), 1)


_build_dir: tempfile.TemporaryDirectory | None = None


def _dir() -> str:
    """The loops' folder, made once per process (it lives as long as the process)."""
    global _build_dir
    if _build_dir is None:
        _build_dir = tempfile.TemporaryDirectory(prefix="kiln-peak-")
    return _build_dir.name


@functools.cache
def _fma_exe() -> tuple[Path, int] | None:
    """The FMA loop built once per process."""
    return build_fma(_dir())


@functools.cache
def _unit_exe(unit: str) -> Path | None:
    return build_unit(_dir(), unit)


@functools.cache
def fma_peak(threads: int = 1, tries: int = 3) -> dict:
    """{gflops, method, threads}: the best of `tries` runs of the FMA loop on `threads` cores at
    once (a busy neighbour only lowers it; a few ms each, after a build of a fraction of a second);
    numpy's matmul where the loop cannot be built."""
    built = _fma_exe()
    if built is not None:
        exe, width = built
        return {
            "gflops": _best_of(exe, threads, tries),
            "method": f"fma-avx{width if width == 512 else 2}",
            "threads": threads,
        }
    a = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    best = 0.0
    for _ in range(tries * 3):
        t = time.perf_counter()
        a @ a
        best = max(best, 2 * 512**3 / (time.perf_counter() - t) / 1e9)
    return {"gflops": round(best, 1), "method": "numpy-sgemm", "threads": threads}


def fresh_fma_peak(threads: int = 1) -> dict:
    """fma_peak measured now, not the cached value: a profile measures before and after its runs and keeps
    the best (one measurement in a busy spell of this shared 2-vCPU host read half the peak, and kernels
    showed more than 100% of it; benchmarks/history.md)."""
    return fma_peak.__wrapped__(threads)


@functools.cache
def unit_peak(unit: str, threads: int = 1, tries: int = 3) -> dict | None:
    """{gflops, method, threads} of a dot-product unit (UNITS: "bf16", AVX512-BF16's vdpbf16ps, 16 lanes x 2
    multiply-adds; "int8", AVX512-VNNI's vpdpbusd, 16 lanes x 4, in integer operations a second) on `threads` cores
    at once, best of `tries`; None where this CPU or the C compiler lacks the instruction."""
    exe = _unit_exe(unit)
    if exe is None:
        return None
    return {"gflops": _best_of(exe, threads, tries), "method": UNITS[unit][1], "threads": threads}


def fresh_unit_peak(unit: str, threads: int = 1) -> dict | None:
    """unit_peak measured now (as fresh_fma_peak)."""
    return unit_peak.__wrapped__(unit, threads)


@functools.cache
def memory_bandwidth(mb: int = 32, tries: int = 3) -> float:
    """GB/s of a copy far larger than the caches (bytes read + written), one thread: the roofline's
    memory ceiling."""
    src = np.ones(mb * 2**20 // 4, np.float32)
    dst = np.ones_like(src)  # touched: no page faults in the timed copies
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return round(2 * src.nbytes / best / 1e9, 1)
