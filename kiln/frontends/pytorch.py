"""PyTorch in: a torch.export program (a .pt2 from torch.export.save, an ExportedProgram, or an
nn.Module exported here) -> Relax through TVM 0.27's own `from_exported_program`, wrapped like the
ONNX importer: read with typed errors, every unsupported ATen op listed at once, symbolic dims
pinned (--input-shape, or one bucket each) and input/output names taken from the program's
signature. torch is an optional extra (`pip install 'kiln[torch]'`); the runtime never needs it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import warnings
import zipfile
from pathlib import Path

from ..errors import MissingExtraError, ModelLoadError, ShapeError, UnsupportedModelError, pass_errors
from ..runtime.artifact import TensorSpec
from .shapes import FLAG, parse_input_shapes

INSTALL = "pip install 'kiln[torch]' (the CPU build is enough)"
FIX = "re-save it with torch.export.save(torch.export.export(model, args), 'model.pt2')"


def require_torch(where: str):
    """The torch module, or MissingExtraError naming the pip command."""
    try:
        import torch
    except ImportError:
        raise MissingExtraError(
            "reading a PyTorch program needs torch, which is not installed", where=where, fix=INSTALL
        ) from None
    return torch


def framework(ep=None, saved_by: str | None = None) -> dict:
    torch = require_torch("<torch>")
    return {"name": "torch", "version": torch.__version__, "saved_by": saved_by or torch.__version__}


def load_pt2(path: str | os.PathLike):
    """(ExportedProgram, torch version that saved it) for a torch.export.save archive; ModelLoadError
    for a damaged archive or one this torch cannot read (another serialization schema)."""
    where = str(path)
    torch = require_torch(where)
    saved_by, schema = _archive_versions(Path(path))
    from torch._export.serde.schema import SCHEMA_VERSION

    if schema is not None and schema[0] != SCHEMA_VERSION[0]:
        raise ModelLoadError(
            f"saved by torch {saved_by or '?'} with export schema {schema[0]}.{schema[1]}; torch "
            f"{torch.__version__} reads schema {SCHEMA_VERSION[0]}.x",
            where=where,
            fix=f"load it with torch {saved_by or 'of the same version'}, or re-export it with this torch "
            f"({torch.__version__})",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.load(where)
    except MemoryError:
        raise ModelLoadError("the program claims more memory than there is", where=where, fix=FIX) from None
    except Exception as e:  # zip, JSON, pickle and schema errors of a damaged or foreign archive
        msg = str(e).strip().splitlines()
        raise ModelLoadError(
            f"not a readable torch.export program ({type(e).__name__}: {msg[0][:200] if msg else ''})",
            where=where,
            fix=FIX,
        ) from None
    if not isinstance(ep, torch.export.ExportedProgram):
        raise ModelLoadError("the archive does not hold an ExportedProgram", where=where, fix=FIX)
    return ep, saved_by


def _archive_versions(path: Path) -> tuple[str | None, tuple[int, int] | None]:
    """The saving torch's version and export schema, read from models/*.json before torch parses it."""
    try:
        with zipfile.ZipFile(path) as z:
            name = next((n for n in z.namelist() if n.endswith("/models/model.json")), None)
            if name is None or z.getinfo(name).file_size > 1 << 28:
                return None, None
            doc = json.loads(z.read(name))
        sv = doc.get("schema_version") or {}
        return str(doc.get("torch_version") or "") or None, (int(sv["major"]), int(sv["minor"]))
    except Exception:  # a damaged archive: torch.export.load reports it
        return None, None


def export_module(module, example_inputs, dynamic_shapes=None, where: str = "<torch.nn.Module>"):
    """torch.export.export of an nn.Module on its example inputs; a failed trace is the model's
    problem (data-dependent control flow, unsupported Python), reported as UnsupportedModelError."""
    torch = require_torch(where)
    if getattr(module, "training", False):
        warnings.warn(f"{where}: the module is in training mode; call .eval() for inference", stacklevel=3)
    args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    try:
        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise UnsupportedModelError(
            f"torch.export could not trace the module ({type(e).__name__}: {msg[0][:300] if msg else ''})",
            where=where,
            fix="make the module traceable by torch.export (see torch.export's error above), or export it yourself",
        ) from None


@functools.cache
def _converted() -> frozenset[str]:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    return frozenset(ExportedProgramImporter().convert_map)


def decompose(ep, where: str):
    """The core-ATen program TVM's importer converts (torch's own decompositions), computed once."""
    with pass_errors("torch.export decompositions", where), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ep.run_decompositions()


