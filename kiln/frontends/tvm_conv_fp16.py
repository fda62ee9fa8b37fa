"""Conv on float16/bfloat16 accumulated in float32 (out_dtype), the sum rounded to the input's type once.
TVM 0.27's converter gives the convolution the input's type as its accumulator, a rounding per tap: an fp16
CausalConvWithState (its function body's depthwise Conv) came out 3 ulps from onnxruntime and onnx's
reference, which both accumulate in float32. The weights stay in the input's type; the bias is added to the
float32 sum."""

from __future__ import annotations

LOW = ("float16", "bfloat16")
CONV_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")


def conv_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class Conv(f.Conv):
        @classmethod
        def _impl_v11(cls, bb, inputs, attr, params):
            out = super()._impl_v11(bb, inputs, attr, params)
            dtype = getattr(getattr(inputs[0], "ty", None), "dtype", None)
            if dtype not in LOW:
                return out
            conv, bias = out, None
            if getattr(out.op, "name", "") == "relax.add":
                conv, bias = out.args
            if getattr(conv.op, "name", "") not in CONV_OPS:
                return out
            a = conv.attrs
            make = getattr(relax.op.nn, conv.op.name.rsplit(".", 1)[1])
            wide = make(
                conv.args[0], conv.args[1], strides=a.strides, padding=a.padding, dilation=a.dilation,
                groups=a.groups, data_layout=a.data_layout, kernel_layout=a.kernel_layout,
                out_layout=a.out_layout, out_dtype="float32",
            )  # fmt: skip
            if bias is not None:
                wide = relax.op.add(bb.normalize(wide), relax.op.astype(bias, "float32"))
            return relax.op.astype(bb.normalize(wide), dtype)

    return Conv
