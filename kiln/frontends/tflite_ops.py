"""Kiln's fixes to TVM 0.27's TFLite op converters, passed to `from_tflite(op_converter=...)` (no global
patching). Each override names the TVM behaviour it corrects and is tested on a model that hits it."""

from __future__ import annotations

from tvm import relax
from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter


class KilnOperatorConverter(OperatorConverter):
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
