"""Calibration data and activation ranges.

Data: an .npz keyed by input name whose arrays stack samples along the batch axis (a 16x3x224x224
array is 16 samples of a 1x3x224x224 input), or a folder of such files (read in name order).
Ranges: each tapped tensor's [lo, hi] over all samples, by one of CALIB_METHODS:
  minmax      the observed min and max
  percentile  the 0.001% / 99.999% points of a 2048-bin histogram (clips rare outliers)
  entropy     the |x| threshold minimizing the KL divergence of the 8-bit distribution (TensorRT's method)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from ...errors import OptionsError

CALIB_METHODS = ("minmax", "percentile", "entropy")
BINS = 2048
PERCENTILE = 99.999


@dataclasses.dataclass(frozen=True)
class CalibrationSet:
    """Samples per input: name -> list of arrays, each one model input (batch axis kept)."""

    samples: dict[str, list[np.ndarray]]
    source: str
    digest: str

    def __len__(self) -> int:
        return len(next(iter(self.samples.values())))

    def feed(self, i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in self.samples.items()}

    def split(self, n_calib: int | None) -> tuple[CalibrationSet, CalibrationSet | None]:
        """(calibration, held-out): the first n_calib samples calibrate, the rest check accuracy.
        Without n_calib a quarter (at least one) is held out when there are 4 samples or more."""
        total = len(self)
        if n_calib is None:
            n_calib = total - max(1, total // 4) if total >= 4 else total
        n_calib = min(n_calib, total)
        take = lambda a, b: CalibrationSet({k: v[a:b] for k, v in self.samples.items()}, self.source, self.digest)
        return take(0, n_calib), (take(n_calib, total) if n_calib < total else None)


def calibration_files(path: str | os.PathLike) -> list[Path]:
    """The .npz files calibration data names: the file itself, or a folder's, in name order."""
    p = Path(path)
    return sorted(p.glob("*.npz")) if p.is_dir() else [p] if p.exists() else []


def calibration_digest(path: str | os.PathLike) -> str:
    """sha256 over the calibration files' bytes: it goes into the manifest and cache keys."""
    import hashlib

    h = hashlib.sha256()
    for f in calibration_files(path):
        h.update(f.read_bytes())
    return h.hexdigest()


def load_calibration(path: str | os.PathLike, inputs) -> CalibrationSet:
    """inputs: the model's TensorSpecs (name, shape, dtype). Every input needs a stack of samples
    whose trailing dimensions match its shape; all inputs the same sample count."""
    import hashlib

    p = Path(path)
    files = calibration_files(p)
    if not files:
        raise OptionsError(
            f"calibration data {str(p)!r} {'has no .npz files' if p.exists() else 'does not exist'}",
            where="--calibration",
            fix="give an .npz keyed by input name (samples stacked on the batch axis) or a folder of them",
        )
    samples: dict[str, list[np.ndarray]] = {i.name: [] for i in inputs}
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
        try:
            data = np.load(f, allow_pickle=False)
            arrays = {k: data[k] for k in data.files}
        except Exception as e:
            raise OptionsError(
                f"cannot read calibration file: {type(e).__name__}: {e}",
                where=str(f),
                fix="write it with numpy.savez(path, input_name=array)",
            ) from None
        missing, extra = (
            [i.name for i in inputs if i.name not in arrays],
            sorted(set(arrays) - {i.name for i in inputs}),
        )
        if missing or extra:
            raise OptionsError(
                f"calibration file keys {sorted(arrays)} do not match the model inputs {[i.name for i in inputs]}"
                + (f" (missing {missing})" if missing else "")
                + (f" (unknown {extra})" if extra else ""),
                where=str(f),
                fix="key each array by the model's input name",
            )
        for spec in inputs:
            a, shape = arrays[spec.name], tuple(spec.shape)
            batch = shape[0] if shape else 1
            if a.ndim != len(shape) or tuple(a.shape[1:]) != shape[1:] or a.shape[0] % batch or a.shape[0] == 0:
                raise OptionsError(
                    f"calibration array {spec.name!r} has shape {list(a.shape)}; the model input is {list(shape)}",
                    where=str(f),
                    fix=f"stack samples on the batch axis: shape [k*{batch}, {', '.join(map(str, shape[1:]))}]",
                )
            if a.dtype.kind != np.dtype(spec.dtype).kind or not np.can_cast(a.dtype, spec.dtype, casting="same_kind"):
                raise OptionsError(
                    f"calibration array {spec.name!r} is {a.dtype}; the model input is {spec.dtype}",
                    where=str(f),
                    fix=f"save it as {spec.dtype}",
                )
            samples[spec.name].extend(
                np.ascontiguousarray(a[i : i + batch], dtype=spec.dtype) for i in range(0, a.shape[0], batch)
            )
    counts = {k: len(v) for k, v in samples.items()}
    if len(set(counts.values())) != 1:
        raise OptionsError(
            f"inputs have different sample counts {counts}",
            where=str(p),
            fix="give every input the same number of samples",
        )
    return CalibrationSet(samples, str(p), h.hexdigest())


