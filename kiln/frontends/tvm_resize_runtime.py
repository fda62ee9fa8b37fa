"""Resize (and Upsample) whose roi, scales or sizes are fed at run time, any mode and attribute: the output's
rank is the input's (static), its resized dims become symbolic dims bound per run, and each resized axis is
resampled by tvm_resize_axis.py. The per-axis geometry follows onnx's reference (op_resize._interpolate_nd):
scales give floor(scale * n) elements; sizes give their own count at scale sizes / n, or with
keep_aspect_ratio_policy one scale for every resized axis (the min or max of those ratios) and
round-half-up(scale * n) elements; `axes` picks which axes the roi/scales/sizes entries describe, in order."""

from __future__ import annotations

from ..errors import UnsupportedModelError
from .tvm_dynamic_shapes import runtime_dims, static_length
from .tvm_resize_axis import Axis, Options, resize_axis


def _text(attr, name: str, default: str) -> str:
    v = attr.get(name, default)
    return v.decode("ascii") if isinstance(v, bytes) else v


def given(x, params, op: str, node: str):
    """x as a relax expression when it holds values (a constant or a run-time tensor of static length > 0)."""
    import tvm
    from tvm.relax.frontend.onnx import onnx_frontend as f

    if x is None:
        return None
    c = f.get_constant(x, params)
    if isinstance(c, tvm.ir.GenericConst):
        return c if c.value.numpy().size else None
    return x if static_length(x, op, node) else None


def options(attr, upsample: bool = False) -> Options:
    mode = _text(attr, "mode", "nearest")
    if upsample:  # Upsample: asymmetric coordinates, nearest rounds down (integer factors repeat pixels)
        return Options(mode=mode, ctm="asymmetric", nearest_mode="floor")
    return Options(
        mode=mode,
        ctm=_text(attr, "coordinate_transformation_mode", "half_pixel"),
        nearest_mode=_text(attr, "nearest_mode", "round_prefer_floor"),
        cubic_a=float(attr.get("cubic_coeff_a", -0.75)),
        exclude_outside=bool(attr.get("exclude_outside", 0)),
        antialias=bool(attr.get("antialias", 0)),
        extrapolation=float(attr.get("extrapolation_value", 0.0)),
    )


def _entry(bb, t, i: int, dtype: str):
    from tvm import relax

    return bb.normalize(relax.op.astype(relax.op.take(t, relax.const(i, "int64"), axis=0), dtype))


def _geometry(bb, x, scales, sizes, axes, policy: str):
    """Per resized axis (in `axes` order): (0-d float64 scale, 0-d int64 output length)."""
    from tvm import relax

    op = relax.op
    dims = [int(d) for d in x.ty.shape.values]
    if scales is not None:
        out = []
        for p, a in enumerate(axes):
            s = _entry(bb, scales, p, "float64")
            out.append(
                (s, bb.normalize(op.astype(op.floor(op.multiply(s, relax.const(float(dims[a]), "float64"))), "int64")))
            )
        return out
    ratios = [
        bb.normalize(op.divide(_entry(bb, sizes, p, "float64"), relax.const(float(dims[a]), "float64")))
        for p, a in enumerate(axes)
    ]
    if policy == "stretch":
        return [(r, _entry(bb, sizes, p, "int64")) for p, r in enumerate(ratios)]
    pick = op.minimum if policy == "not_larger" else op.maximum
    s = ratios[0]
    for r in ratios[1:]:
        s = bb.normalize(pick(s, r))
    half = relax.const(0.5, "float64")
    return [
        (
            s,
            bb.normalize(
                op.astype(op.floor(op.add(op.multiply(s, relax.const(float(dims[a]), "float64")), half)), "int64")
            ),
        )
        for a in axes
    ]


def runtime_resize(bb, x, roi, scales, sizes, attr, params, node: str, upsample: bool = False):
    """x resized by roi/scales/sizes (relax expressions, any of them fed at run time; None where absent)."""
    from tvm import relax

    op_type = "Upsample" if upsample else "Resize"
    if x.ty.shape is None or any(not hasattr(d, "value") for d in x.ty.shape.values):
        raise UnsupportedModelError(
            f"{op_type} node {node!r}: roi/scales/sizes fed at run time need an input of static shape",
            where=op_type,
            fix="pin the input's shape (--input-shape), or freeze those inputs (--freeze-input NAME=VALUE)",
        )
    rank = x.ty.ndim
    roi, scales, sizes = (given(t, params, op_type, node) for t in (roi, scales, sizes))
    if (scales is None) == (sizes is None):
        raise UnsupportedModelError(
            f"{op_type} node {node!r}: exactly one of scales and sizes must hold values",
            where=op_type,
            fix="give the node either scales or sizes",
        )
    axes = [int(a) % rank for a in (attr.get("axes") or range(rank))]
    opt = options(attr, upsample)
    geometry = _geometry(bb, x, scales, sizes, axes, _text(attr, "keep_aspect_ratio_policy", "stretch"))
    lengths = bb.normalize(relax.op.concat([relax.op.reshape(n, [1]) for _, n in geometry], axis=0))
    outs = runtime_dims(bb, lengths, len(axes), "resize")
    y = x
    for p, (a, (s, _), m) in enumerate(zip(axes, geometry, outs)):
        ends = None
        if opt.ctm == "tf_crop_and_resize":
            if roi is None:
                raise UnsupportedModelError(
                    f"Resize node {node!r}: tf_crop_and_resize without a roi", where="Resize", fix="give the roi"
                )
            ends = (_entry(bb, roi, p, "float64"), _entry(bb, roi, p + len(axes), "float64"))
        y = resize_axis(bb, y, Axis(axis=a, n=int(x.ty.shape.values[a]), out=m, scale=s, roi=ends), opt)
    return y
