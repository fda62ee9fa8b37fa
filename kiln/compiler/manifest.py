"""The artifact's manifest, written by one function (`manifest`) from typed parts: the options, the
backend's section, one entry per bucket, the packed weights' index, the source and the report. Every
key an artifact's reader sees is spelled here (docs/artifact-format.md lists them)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ManifestSection:
    """What a backend writes into the manifest: the runtime device the library needs, the host CPU
    features its code uses, and the accelerator's entry (None without one)."""

    device: str
    cpu_features: list[str]
    accelerator: dict | None = None


@dataclasses.dataclass(frozen=True)
class BucketEntry:
    """One compiled function: its inputs' and outputs' specs, its library member, its weights (indices
    into the artifact's one weight pool), and its kernels."""

    inputs: list  # frontends TensorSpec
    outputs: list
    library: str
    weights: list[int]
    kernels: int
    kernel_info: dict
    unaligned_inputs: tuple = ()  # indices of inputs the runtime may take in place at any address (unaligned_inputs.py)

    @property
    def name(self) -> str:
        return "+".join(f"{s.name}:{'x'.join(map(str, s.shape))}" for s in self.inputs)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "library": self.library,
            "weights": self.weights,
            "kernels": self.kernels,
            "kernel_info": self.kernel_info,
            "unaligned_inputs": list(self.unaligned_inputs),
        }


@dataclasses.dataclass(frozen=True)
class ManifestParts:
    options: object  # CompileOptions
    section: ManifestSection
    buckets: list[BucketEntry]
    weights_index: list
    source: dict  # {"file", "opsets", "format", "frontend", "framework"}
    import_stats: dict
    report: dict  # the compile's report (the first bucket's, with the others under "buckets")
    layout: str  # the layout the compile asked for, where the report names none
    io_structure: dict | None = None  # sequence/optional inputs and outputs (frontends/sequence_io.py)
    index_ranges: dict | None = None  # integer inputs that index a table: their range (frontends/index_ranges.py)


def manifest(parts: ManifestParts) -> dict:
    """The manifest of an artifact (kiln/runtime/artifact.py adds its format version and members)."""
    import tvm

    from .. import __version__

    o, report, buckets = parts.options, parts.report, [b.to_json() for b in parts.buckets]
    return {
        "kiln_version": __version__,
        "tvm_version": tvm.__version__,
        "target": str(o.target),
        "target_dict": o.target.to_dict(),
        "arch": o.target.arch,
        "device": parts.section.device,
        "cpu_features": parts.section.cpu_features,
        "inputs": buckets[0]["inputs"],
        "outputs": buckets[0]["outputs"],
        "weights": parts.weights_index,
        "buckets": buckets,
        "bucket_policy": o.bucket_policy,
        "pad_values": dict(o.pad_values),
        "entry": "main",
        "compile_options": dict(o.to_json(), layout_chosen=report.get("layout", parts.layout)),
        "passes_skipped": report.get("passes_skipped", []),
        "source": parts.source,
        "import_stats": parts.import_stats,
        "kernels": report["kernels"],
        "quantization": quant_summary(report.get("quantization")),
        "accelerator": parts.section.accelerator,
        "created_unix": int(time.time()),
        **({"io_structure": parts.io_structure} if parts.io_structure else {}),
        **({"index_ranges": parts.index_ranges} if parts.index_ranges else {}),
    }


def source_entry(where: str, opsets: dict, frontend: dict) -> dict:
    """The manifest's `source`: the file's name, its opsets, and what wrote and read it."""
    return {"file": Path(where).name, "opsets": opsets, **frontend}


def quant_summary(q: dict | None) -> dict | None:
    """What the manifest says of a quantized compile (the report has the full accuracy check)."""
    if q is None:
        return None
    acc = q["accuracy"]
    return {
        "mode": q["mode"],
        "calib_method": q["calib_method"],
        "calib_samples": q["calib_samples"],
        "calibration_sha256": q["calibration_sha256"],
        "int8_layers": len(q["int8_layers"]),
        "float_layers": q["float_layers"],
        "accuracy": {"samples": acc["samples"], "held_out": acc["held_out"], "outputs": acc["outputs"]},
    }


class WeightPool:
    """Weights of all buckets, each distinct array stored once (buckets of one model share them)."""

    def __init__(self):
        self.arrays, self._index = [], {}

    def add_all(self, arrays) -> list[int]:
        import hashlib

        import numpy as np

        ids = []
        for a in arrays:
            a = np.ascontiguousarray(a)
            key = (str(a.dtype), a.shape, hashlib.sha256(a.tobytes()).digest())
            if key not in self._index:
                self._index[key] = len(self.arrays)
                self.arrays.append(a)
            ids.append(self._index[key])
        return ids