class RangeCollector:
    """Accumulates [lo, hi] of each tapped tensor over samples; percentile and entropy take a
    second pass over a histogram bounded by the first pass's min/max (observe_histogram)."""

    def __init__(self, method: str):
        if method not in CALIB_METHODS:
            raise OptionsError(
                f"calibration method {method!r} is not valid",
                where="--calib-method",
                fix=f"use one of {', '.join(CALIB_METHODS)}",
            )
        self.method = method
        self.lo: dict[str, float] = {}
        self.hi: dict[str, float] = {}
        self.hist: dict[str, np.ndarray] = {}

    @property
    def needs_histogram(self) -> bool:
        return self.method != "minmax"

    def observe(self, name: str, x: np.ndarray) -> None:
        lo, hi = float(x.min()), float(x.max())
        self.lo[name] = min(lo, self.lo.get(name, lo))
        self.hi[name] = max(hi, self.hi.get(name, hi))

    def _edges(self, name: str) -> tuple[float, float]:
        if self.method == "entropy":
            return 0.0, max(abs(self.lo[name]), abs(self.hi[name]), 1e-12)
        return self.lo[name], max(self.hi[name], self.lo[name] + 1e-12)

    def observe_histogram(self, name: str, x: np.ndarray) -> None:
        a, b = self._edges(name)
        v = np.abs(x) if self.method == "entropy" else x
        h, _ = np.histogram(v, bins=BINS, range=(a, b))
        self.hist[name] = self.hist.get(name, 0) + h

    def ranges(self) -> dict[str, tuple[float, float]]:
        out = {}
        for name in self.lo:
            lo, hi = self.lo[name], self.hi[name]
            if self.method == "percentile" and name in self.hist:
                lo, hi = _percentile_range(self.hist[name], *self._edges(name))
            elif self.method == "entropy" and name in self.hist:
                t = _entropy_threshold(self.hist[name], self._edges(name)[1])
                lo, hi = (max(lo, -t), min(hi, t))
            out[name] = (min(lo, 0.0), max(hi, 0.0))  # 0 must be exact (padding, ReLU)
        return out


def _percentile_range(hist: np.ndarray, a: float, b: float) -> tuple[float, float]:
    cdf = np.cumsum(hist) / max(hist.sum(), 1)
    width = (b - a) / len(hist)
    lo_bin = int(np.searchsorted(cdf, 1 - PERCENTILE / 100))
    hi_bin = int(np.searchsorted(cdf, PERCENTILE / 100))
    return a + lo_bin * width, a + (hi_bin + 1) * width


def _entropy_threshold(hist: np.ndarray, top: float, levels: int = 128) -> float:
    """TensorRT's calibration: the threshold T (a bin edge) minimizing KL(P || Q), P the observed
    distribution clipped at T (the clipped mass in its last bin), Q the in-range part quantized to
    `levels` levels. The bin holding exact zeros (ReLU outputs, represented exactly) is left out."""
    hist = hist.astype(np.float64)
    hist[0] = 0.0
    if hist.sum() == 0:
        return top
    best, best_i = np.inf, len(hist)
    for i in range(levels, len(hist) + 1, 16):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        nz = hist[:i] > 0
        q = np.zeros(i)
        for c in np.array_split(np.arange(i), levels):
            m = nz[c]
            if m.any():
                q[c[m]] = hist[c].sum() / m.sum()
        if p.sum() == 0 or q.sum() == 0:
            continue
        ps, qs = p / p.sum(), q / q.sum()
        valid = ps > 0
        kl = float(np.sum(ps[valid] * np.log(ps[valid] / np.maximum(qs[valid], 1e-12))))
        if kl < best:
            best, best_i = kl, i
    return top * best_i / len(hist)
