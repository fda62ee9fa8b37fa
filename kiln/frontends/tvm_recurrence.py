"""The converter of Kiln's own ONNX node KilnRecurrence (domain ai.kiln), which decompose/rnn.py emits
for an LSTM/GRU/RNN layer it does not unroll: a call_tir of schedules/rules/recurrence.py's kernel, the whole
layer (every step, every direction) in one call. Inputs: xw [T, B, D*G*H] (the input projection, biases
folded), rt [D, H, G*H] (with quantized_h: integer-valued, then its column scales rs [D, G*H]), GRU's rbh [D, H],
h0 [D, B, H], LSTM's c0; outputs Y [T, D, B, H], Y_h and LSTM's Y_c [D, B, H] (ONNX's layout-0 shapes)."""

from __future__ import annotations

OP_TYPE, DOMAIN = "KilnRecurrence", "ai.kiln"


def _static(x) -> tuple[int, ...]:
    return tuple(int(d) for d in x.ty.shape.values)


def recurrence_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    from ..schedules.rules.recurrence import Recurrence, kernel

    class KilnRecurrence(f.OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            cell = attr["cell"].decode() if isinstance(attr["cell"], bytes) else str(attr["cell"])
            xw, rt = inputs[0], inputs[1]
            steps, batch, _ = _static(xw)
            dirs, hidden, _ = _static(rt)
            rec = Recurrence(
                cell,
                steps,
                batch,
                hidden,
                tuple(bool(r) for r in attr["reverse"]),
                bool(attr.get("linear_before_reset", 0)),
                bool(attr.get("quantized_h", 0)),
            )
            if len(rec.reverse) != dirs:
                raise ValueError(f"KilnRecurrence: {dirs} directions of weights, {len(rec.reverse)} reverse flags")
            gv = bb.add_func(kernel(rec).without_attr("global_symbol"), f"recurrence_{cell}")
            state = relax.TensorType([dirs, batch, hidden], "float32")
            outs = [relax.TensorType([steps, dirs, batch, hidden], "float32"), state] + (
                [state] if cell == "lstm" else []
            )
            return bb.emit(relax.call_tir(gv, [i for i in inputs if i is not None], outs))

    return KilnRecurrence
