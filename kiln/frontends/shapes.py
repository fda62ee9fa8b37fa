"""Input shapes: parse `NAME:1x3x224x224` once into InputShape, pin them into the graph, and make
sure no input dimension is left symbolic."""

from __future__ import annotations

import dataclasses

import onnx

from ..errors import ShapeError

FLAG = "--input-shape"


@dataclasses.dataclass(frozen=True)
class InputShape:
    name: str
    dims: tuple[int, ...]

    @staticmethod
    def parse(spec: str) -> InputShape:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise ShapeError(
                f"bad input shape {spec!r}", where=FLAG, fix=f"write it as NAME:DIMS, e.g. {FLAG} input:1x3x224x224"
            )
        if dims.strip().lower() == "none" or dims.strip().startswith("["):  # a sequence or an absent optional
            from .sequence_io import parse_spec

            return InputShape(name, parse_spec(dims, spec))
        try:
            parsed = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            raise ShapeError(
                f"bad dimensions {dims!r} in {spec!r}",
                where=FLAG,
                fix=f"dims are positive integers joined by 'x', e.g. {FLAG} {name}:1x3x224x224",
            ) from None
        if any(d < 1 for d in parsed):
            raise ShapeError(
                f"dimensions must be positive in {spec!r}", where=FLAG, fix=f"e.g. {FLAG} {name}:1x3x224x224"
            )
        return InputShape(name, parsed)

    def __str__(self) -> str:
        from .sequence_io import SeqShape

        if self.dims is None:
            return f"{self.name}:none"
        if isinstance(self.dims, SeqShape):
            return f"{self.name}:[{','.join('x'.join(map(str, d)) or '()' for d in self.dims)}]"
        return f"{self.name}:{'x'.join(map(str, self.dims))}"


def parse_input_shapes(specs) -> dict[str, tuple[int, ...]]:
    """Accepts ["a:1x3", ...], {"a": (1, 3)} or InputShape objects; returns {name: dims}."""
    if not specs:
        return {}
    if isinstance(specs, dict):
        from .sequence_io import parse_dims

        return {k: parse_dims(v) for k, v in specs.items()}
    out = {}
    for s in specs:
        s = s if isinstance(s, InputShape) else InputShape.parse(s)
        if s.name in out:
            raise ShapeError(f"input {s.name!r} is given two shapes", where=FLAG, fix=f"pass {FLAG} once per input")
        out[s.name] = s.dims
    return out


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs: graph inputs that are not initializers."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def declared_dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    if not vi.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def pin_input_shapes(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], where: str, flags: dict[str, str] | None = None
) -> dict[str, tuple[int, ...]]:
    """Write the pinned shapes into the graph's inputs (in place); return every input's static shape.
    flags: the option that gave each input's shape, for the messages (default --input-shape)."""
    flags = flags or {}
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    unknown = [n for n in shapes if n not in names]
    if unknown:
        flag = flags.get(unknown[0], FLAG)
        raise ShapeError(f"{flag} names unknown input(s) {unknown}", where=where, fix=f"the model's inputs are {names}")
    result, unpinned = {}, []
    for vi in inputs:
        decl = declared_dims(vi)
        if vi.name in shapes:
            dims, flag = shapes[vi.name], flags.get(vi.name, FLAG)
            if decl is not None:
                if len(dims) != len(decl):
                    raise ShapeError(
                        f"input {vi.name!r} has rank {len(decl)} ({_fmt(decl)}), but {flag} gives rank {len(dims)} "
                        f"({_fmt(dims)})",
                        where=where,
                        fix=f"give {len(decl)} dims, e.g. {flag} {vi.name}:{_example(decl)}",
                    )
                bad = [
                    (i, d, p) for i, (d, p) in enumerate(zip(decl, dims)) if isinstance(d, int) and d >= 0 and d != p
                ]
                if bad:
                    i, d, p = bad[0]
                    raise ShapeError(
                        f"input {vi.name!r} dim {i} is fixed at {d} in the model, but {flag} gives {p}",
                        where=where,
                        fix=_fixed_dim_fix(vi.name, decl, dims, flag),
                    )
            _write_dims(vi, dims)
            result[vi.name] = tuple(dims)
            continue
        if decl is None:
            unpinned.append((vi.name, "shape not declared", "?"))
            continue
        sym = [
            (i, d) for i, d in enumerate(decl) if not (isinstance(d, int) and d >= 0)
        ]  # 0: an empty axis, as onnxruntime reads it
        if sym:
            unpinned.append((vi.name, ", ".join(f"dim {i} ({d or '?'})" for i, d in sym), _example(decl)))
        else:
            result[vi.name] = tuple(decl)
    if unpinned:
        lines = "; ".join(f"input {n!r}: {what}" for n, what, _ in unpinned)
        hint = " ".join(f"{FLAG} {n}:{ex}" for n, _, ex in unpinned)
        raise ShapeError(
            f"dynamic input dimensions must be pinned: {lines}",
            where=where,
            fix=f"pin them, e.g. {hint} (replace the 1s and ?s with your sizes)",
        )
    return result