def op_histogram(ep) -> dict[str, int]:
    hist: dict[str, int] = {}
    for n in ep.graph.nodes:
        if n.op == "call_function":
            hist[_op_name(n)] = hist.get(_op_name(n), 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


def _op_name(node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def find_unsupported_ops(ep) -> list[dict]:
    """Every call TVM's importer has no converter for, once per op with its count and first node."""
    found: dict[str, dict] = {}
    for n in ep.graph.nodes:
        if n.op != "call_function" or _op_name(n) in _converted():
            continue
        e = found.setdefault(
            _op_name(n), {"domain": "aten", "op_type": _op_name(n), "opset": None, "count": 0, "first_node": n.name}
        )
        e["count"] += 1
    return sorted(found.values(), key=lambda b: b["op_type"])


def check_supported(ep, where: str) -> None:
    bad = find_unsupported_ops(ep)
    if bad:
        listing = "; ".join(f"aten::{b['op_type']} ({b['count']}x, first node {b['first_node']!r})" for b in bad)
        raise UnsupportedModelError(
            f"{len(bad)} unsupported op type(s): {listing}",
            ops=bad,
            where=where,
            fix="replace these ops in the module before export, or export to ONNX and compile that",
        )


def signature(ep) -> tuple[list[tuple[str, tuple, str]], list[str]]:
    """([(name, dims (int or sympy expr), dtype)] of the user inputs, [user output names])."""
    sig = ep.graph_signature
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = []
    for name in sig.user_inputs:
        val = nodes[name].meta.get("val") if name in nodes else None
        if val is None or not hasattr(val, "shape"):
            raise UnsupportedModelError(
                f"input {name!r} is not a tensor", where="<signature>", fix="a compiled model takes tensors only"
            )
        dims = tuple(int(d) if _static(d) else d.node.expr for d in val.shape)
        inputs.append((name, dims, str(val.dtype).replace("torch.", "")))
    return inputs, [str(o) for o in sig.user_outputs]


def _static(d) -> bool:
    return isinstance(d, int) or (hasattr(d, "node") and d.node.expr.is_number)


def pin_symbols(ep, inputs, shapes: dict, where: str) -> tuple[dict[str, int], dict[str, tuple]]:
    """{symbol: value} from the pinned input shapes, checked against the program's static dims and
    its range constraints; ShapeError (naming every unpinned input) as for ONNX."""
    names = [n for n, _, _ in inputs]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise ShapeError(
            f"{FLAG} names unknown input(s) {unknown}", where=where, fix=f"the program's inputs are {names}"
        )
    ranges = {str(k): v for k, v in ep.range_constraints.items()}
    bound, static, unpinned = {}, {}, []
    for name, decl, _ in inputs:
        if name not in shapes:
            if any(not isinstance(d, int) for d in decl):
                unpinned.append((name, decl))
            static[name] = decl
            continue
        dims = shapes[name]
        if len(dims) != len(decl):
            raise ShapeError(
                f"input {name!r} has rank {len(decl)} ({_fmt(decl)}), but {FLAG} gives rank {len(dims)}",
                where=where,
                fix=f"give {len(decl)} dims, e.g. {FLAG} {name}:{_example(decl)}",
            )
        for i, (d, p) in enumerate(zip(decl, dims)):
            if isinstance(d, int) and d != p:
                raise ShapeError(
                    f"input {name!r} dim {i} is fixed at {d} in the program, but {FLAG} gives {p}",
                    where=where,
                    fix=f"keep the program's static dims, e.g. {FLAG} {name}:{_example(decl, dims)}",
                )
            if not isinstance(d, int) and d.is_Symbol:
                if bound.setdefault(str(d), p) != p:
                    raise ShapeError(
                        f"input {name!r} dim {i} is the program's symbol {d}, already pinned to {bound[str(d)]}",
                        where=where,
                        fix=f"inputs that share the dim {d} (torch.export.Dim) take the same size",
                    )
                _check_range(ranges.get(str(d)), d, p, name, i, where)
        static[name] = tuple(dims)
    if unpinned:
        lines = "; ".join(f"input {n!r}: dims {_fmt(d)}" for n, d in unpinned)
        flags = " ".join(f"{FLAG} {n}:{_example(d)}" for n, d in unpinned)
        raise ShapeError(
            f"dynamic input dimensions must be pinned: {lines}",
            where=where,
            fix=f"pin them, e.g. {flags} (replace the 1s with your sizes), or give --shape-buckets",
        )
    for name, decl, _ in inputs:  # derived dims (2*s0, s0+1) must agree with the symbols just bound
        for i, (d, p) in enumerate(zip(decl, static[name])):
            if (
                not isinstance(d, int)
                and not d.is_Symbol
                and d.free_symbols <= {s for s in d.free_symbols if str(s) in bound}
            ):
                want = int(d.subs({s: bound[str(s)] for s in d.free_symbols}))
                if want != p:
                    raise ShapeError(
                        f"input {name!r} dim {i} is {d} = {want} in the program, but {FLAG} gives {p}",
                        where=where,
                        fix=f"give dim {i} of {name!r} as {want}",
                    )
    return bound, static


def _check_range(vr, sym, value: int, name: str, i: int, where: str) -> None:
    if vr is None:
        return
    lo, hi = int(vr.lower), vr.upper
    hi = None if not hi.is_finite else int(hi)
    if value < lo or (hi is not None and value > hi):
        raise ShapeError(
            f"input {name!r} dim {i} ({sym}) is {value}, outside the range [{lo}, {hi if hi is not None else 'inf'}] "
            "the program was exported for",
            where=where,
            fix="pin a size inside the torch.export.Dim's min/max, or re-export with a wider Dim",
        )


def _fmt(dims) -> str:
    return "x".join(str(d) for d in dims)


def _example(decl, given=None) -> str:
    if given is not None:
        return "x".join(str(d if isinstance(d, int) else g) for d, g in zip(decl, given))
    return "x".join(str(d) if isinstance(d, int) else "1" for d in decl)


def import_program(ep, shapes=None, where: str = "<torch.export program>", decomposed=None):
    """An ExportedProgram -> ImportedModel (static shapes, weights as constants). decomposed: the
    program's run_decompositions() when the caller has it already (one per bucket is slow)."""
    from tvm import relax

    from .importer import ImportedModel, output_specs

    decomposed = decomposed if decomposed is not None else decompose(ep, where)
    check_supported(decomposed, where)
    inputs, outputs = signature(decomposed)
    outputs = [str(o) for o in ep.graph_signature.user_outputs] or outputs  # the names the user's program had
    bound, static = pin_symbols(decomposed, inputs, parse_input_shapes(shapes), where)
    from tvm.relax.frontend.torch import from_exported_program

    with pass_errors("TVM's PyTorch importer", where), _quiet():
        mod = from_exported_program(decomposed, run_ep_decomposition=False, unwrap_unit_return_tuple=True)
        if bound:
            mod = relax.transform.BindSymbolicVars(bound, "main")(mod)
        main = mod["main"].without_attr("tir_var_lower_bound").without_attr("tir_var_upper_bound")
        mod["main"] = main
        mod = relax.transform.Normalize()(mod)
    specs = [TensorSpec(n, tuple(int(d) for d in static[n]), dt) for n, _, dt in inputs]
    stats = {"aten_ops": sum(op_histogram(decomposed).values())}
    return ImportedModel(mod, specs, output_specs(mod, outputs, where), {}, stats, None)


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def describe(ep, path: str, saved_by: str | None) -> dict:
    """What `kiln inspect` prints for a .pt2 (the same keys as for ONNX)."""
    dec = decompose(ep, path)
    inputs, outputs = signature(dec)
    out_nodes = {}
    for n in dec.graph.nodes:
        if n.op == "output":
            for a in n.args[0]:
                if hasattr(a, "meta") and hasattr(a.meta.get("val"), "shape"):
                    out_nodes[a.name] = a.meta["val"]
    io = lambda name, dims, dt: {
        "name": name,
        "shape": [d if isinstance(d, int) else str(d) for d in dims],
        "dtype": dt,
    }
    return {
        "kind": "pt2",
        "path": path,
        "producer": f"torch {saved_by or '?'}",
        "opsets": {"torch": framework(saved_by=saved_by)["version"]},
        "inputs": [io(*i) for i in inputs],
        "outputs": [
            io(o, tuple(int(d) if _static(d) else d.node.expr for d in v.shape), str(v.dtype).replace("torch.", ""))
            for o, v in ((o, out_nodes.get(o)) for o in outputs)
            if v is not None
        ],
        "nodes": sum(op_histogram(dec).values()),
        "op_histogram": op_histogram(dec),
        "initializers": len(dec.state_dict) + len(dec.constants),
        "unsupported_ops": find_unsupported_ops(dec),
    }
