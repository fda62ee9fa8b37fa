"""The converter of Kiln's own ONNX node KilnAssert (domain ai.kiln), which impossible_branches.py emits
where it dropped an If branch that cannot run for the pinned shapes: a run-time check that the If's
condition still selects the branch compiled (relax assert_op, kept by dead-code elimination as impure),
raising with the node's message when it does not."""

from __future__ import annotations

from ..runtime.model import INPUT_CHECK

OP_TYPE, DOMAIN = "KilnAssert", "ai.kiln"


def assert_converter():
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as f

    class KilnAssert(f.OnnxOpConverter):
        @classmethod
        def _impl_v1(cls, bb, inputs, attr, params):
            cond = bb.normalize(relax.op.reshape(relax.op.astype(inputs[0], "bool"), []))
            if not attr.get("expect", 1):
                cond = bb.normalize(relax.op.logical_not(cond))
            message = attr["message"]
            message = message.decode() if isinstance(message, bytes) else message
            # the runtime reports a message with INPUT_CHECK as an input error; assert_op formats its message
            # with {}: braces in the text are taken literally as ( )
            text = f"{INPUT_CHECK} {message}".replace("{", "(").replace("}", ")")
            bb.emit(relax.op.assert_op(cond, format=text))
            return inputs[0]  # the node's one output (unused): the check is kept as an impure call

    return KilnAssert