def _fixed_dim_fix(name: str, decl, dims, flag: str) -> str:
    open_dims = [i for i, d in enumerate(decl) if not (isinstance(d, int) and d >= 0)]
    if flag == BUCKETS_FLAG:
        export = "re-export the model with the bucketed axes dynamic (e.g. torch.onnx.export(..., dynamic_axes=...))"
        if not open_dims:
            return f"every dim of {name!r} is fixed in this model: {export}, or compile it for its one shape"
        return f"only dim(s) {open_dims} of {name!r} are symbolic in this model: bucket only those, or {export}"
    return f"keep the model's static dims, e.g. {flag} {name}:{_example(decl, dims)}"


def _write_dims(vi: onnx.ValueInfoProto, dims) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = int(d)


def _fmt(dims) -> str:
    return "x".join(str(d) if d else "?" for d in dims)


def _example(decl, given=None) -> str:
    if given is not None and len(given) == len(decl):
        return "x".join(str(d if isinstance(d, int) and d > 0 else g) for d, g in zip(decl, given))
    return "x".join(str(d) if isinstance(d, int) and d > 0 else "1" for d in decl)


BUCKETS_FLAG = "--shape-buckets"


def parse_shape_buckets(specs) -> tuple[dict[str, tuple[int, ...]], ...]:
    """`input:1x3x224x224,1x3x256x256` (one spec per input, joined by ';' or given as a list)
    -> one {input: dims} per bucket. Every spec lists the same number of shapes: bucket i takes
    the i-th shape of each. Also accepts that result back (a list of dicts)."""
    if not specs:
        return ()
    if isinstance(specs, str):
        specs = [s for s in specs.split(";") if s.strip()]
    specs = list(specs)
    if all(isinstance(s, dict) for s in specs):
        return tuple({k: tuple(int(d) for d in v) for k, v in s.items()} for s in specs)
    per_input: dict[str, list[tuple[int, ...]]] = {}
    for spec in specs:
        name, sep, shapes = str(spec).rpartition(":")
        if not sep or not name or not shapes.strip():
            raise ShapeError(
                f"bad shape buckets {spec!r}",
                where=BUCKETS_FLAG,
                fix=f"write NAME:SHAPE,SHAPE,..., e.g. {BUCKETS_FLAG} input:1x3x224x224,4x3x224x224",
            )
        if name in per_input:
            raise ShapeError(
                f"input {name!r} is given buckets twice",
                where=BUCKETS_FLAG,
                fix=f"list all of its shapes in one {BUCKETS_FLAG} NAME:S1,S2,...",
            )
        dims = [InputShape.parse(f"{name}:{s.strip()}").dims for s in shapes.split(",")]
        if len(set(dims)) != len(dims):
            raise ShapeError(
                f"input {name!r} lists a bucket shape twice in {spec!r}",
                where=BUCKETS_FLAG,
                fix="give each bucket once",
            )
        if len({len(d) for d in dims}) != 1:
            raise ShapeError(
                f"input {name!r}: bucket shapes of different ranks in {spec!r}",
                where=BUCKETS_FLAG,
                fix="every bucket keeps the input's rank",
            )
        per_input[name] = dims
    counts = {n: len(v) for n, v in per_input.items()}
    if len(set(counts.values())) != 1:
        raise ShapeError(
            f"inputs list different numbers of buckets: {counts}",
            where=BUCKETS_FLAG,
            fix="give every bucketed input the same number of shapes (bucket i takes the i-th of each)",
        )
    n = next(iter(counts.values()))
    buckets = tuple({name: dims[i] for name, dims in per_input.items()} for i in range(n))
    # smallest first: the runtime picks the first bucket that holds the input
    return tuple(sorted(buckets, key=lambda b: (sum(_numel(d) for d in b.values()), sorted(b.items()))))


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def check_shape_buckets(model, options) -> None:
    """Check every bucket's shapes against an ONNX model's declared inputs before any bucket is built,
    naming --shape-buckets and the bucket. Other formats, and files ONNX cannot read, are left to the
    compile itself (which reports them)."""
    if not options.shape_buckets:
        return
    where = "<model>" if isinstance(model, onnx.ModelProto) else str(model)
    if not isinstance(model, onnx.ModelProto):
        from .detect import detect_format

        try:
            if detect_format(model) != "onnx":
                return
            model = onnx.load(str(model), load_external_data=False)
        except Exception:
            return
    frozen = {f.name for f in options.freeze_inputs}
    shell = onnx.ModelProto()
    shell.graph.input.extend(vi for vi in graph_inputs(model) if vi.name not in frozen)
    flags = {n: BUCKETS_FLAG for n, _ in options.shape_buckets[0]}
    shapes_of = options.bucket_shapes()
    for i, shapes in enumerate(shapes_of):
        m = onnx.ModelProto()
        m.CopyFrom(shell)
        name = ", ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in shapes.items() if k in flags)
        pin_input_shapes(m, shapes, f"{where} ({BUCKETS_FLAG} bucket {i + 1} of {len(shapes_of)}: {name})", flags)
