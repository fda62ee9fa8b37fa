"""TFLite in: a .tflite flatbuffer -> Relax through TVM 0.27's `from_tflite`, wrapped like the ONNX
importer. The flatbuffer is walked and bounds-checked before TVM reads it (a damaged file is a
ModelLoadError, not an IndexError deep in a converter), every unsupported builtin is listed at once,
dynamic dims (shape_signature -1) are pinned with --input-shape or buckets, and input/output names
come from the model's SignatureDef where it has one. Convolutions are put in NCHW and quantized
weights' dequantize moved next to their constants (tflite_layout.py), so the same passes run as for
ONNX: a full-integer model's convs and matmuls go to Kiln's int8 kernels through LowerQDQ. The
`tflite` package is an optional extra (`pip install 'kiln[tflite]'`)."""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import numpy as np

from ..errors import MissingExtraError, ModelLoadError, ShapeError, UnsupportedModelError, pass_errors
from ..runtime.artifact import TensorSpec
from .shapes import FLAG, parse_input_shapes

INSTALL = "pip install 'kiln[tflite]'"
FIX = "check that the file is a complete .tflite model (re-convert it, or re-download it)"
DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16", 9: "int8",
          10: "float64", 12: "uint64", 15: "uint32", 16: "uint16"}  # fmt: skip
ITEMSIZE = {k: np.dtype(v).itemsize for k, v in DTYPES.items()}


def require_tflite(where: str):
    try:
        import tflite
    except ImportError:
        raise MissingExtraError(
            "reading a TFLite model needs the tflite package, which is not installed", where=where, fix=INSTALL
        ) from None
    return tflite


def load_tflite(path: str | os.PathLike):
    """The checked tflite.Model of a .tflite file (ModelLoadError when it is not one)."""
    where = str(path)
    tflite = require_tflite(where)
    buf = Path(path).read_bytes()
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise ModelLoadError("not a TFLite flatbuffer (no TFL3 file identifier at bytes 4-8)", where=where, fix=FIX)
    try:
        model = tflite.Model.GetRootAsModel(buf, 0)
        _verify(model, len(buf), where)
        framework(model)  # the description and metadata the manifest records are read here too
    except (ModelLoadError, UnsupportedModelError):
        raise
    except Exception as e:  # offsets past the end, bad UTF-8, wrong vtables: a truncated or damaged file
        raise ModelLoadError(
            f"not a readable TFLite model ({type(e).__name__}: {str(e)[:160]})", where=where, fix=FIX
        ) from None
    return model


