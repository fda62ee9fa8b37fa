"""Kiln's additions to TVM 0.27's TFLite op converters, passed to `from_tflite(op_converter=...)` (no
global patching). Each override names the TVM behaviour it corrects and is tested on a model that hits
it; custom ops Kiln converts are keyed `CUSTOM:<code>`, the names Kiln's unsupported-op listing uses."""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

TRANSPOSE_CONV_BIAS = "CUSTOM:Convolution2DTransposeBias"
_SAME, _VALID = 1, 2  # TfLitePadding in the C API (0 is unknown)


class KilnOperatorConverter(OperatorConverter):
    def __init__(self, model, subgraph, exp_tab, ctx):
        super().__init__(model, subgraph, exp_tab, ctx)
        self.convert_map[TRANSPOSE_CONV_BIAS] = self.convert_transpose_conv_bias

    def get_op_code_str(self, op):
        code = self.model.OperatorCodes(op.OpcodeIndex())
        if (code.CustomCode() or b"") == TRANSPOSE_CONV_BIAS[7:].encode():
            return TRANSPOSE_CONV_BIAS
        return super().get_op_code_str(op)

    def convert_dequantize(self, op):
        """A float16 weight stored sparse (DENSIFY -> DEQUANTIZE, as in MediaPipe's pose and full-range
        face detectors) has no buffer of its own: TVM read the empty buffer (TypeError: a bytes-like
        object is required); take the dense weight DENSIFY left behind instead."""
        from tflite.TensorType import TensorType

        (t,) = self.get_input_tensors(op)
        if t.tensor.Type() == TensorType.FLOAT16 and self.is_prefetched(t.tensor_idx):
            value = self.get_prefetched_node(t.tensor_idx)
            const = self.exp_tab.new_const(value, dtype="float16", source_name=t.tensor.Name())
            return relax.op.astype(const, "float32")
        return super().convert_dequantize(op)

    def convert_expand_dims(self, op):
        """TVM 0.27 calls relax.op.expand_dims(x, axis, 1), Relay's num_newaxis argument, which Relax's
        expand_dims does not take (TypeError: 3 were given): every EXPAND_DIMS failed (BirdNET's
        metadata model). TFLite's axis is numpy's: -1 - rank <= axis <= rank."""
        x, axis_t = self.get_input_tensors(op)
        if x.qnn_params:
            (out,) = self.get_output_tensors(op)
            if not self.has_same_qnn_params(x, out):
                raise NotImplementedError("EXPAND_DIMS with different input and output quantization")
        axis = int(np.asarray(self.get_tensor_value(axis_t)).reshape(-1)[0])
        rank = len(x.tensor.ShapeAsNumpy()) if x.tensor.ShapeLength() else 0
        if not -1 - rank <= axis <= rank:
            raise ValueError(f"EXPAND_DIMS axis {axis} out of range for rank {rank}")
        return relax.op.expand_dims(self.get_tensor_expr(x), axis)

    def convert_transpose_conv_bias(self, op):
        """MediaPipe's Convolution2DTransposeBias (selfie segmentation's upsampling head): a float
        transposed conv (input, OHWI weights, bias) whose custom options are the raw C struct
        TfLiteTransposeConvParams {padding, stride_width, stride_height}; the output size is the
        output tensor's, the padding TFLite's (as if the output were a forward conv's input)."""
        x, w, b = self.get_input_tensors(op)
        (out,) = self.get_output_tensors(op)
        padding, stride_w, stride_h = (int(v) for v in np.frombuffer(op.CustomOptionsAsNumpy().tobytes()[:12], "<i4"))
        if padding not in (_SAME, _VALID) or x.qnn_params or stride_w < 1 or stride_h < 1:
            raise NotImplementedError(
                f"Convolution2DTransposeBias with padding {padding}, strides {stride_h}x{stride_w}"
            )
        _, in_h, in_w, _ = (int(d) for d in self.get_tensor_shape(x))
        _, kh, kw, _ = (int(d) for d in self.get_tensor_shape(w))
        _, out_h, out_w, _ = (int(d) for d in self.get_tensor_shape(out))
        pads = []
        for size, k, s, src in ((out_h, kh, stride_h, in_h), (out_w, kw, stride_w, in_w)):
            total = max((src - 1) * s + k - size, 0) if padding == _SAME else 0
            pads.append((total // 2, total - total // 2))
        extra = [size - ((src - 1) * s + k - sum(p)) for size, k, s, src, p in
                 ((out_h, kh, stride_h, in_h, pads[0]), (out_w, kw, stride_w, in_w, pads[1]))]  # fmt: skip
        weight = self._value(w)
        y = relax.op.nn.conv2d_transpose(  # in NCHW: TVM legalizes no NHWC conv2d_transpose
            relax.op.permute_dims(self.get_tensor_expr(x), axes=(0, 3, 1, 2)),
            relax.op.permute_dims(weight, axes=(3, 0, 1, 2)),  # OHWI -> IOHW
            strides=(stride_h, stride_w),
            padding=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]),
            output_padding=tuple(extra),
            out_dtype="float32",
        )
        y = relax.op.permute_dims(y, axes=(0, 2, 3, 1))
        return relax.op.add(y, self._value(b))

    def _value(self, t):
        if self.has_expr(t.tensor_idx):
            return self.get_expr(t.tensor_idx)
        return self.exp_tab.new_const(self.get_tensor_value(t), dtype="float32", source_name=t.tensor.Name())
