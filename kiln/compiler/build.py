"""ONNX model -> one .kiln artifact: import, run the pipeline, lift the weights, build with TVM,
export the library, write the artifact atomically with its manifest."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

import onnx

from .. import __version__
from ..errors import CompileError, KilnError
from ..frontends.importer import import_onnx
from ..runtime import artifact as art
from ..runtime.hostinfo import host_arch
from .options import CompileOptions
from .passes import LiftWeights
from .pipeline import pipeline_for

CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-g++"}


@dataclasses.dataclass
class CompileResult:
    path: Path
    manifest: dict
    pass_seconds: dict[str, float]


def compile_model(model: str | os.PathLike | onnx.ModelProto, output: str | os.PathLike,
                  options: CompileOptions | None = None, **kwargs) -> CompileResult:
    """Compile an ONNX model (path or proto) into the artifact `output`. kwargs build the options
    (target=, input_shapes=, opt_level=, disabled_passes=) when `options` is not given."""
    import tvm

    options = options or CompileOptions.make(**kwargs)
    where = "<model>" if isinstance(model, onnx.ModelProto) else str(model)
    t0 = time.perf_counter()
    imported = import_onnx(model, options.shapes)
    timings = {"import": time.perf_counter() - t0}
    target = options.target.tvm()
    specs = pipeline_for(options.target.kind, options.opt_level, options.disabled_passes)
    mod = imported.mod
    lift = LiftWeights()
    try:
        with target, tvm.transform.PassContext(opt_level=3):
            for spec in specs:
                t = time.perf_counter()
                mod = spec.make()(mod)
                timings[spec.name] = time.perf_counter() - t
            mod = lift(mod)
            t = time.perf_counter()
            exe = tvm.compile(mod, target=target)
            timings["tvm.compile"] = time.perf_counter() - t
        library = _export(exe, options.target.arch, where)
    except KilnError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(f"TVM failed to build the model: {type(e).__name__}: {msg[-1] if msg else ''}", where=where,
                           fix="rerun with --debug for the full trace") from None
    weights_blob, weights_index = art.pack_weights(lift.weights)
    manifest = {
        "kiln_version": __version__,
        "tvm_version": tvm.__version__,
        "target": str(options.target),
        "target_dict": options.target.to_dict(),
        "arch": options.target.arch,
        "cpu_features": options.target.required_features(),
        "inputs": [s.to_json() for s in imported.inputs],
        "outputs": [s.to_json() for s in imported.outputs],
        "weights": weights_index,
        "entry": "main",
        "compile_options": options.to_json(),
        "source": {"file": Path(where).name, "opsets": imported.opsets},
        "import_stats": imported.stats,
        "created_unix": int(time.time()),
    }
    art.write_artifact(output, manifest, {art.LIBRARY: library, art.WEIGHTS: weights_blob})
    timings["total"] = time.perf_counter() - t0
    return CompileResult(Path(output), manifest, timings)


def _export(exe, arch: str, where: str) -> bytes:
    kwargs = {}
    if arch != host_arch():
        cc = CROSS_COMPILERS.get(arch)
        if cc is None or shutil.which(cc) is None:
            raise CompileError(f"cross-compiling for {arch} needs the linker {cc or '?'}, which is not installed", where=where,
                               fix="apt-get install g++-aarch64-linux-gnu (or compile on the target machine)")
        from tvm.support import cc as tvm_cc
        kwargs["fcompile"] = tvm_cc.cross_compiler(cc)
    with tempfile.TemporaryDirectory(prefix="kiln-build-") as tmp:
        lib = Path(tmp) / art.LIBRARY
        exe.export_library(str(lib), **kwargs)
        return lib.read_bytes()