def _verify(model, size: int, where: str) -> None:
    """Every vector, index and constant the importer will read lies inside the file and agrees with
    its tensor's shape and type: the flatbuffer reader itself checks nothing."""

    def bad(what: str):
        raise ModelLoadError(f"damaged TFLite model: {what}", where=where, fix=FIX)

    def length(n: int, what: str) -> int:
        if n < 0 or n * 4 > size:
            bad(f"{what} claims {n} entries in a {size}-byte file")
        return n

    if length(model.SubgraphsLength(), "subgraphs") < 1:
        bad("no subgraph")
    nbuf, ncodes = length(model.BuffersLength(), "buffers"), length(model.OperatorCodesLength(), "operator codes")
    for i in range(nbuf):
        b = model.Buffers(i)
        length(b.DataLength() // 4, f"buffer {i}")
        if b.Offset() > 1:
            raise UnsupportedModelError(
                f"buffer {i} lies outside the flatbuffer (a model over 2 GB)",
                where=where,
                fix="TVM's TFLite importer reads weights inside the flatbuffer only: convert without external buffers",
            )
    for s in range(model.SubgraphsLength()):
        g = model.Subgraphs(s)
        nt = length(g.TensorsLength(), f"subgraph {s} tensors")
        for i in range(nt):
            t = g.Tensors(i)
            shape = [int(d) for d in t.ShapeAsNumpy()] if length(t.ShapeLength(), f"tensor {i} shape") else []
            if t.Buffer() >= nbuf or t.Buffer() < 0 or t.Type() not in DTYPES and t.Type() not in (5, 8, 11, 13, 14):
                bad(f"tensor {i} names buffer {t.Buffer()} of {nbuf} or an unknown type {t.Type()}")
            t.Name().decode()
            data = model.Buffers(t.Buffer()).DataLength() if t.Buffer() > 0 else 0
            if data and t.Type() in ITEMSIZE and t.Sparsity() is None:
                if any(d < 0 for d in shape) or int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[t.Type()] != data:
                    bad(f"constant tensor {t.Name().decode()!r} of shape {shape} holds {data} bytes")
        for k in range(length(g.OperatorsLength(), f"subgraph {s} operators")):
            op = g.Operators(k)
            if not 0 <= op.OpcodeIndex() < ncodes:
                bad(f"operator {k} names operator code {op.OpcodeIndex()} of {ncodes}")
            ins = op.InputsAsNumpy() if length(op.InputsLength(), "operator inputs") else []
            outs = op.OutputsAsNumpy() if length(op.OutputsLength(), "operator outputs") else []
            if any(not -1 <= int(j) < nt for j in ins) or any(not 0 <= int(j) < nt for j in outs):
                bad(f"operator {k} reads or writes a tensor outside the {nt} of subgraph {s}")
        for j in list(g.InputsAsNumpy() if g.InputsLength() else []) + list(
            g.OutputsAsNumpy() if length(g.OutputsLength(), "outputs") else []
        ):
            if not 0 <= int(j) < nt:
                bad(f"subgraph {s} input/output {j} is not one of its {nt} tensors")


def framework(model) -> dict:
    import importlib.metadata

    meta = _metadata(model)
    return {
        "name": "tflite",
        "version": meta.get("min_runtime_version") or None,  # the LiteRT version the converter asks for
        "schema_version": int(model.Version()),
        "description": (model.Description() or b"").decode(errors="replace") or None,
        "reader": f"tflite {importlib.metadata.version('tflite')}",
    }


def _metadata(model) -> dict:
    out = {}
    for i in range(model.MetadataLength()):
        m = model.Metadata(i)
        name = (m.Name() or b"").decode(errors="replace")
        if name == "min_runtime_version" and 0 < m.Buffer() < model.BuffersLength():
            out[name] = bytes(model.Buffers(m.Buffer()).DataAsNumpy()).split(b"\0")[0].decode(errors="replace")
    return out


@functools.cache
def _builtin_names() -> dict[int, str]:
    from tflite.BuiltinOperator import BuiltinOperator

    return {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}


def op_name(model, op) -> str:
    code = model.OperatorCodes(op.OpcodeIndex())
    name = _builtin_names().get(max(code.DeprecatedBuiltinCode(), code.BuiltinCode()), f"BUILTIN_{code.BuiltinCode()}")
    if name == "CUSTOM":
        custom = (code.CustomCode() or b"").decode(errors="replace")
        return "DETECTION_POSTPROCESS" if custom == "TFLite_Detection_PostProcess" else f"CUSTOM:{custom}"
    return name


def _converter_tables(model):
    from .tflite_ops import KilnOperatorConverter

    conv = KilnOperatorConverter(model, model.Subgraphs(0), None, None)
    return frozenset(conv.convert_map), KilnOperatorConverter._SUPPORTED_QUANTIZED_OPS


def _ops(model):
    for s in range(model.SubgraphsLength()):
        g = model.Subgraphs(s)
        for k in range(g.OperatorsLength()):
            yield g, g.Operators(k)


def op_histogram(model) -> dict[str, int]:
    hist: dict[str, int] = {}
    for _, op in _ops(model):
        hist[op_name(model, op)] = hist.get(op_name(model, op), 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def find_unsupported_ops(model) -> list[dict]:
    """Builtins TVM has no converter for, quantized ops it cannot take quantized, and hybrid
    (dynamic-range) ops with int8 weights but float activations: each once, with count and first op."""
    converted, quantized = _converter_tables(model)
    found: dict[tuple, dict] = {}
    for g, op in _ops(model):
        name = op_name(model, op)
        q = [_quantized(g, int(j)) for j in op.InputsAsNumpy()] if op.InputsLength() else []
        out_q = any(_quantized(g, int(j)) for j in op.OutputsAsNumpy()) if op.OutputsLength() else False
        why = None
        if name not in converted:
            why = "no converter"
        elif (q[:1] == [False] or not q) and not out_q and any(q[1:]):
            why = "dynamic-range quantized (float activations, int8 weights)"
        elif (any(q) or out_q) and name not in quantized:
            why = "quantized, TVM converts it in float only"
        if why:
            first = g.Tensors(int(op.OutputsAsNumpy()[0])).Name().decode() if op.OutputsLength() else "?"
            e = found.setdefault((name, why), {"domain": "tflite", "op_type": name, "opset": None, "count": 0,
                                               "first_node": first, "reason": why})  # fmt: skip
            e["count"] += 1
    return sorted(found.values(), key=lambda b: b["op_type"])


def _quantized(g, j: int) -> bool:
    if j < 0:
        return False
    q = g.Tensors(j).Quantization()
    return q is not None and q.ScaleLength() > 0


def check_supported(model, where: str) -> None:
    bad = find_unsupported_ops(model)
    if bad:
        listing = "; ".join(f"{b['op_type']} ({b['reason']}, {b['count']}x, first {b['first_node']!r})" for b in bad)
        fix = "convert without these ops (TFLiteConverter target_spec.supported_ops), or export to ONNX"
        if any(b["reason"].startswith("dynamic-range") for b in bad):
            fix = "use full-integer quantization (a representative dataset) or the float model; " + fix
        raise UnsupportedModelError(f"{len(bad)} unsupported op type(s): {listing}", ops=bad, where=where, fix=fix)


def signature(model) -> tuple[list[tuple[str, int, list[int], str]], list[tuple[str, int]]]:
    """([(name, tensor index, shape signature, dtype)], [(name, tensor index)]) of subgraph 0, named by its
    SignatureDef where there is one (tensor names are converter-made, e.g. serving_default_x:0)."""
    g = model.Subgraphs(0)
    names = {}
    for i in range(model.SignatureDefsLength()):
        sd = model.SignatureDefs(i)
        if sd.SubgraphIndex() == 0:
            for k in range(sd.InputsLength()):
                names[("in", sd.Inputs(k).TensorIndex())] = sd.Inputs(k).Name().decode()
            for k in range(sd.OutputsLength()):
                names[("out", sd.Outputs(k).TensorIndex())] = sd.Outputs(k).Name().decode()
            break
    inputs, outputs = [], []
    for j in g.InputsAsNumpy() if g.InputsLength() else []:
        t = g.Tensors(int(j))
        sig = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else t.ShapeAsNumpy() if t.ShapeLength() else []
        dtype = DTYPES.get(t.Type())
        if dtype is None:
            raise UnsupportedModelError(
                f"input {t.Name().decode()!r} has TFLite type {t.Type()}",
                where="<signature>",
                fix="inputs must be numeric",
            )
        inputs.append((names.get(("in", int(j)), t.Name().decode()), int(j), [int(d) for d in sig], dtype))
    for j in g.OutputsAsNumpy() if g.OutputsLength() else []:
        outputs.append((names.get(("out", int(j)), g.Tensors(int(j)).Name().decode()), int(j)))
    return inputs, outputs


def pin(inputs, shapes: dict, where: str) -> dict[str, tuple[int, ...]]:
    """Static shapes of every input: the model's own, or the pinned ones for its -1 dims."""
    names = [n for n, *_ in inputs]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise ShapeError(f"{FLAG} names unknown input(s) {unknown}", where=where, fix=f"the model's inputs are {names}")
    out, unpinned = {}, []
    for name, _, sig, _ in inputs:
        if name in shapes:
            dims = shapes[name]
            if len(dims) != len(sig) or any(d >= 0 and d != p for d, p in zip(sig, dims)):
                ex = "x".join(str(d if d >= 0 else 1) for d in sig)
                raise ShapeError(
                    f"input {name!r} is {'x'.join(map(str, sig))} in the model (-1: dynamic), but {FLAG} gives "
                    f"{'x'.join(map(str, dims))}",
                    where=where,
                    fix=f"keep the rank and the static dims, e.g. {FLAG} {name}:{ex}",
                )
            out[name] = tuple(dims)
        elif any(d < 0 for d in sig):
            unpinned.append((name, sig))
        else:
            out[name] = tuple(sig)
    if unpinned:
        raise ShapeError(
            "dynamic input dimensions must be pinned: "
            + "; ".join(f"input {n!r}: {'x'.join(map(str, s))}" for n, s in unpinned),
            where=where,
            fix="pin them, e.g. "
            + " ".join(f"{FLAG} {n}:{'x'.join(str(d if d >= 0 else 1) for d in s)}" for n, s in unpinned),
        )
    return out


def import_tflite(model, shapes=None, where: str = "<tflite>"):
    """A checked tflite.Model -> ImportedModel (static shapes, weights as constants, NCHW convs)."""
    from tvm import relax
    from tvm.relax.frontend.tflite import from_tflite

    from .importer import ImportedModel, output_specs
    from .tflite_layout import normalize
    from .tflite_ops import KilnOperatorConverter

    check_supported(model, where)
    inputs, outputs = signature(model)
    static = pin(inputs, parse_input_shapes(shapes), where)
    g = model.Subgraphs(0)
    tname = {n: g.Tensors(j).Name().decode() for n, j, _, _ in inputs}
    with pass_errors("TVM's TFLite importer", where), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = from_tflite(
            model,
            shape_dict={tname[n]: list(s) for n, s in static.items()},
            dtype_dict={tname[n]: dt for n, _, _, dt in inputs},
            op_converter=KilnOperatorConverter,
        )
        func = mod["main"]
        nin = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs else len(func.params)
        values = list(func.attrs["params"]) if func.attrs and "params" in func.attrs else []
        extra = func.params[nin:]
        func = func.without_attr("params").without_attr("num_input")
        mod["main"] = func
        if extra:
            mod = relax.transform.BindParams("main", dict(zip(extra, values[-len(extra) :])))(mod)
    with pass_errors("Kiln's TFLite layout normalization", where):
        mod, stats = normalize(mod)
    specs = [TensorSpec(n, static[n], dt) for n, _, _, dt in inputs]
    stats["tflite_ops"] = sum(op_histogram(model).values())
    return ImportedModel(mod, specs, output_specs(mod, [n for n, _ in outputs], where), {}, stats, None)


def describe(model, path: str) -> dict:
    inputs, outputs = signature(model)
    g = model.Subgraphs(0)

    def out_info(name, j):
        t = g.Tensors(j)
        sig = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else t.ShapeAsNumpy() if t.ShapeLength() else []
        return {"name": name, "shape": [int(d) if d >= 0 else None for d in sig], "dtype": DTYPES.get(t.Type(), "?")}

    fw = framework(model)
    return {
        "kind": "tflite",
        "path": path,
        "producer": fw["description"] or "",
        "opsets": {"tflite_schema": fw["schema_version"], "min_runtime": fw["version"]},
        "inputs": [{"name": n, "shape": [d if d >= 0 else None for d in s], "dtype": dt} for n, _, s, dt in inputs],
        "outputs": [out_info(n, j) for n, j in outputs],
        "nodes": sum(op_histogram(model).values()),
        "op_histogram": op_histogram(model),
        "initializers": sum(1 for i in range(g.TensorsLength()) if g.Tensors(i).Buffer() > 0),
        "unsupported_ops": find_unsupported_ops(model),
    }
