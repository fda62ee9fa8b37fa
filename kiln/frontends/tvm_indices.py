"""Converters that keep run-time indices inside their data: TVM 0.27's gather_elements, gather_nd,
scatter_elements, scatter_nd (MaxUnpool's scatter among them) and roi_align's batch index read or write wherever
an index points, so an index of 10**9 took the process down (a segfault in `Model.run`, and in `kiln serve` the
server). Each index is clamped into its axis (negative ones counted from the end first, as ONNX has them). Gather
(TVM's take) is clamped for every frontend by the pass ClipTakeIndices; inputs that index a constant table are
also checked before the run, as an input error naming the input and its range (index_ranges.py)."""

from __future__ import annotations


def clamp(bb, indices, extent):
    """indices (negative ones counted from the end) clamped into [0, extent - 1]; extent broadcasts against them"""
    from tvm import relax

    dtype = indices.ty.dtype.dtype
    last = bb.normalize(relax.op.subtract(extent, relax.const(1, dtype)))
    if not dtype.startswith("uint"):
        negative = relax.op.less(indices, relax.const(0, dtype))
        indices = bb.normalize(relax.op.where(negative, relax.op.add(indices, extent), indices))
        indices = relax.op.maximum(indices, relax.const(0, dtype))
    return bb.normalize(relax.op.minimum(indices, last))


def bounded(name: str, coordinates: bool):
    """GatherElements, GatherND, ScatterElements, ScatterND with their indices clamped into the data's extents first
    (TVM's kernels do not check them: an index of 10**9 read or wrote outside the tensor and took the process
    down). coordinates: the last axis of the indices addresses the data's leading axes (the ND ops)."""

    def make():
        from tvm.relax.frontend.onnx import onnx_frontend as f

        base = getattr(f, name)

        def bounded(impl):
            def convert(cls, bb, inputs, attr, params):
                data, indices = inputs[0], inputs[1]
                if coordinates:
                    extent = f._coord_axis_extents(bb, data, indices, attr.get("batch_dims", 0))
                else:
                    extent = f._axis_extent(bb, data, attr.get("axis", 0), indices.ty.dtype.dtype)
                inputs[1] = clamp(bb, indices, extent)
                return impl.__func__(cls, bb, inputs, attr, params)

            return classmethod(convert)

        impls = {m: bounded(getattr(base, m)) for m in dir(base) if m.startswith("_impl_v")}
        return type(name, (base,), impls)

    return make


def max_unpool_converter():
    """TVM's MaxUnpool scatters the values into a flat zero tensor at their indices, unchecked (an index of 10**9
    wrote outside it: a segfault): the same scatter with the indices clamped into the tensor."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class MaxUnpool(f.MaxUnpool):
        @classmethod
        def _impl_v9(cls, bb, inputs, attr, params):
            out = super()._impl_v9(bb, inputs, attr, params)
            flat = out.args[0] if isinstance(out, relax.Call) and out.args else None
            if not (isinstance(flat, relax.Call) and isinstance(flat.op, tvm.ir.Op)):
                return out
            if flat.op.name != "relax.scatter_elements":
                return out
            zeros, indices, values = (bb.normalize(a) for a in flat.args)
            indices = clamp(bb, indices, f._axis_extent(bb, zeros, 0, indices.ty.dtype.dtype))
            return relax.op.reshape(relax.op.scatter_elements(zeros, indices, values, axis=0), out.args[1])

    return MaxUnpool
