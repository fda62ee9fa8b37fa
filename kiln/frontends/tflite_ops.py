"""Kiln's additions to TVM 0.27's TFLite op converters, passed to `from_tflite(op_converter=...)` (no
global patching). Each override names the TVM behaviour it corrects and is tested on a model that hits
it; custom ops Kiln converts are keyed `CUSTOM:<code>`, the names Kiln's unsupported-op listing uses."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter, get_tensor_name

TRANSPOSE_CONV_BIAS = "CUSTOM:Convolution2DTransposeBias"
_SAME, _VALID = 1, 2  # TfLitePadding in the C API (0 is unknown)


INT_TYPES = {2: "int32", 4: "int64"}  # TensorType.INT32, INT64: what shape arithmetic computes in


class KilnOperatorConverter(OperatorConverter):
    # SHAPE reads only its input's shape; TVM's PAD pads a quantized input with its zero point (a
    # full-integer ResNet-50 from TFLiteConverter has both): neither is converted "in float only"
    _SUPPORTED_QUANTIZED_OPS = OperatorConverter._SUPPORTED_QUANTIZED_OPS | {"SHAPE", "PAD"}

    def __init__(self, model, subgraph, exp_tab, ctx):
        super().__init__(model, subgraph, exp_tab, ctx)
        self.convert_map[TRANSPOSE_CONV_BIAS] = self.convert_transpose_conv_bias
        self.folded: dict[int, np.ndarray] = {}  # tensor index -> value of an integer tensor known at import

    # -- shape arithmetic folded at import ----------------------------------------------------------------
    # TFLiteConverter writes a Keras model's reshapes with a dynamic batch as SHAPE -> STRIDED_SLICE -> PACK
    # -> RESHAPE (EfficientNet's squeeze-excite blocks), and BirdNET slices by computed bounds. Kiln pins
    # every input shape, so these integer tensors are constants; TVM 0.27 kept them as calls and failed
    # (ShapeExpr given a Call; a bytes-like object is required). Each integer result with no free
    # variable is evaluated once (LegalizeOps + FoldConstant, TVM's own op semantics) and handed to
    # the converters that read values (get_tensor_value) as the constant it is.

    def convert_op_to_relax(self):
        for i in range(self.subgraph.OperatorsLength()):
            op = self.subgraph.Operators(i)
            ret = self.convert_map[self.get_op_code_str(op)](op=op)
            if ret is None:
                continue
            ret = self.bb.normalize(ret)
            outs = self.get_output_tensors(op)
            for k, t in enumerate(outs):  # SPLIT, UNPACK, ...: each output on its own
                expr = ret if len(outs) == 1 else ret[k]
                value = self._fold(expr, t)
                if value is not None:
                    self.folded[t.tensor_idx] = value
                    self.set_prefetched_node(t.tensor_idx, value)
                else:
                    self.exp_tab.set_expr(get_tensor_name(self.subgraph, t.tensor_idx), expr)

    def _fold(self, expr, out):
        if out.tensor.Type() not in INT_TYPES:
            return None
        if isinstance(expr, Constant):
            return expr.value.numpy()
        bindings = self._bindings(expr)  # the block's bindings it reads (the builder normalizes to ANF)
        if bindings is None:
            return None
        res = relax.Var("folded", expr.ty)
        block = relax.DataflowBlock([relax.VarBinding(v, b) for v, b in bindings] + [relax.VarBinding(res, expr)])
        mod = tvm.IRModule({"main": relax.Function([], relax.SeqExpr([block], res), expr.ty)})
        body = relax.transform.FoldConstant()(relax.transform.LegalizeOps()(mod))["main"].body
        # FoldConstant substitutes a folded result, or leaves it bound, or (a split) a tuple of constants
        bound = {b.var: b.value for blk in body.blocks for b in blk.bindings}

        def resolve(e):
            while isinstance(e, relax.Var) and e in bound:
                e = bound[e]
            if isinstance(e, relax.TupleGetItem):
                t = resolve(e.tuple_value)
                return resolve(t.fields[e.index]) if isinstance(t, relax.Tuple) else e
            return e

        value = resolve(body.body)
        return value.value.numpy() if isinstance(value, Constant) else None

    def _bindings(self, expr, limit: int = 64):
        """The bindings expr's free variables come from, dependencies first; None when one is a graph
        input (no binding) or the chain is longer than shape arithmetic ever is."""
        order, seen = [], set()

        def visit(v) -> bool:
            if v in seen:
                return True
            b = self.bb.lookup_binding(v)
            if b is None or len(order) >= limit or not all(visit(u) for u in relax.analysis.free_vars(b)):
                return False
            seen.add(v)
            order.append((v, b))
            return True

        return order if all(visit(v) for v in relax.analysis.free_vars(expr)) else None

    def has_expr(self, input_tensor_idx):
        return input_tensor_idx not in self.folded and super().has_expr(input_tensor_idx)

    def get_expr(self, input_tensor_idx):
        if input_tensor_idx in self.folded:
            return relax.const(self.folded[input_tensor_idx])
        return super().get_expr(input_tensor_idx)

    def get_tensor_value(self, tensor_wrapper, is_sparse=False):
        if tensor_wrapper.tensor_idx in self.folded:
            return self.folded[tensor_wrapper.tensor_idx]
        return super().get_tensor_value(tensor_wrapper, is_sparse)

    def convert_shape(self, op):
        """The shape of a tensor whose shape is static, as a constant (TVM: shape_of, at run time)."""
        (x,) = self.get_input_tensors(op)
        shape = self.bb.normalize(self.get_tensor_expr(x)).ty.shape
        dims = [getattr(d, "value", None) for d in shape] if shape is not None else [None]
        if any(d is None for d in dims):
            return super().convert_shape(op)
        (out,) = self.get_output_tensors(op)
        return relax.const(np.array(dims, INT_TYPES.get(out.tensor.Type(), "int32")))

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
