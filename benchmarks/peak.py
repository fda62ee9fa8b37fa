"""This CPU's fp32 FMA peak: the ceiling any direct-convolution schedule (Kiln's, onnxruntime's)
works under. Compiles a loop of 12 independent AVX-512 FMA chains with the system C compiler and
runs it in 1 and in N processes at once. Run by hand:  .venv/bin/python benchmarks/peak.py [--procs 2]"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#define F(x) x = _mm512_fmadd_ps(x, b, c);
int main(void) {
  __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
  __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
         a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
         a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
  long n = 400000000 / 12;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < n; i++) {
    F(a0) F(a1) F(a2) F(a3) F(a4) F(a5) F(a6) F(a7) F(a8) F(a9) F(a10) F(a11)
    __asm__ volatile("" : : "v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5), "v"(a6), "v"(a7), "v"(a8), "v"(a9), "v"(a10), "v"(a11));
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
  __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)), _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
  r = _mm512_add_ps(r, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  printf("%.1f %g\n", n * 12.0 * 16 * 2 / s / 1e9, _mm512_reduce_add_ps(r));
  return 0;
}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args(argv)
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        print("peak: no C compiler on PATH (install gcc)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fma.c", Path(tmp) / "fma"
        src.write_text(SOURCE)
        r = subprocess.run([cc, "-O2", "-mavx512f", "-mfma", str(src), "-o", str(exe)], capture_output=True, text=True)
        if r.returncode:
            print(f"peak: this compiler or CPU has no AVX-512 ({r.stderr.strip()[:200]})")
            return 0
        one = float(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()[0])
        procs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True) for _ in range(a.procs)]
        each = [float(p.communicate()[0].split()[0]) for p in procs]
    print(f"fp32 FMA peak: {one:.1f} GFLOP/s on one core; {sum(each):.1f} GFLOP/s on {a.procs} at once ({', '.join(f'{x:.1f}' for x in each)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
