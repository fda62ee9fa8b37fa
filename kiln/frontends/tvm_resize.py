"""Resize with roi, scales or sizes fed at run time (TVM 0.27's converter takes only constant or shape-expression
ones). The input's rank is pinned, so only the resized dims are unknown: they become symbolic dims
(tvm_dynamic_shapes.runtime_dims). Sizes alone on a 4-D NCHW input, nearest or linear, with no roi, axes,
antialias, keep_aspect_ratio_policy, tf_crop_and_resize or half_pixel_symmetric: the output samples at the
ratio of the sizes, linear by relax's resize2d, nearest by gathers at source indices computed per run in
float64 as onnx's reference does (resize2d works in float32, and where a coordinate falls on a tie, 2x2 -> 7x8,
picked other pixels than onnxruntime); N and C kept (checked at run time). Everything else (run-time scales
or roi, cubic, antialias, axes, other ranks) and Upsample with run-time scales: resampled one axis at a time
by tvm_resize_runtime.py."""

from __future__ import annotations

from .tvm_dynamic_shapes import check, dims_of, runtime_dims, runtime_tensor, static_length
from .tvm_resize_runtime import given, runtime_resize

MODES = {"nearest": "nearest_neighbor", "linear": "linear"}


def _text(attr, name: str, default: str) -> str:
    v = attr.get(name, default)
    return v.decode("ascii") if isinstance(v, bytes) else v


def _unsupported(attr, ndim: int, roi_given: bool) -> str | None:
    """Why a Resize with run-time sizes is not taken by the resize2d/gather path below (None: it is); the
    others go to tvm_resize_runtime.py."""
    if ndim != 4:
        return f"a {ndim}-D input (4-D NCHW is taken)"
    if _text(attr, "mode", "nearest") not in MODES:
        return f"mode {_text(attr, 'mode', 'nearest')!r}"
    if attr.get("antialias", 0) or attr.get("axes") is not None:
        return "antialias or axes"
    if _text(attr, "keep_aspect_ratio_policy", "stretch") != "stretch":
        return "keep_aspect_ratio_policy"
    if _text(attr, "coordinate_transformation_mode", "half_pixel") in ("tf_crop_and_resize", "half_pixel_symmetric"):
        return f"coordinate_transformation_mode {_text(attr, 'coordinate_transformation_mode', '')!r}"
    return "a roi" if roi_given else None


def resize_converter():
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Resize(f.Resize):
        @classmethod
        def _impl_v18(cls, bb, inputs, attr, params):
            roi, scales, sizes = (inputs[i] if len(inputs) > i else None for i in (1, 2, 3))
            if not any(runtime_tensor(t, params) for t in (roi, scales, sizes)):
                return super()._impl_v18(bb, inputs, attr, params)
            x, node = inputs[0], attr["tvm_custom"]["name"] or "(unnamed)"
            if not runtime_tensor(sizes, params) or given(scales, params, "Resize", node) is not None:
                return runtime_resize(bb, x, roi, scales, sizes, attr, params, node)
            roi_c = f.get_constant(roi, params) if roi is not None else None
            roi_given = roi_c is not None and not (
                isinstance(roi_c, tvm.ir.GenericConst) and roi_c.value.numpy().size == 0
            )
            if _unsupported(attr, x.ty.ndim, roi_given) is not None or static_length(sizes, "Resize", node) != 4:
                return runtime_resize(bb, x, roi, scales, sizes, attr, params, node)
            s = bb.normalize(relax.op.astype(sizes, "int64"))
            nc = relax.op.strided_slice(dims_of(bb, x), [0], [0], [2])
            check(
                bb,
                relax.op.equal(relax.op.strided_slice(s, [0], [0], [2]), nc),
                f"Resize node {node!r}: the sizes fed at run time resize the batch or channel axis",
            )
            hw = runtime_dims(bb, bb.normalize(relax.op.strided_slice(s, [0], [2], [4])), 2, "resize")
            if _text(attr, "mode", "nearest") == "nearest":
                return _nearest(bb, x, s, hw, attr)
            return relax.op.image.resize2d(
                x,
                size=relax.ShapeExpr(hw),
                roi=[0.0] * 4,
                layout="NCHW",
                method=MODES[_text(attr, "mode", "nearest")],
                coordinate_transformation_mode=_text(attr, "coordinate_transformation_mode", "half_pixel"),
                rounding_method=_text(attr, "nearest_mode", "round_prefer_floor"),
                cubic_alpha=attr.get("cubic_coeff_a", -0.75),
                cubic_exclude=attr.get("exclude_outside", 0),
                extrapolation_value=attr.get("extrapolation_value", 0.0),
            )

    return Resize


def _source_coordinate(x, scale, out, n: int, mode: str):
    """onnx's reference: the input coordinate of output positions x (float64), for sizes out (0-d float64)."""
    from tvm import relax

    c = lambda v: relax.const(float(v), "float64")
    half = c(0.5)
    if mode == "asymmetric":
        return relax.op.divide(x, scale)
    if mode == "align_corners":
        step = relax.op.divide(c(n - 1), relax.op.maximum(relax.op.subtract(out, c(1)), c(1)))
        return relax.op.where(relax.op.equal(out, c(1)), c(0), relax.op.multiply(x, step))
    centered = relax.op.subtract(relax.op.divide(relax.op.add(x, half), scale), half)
    if mode == "pytorch_half_pixel":
        return relax.op.where(relax.op.greater(out, c(1)), centered, c(0))
    return centered  # half_pixel


def _round(v, method: str):
    """ONNX's nearest_mode on float64 coordinates."""
    from tvm import relax

    half = relax.const(0.5, "float64")
    if method == "floor":
        return relax.op.floor(v)
    if method == "ceil":
        return relax.op.ceil(v)
    if method == "round_prefer_ceil":
        return relax.op.floor(relax.op.add(v, half))
    return relax.op.ceil(relax.op.subtract(v, half))  # round_prefer_floor: ties go down


def _nearest(bb, x, sizes, hw, attr):
    """x gathered along H and W at the source indices of the run-time output sizes."""
    from tvm import relax

    mode = _text(attr, "coordinate_transformation_mode", "half_pixel")
    method = _text(attr, "nearest_mode", "round_prefer_floor")
    y = x
    for axis, dim in ((2, hw[0]), (3, hw[1])):
        n = int(x.ty.shape.values[axis])
        out = bb.normalize(relax.op.astype(relax.op.take(sizes, relax.const(axis, "int64"), axis=0), "float64"))
        scale = relax.op.divide(out, relax.const(float(n), "float64"))
        pos = bb.normalize(relax.op.arange(0, dim, 1, "float64"))
        src = _round(_source_coordinate(pos, scale, out, n, mode), method)
        src = relax.op.clip(src, 0, n - 1)
        idx = bb.normalize(relax.op.astype(src, "int64"))
        y = bb.normalize(relax.op.take(y, idx, axis=axis))
    return y


def upsample_converter():
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Upsample(f.Upsample):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            scales = inputs[1] if len(inputs) > 1 else None
            if not runtime_tensor(scales, params):
                return super()._impl_v9(bb, inputs, attr, params)
            node = attr["tvm_custom"]["name"] or "(unnamed)"
            return runtime_resize(bb, inputs[0], None, scales, None, attr, params, node, upsample=True)

    return Upsample
