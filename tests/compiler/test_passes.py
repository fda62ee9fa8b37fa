"""Each Kiln pass: a golden Before/Expected IR, numerics against the unoptimized module, and for
fusion a kernel count."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from kiln.compiler import analysis, ir
from kiln.compiler.passes import (
    CanonicalizeClip,
    ConvertLayout,
    DeadCode,
    FoldBatchNorm,
    FoldConstants,
    FuseEpilogue,
    RemoveNoOps,
)

TARGET = tvm.target.Target({"kind": "llvm"})


def run_mod(mod, *args):
    with TARGET:
        mod = relax.get_pipeline("zero")(mod)
        ex = tvm.compile(mod, target=TARGET)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


def check_numerics(before, after, *args, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(run_mod(after, *args), run_mod(before, *args), rtol=rtol, atol=atol)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


# ---------------------------------------------------------------- RemoveNoOps
@I.ir_module
class NoOpsBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((24,), "float32"):
        with R.dataflow():
            a = R.permute_dims(x, [0, 2, 1])
            b = R.permute_dims(a, [0, 2, 1])
            c = R.reshape(b, (6, 4))
            d = R.reshape(c, (24,))
            e = R.astype(d, "float32")
            f = R.reshape(e, (24,))
            R.output(f)
        return f


@I.ir_module
class NoOpsExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((24,), "float32"):
        with R.dataflow():
            f = R.reshape(x, (24,))
            R.output(f)
        return f


def test_remove_noops():
    p = RemoveNoOps()
    after = p(NoOpsBefore)
    tvm.ir.assert_structural_equal(after, NoOpsExpected)
    assert p.stats["noops_removed"] == 5
    check_numerics(NoOpsBefore, after, rnd(2, 3, 4))


@I.ir_module
class TransposeComposeBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((3, 4, 2), "float32"):
        with R.dataflow():
            a = R.permute_dims(x, [0, 2, 1])
            b = R.permute_dims(a, [2, 1, 0])
            R.output(b)
        return b


@I.ir_module
class TransposeComposeExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((3, 4, 2), "float32"):
        with R.dataflow():
            b = R.permute_dims(x, [1, 2, 0])
            R.output(b)
        return b


def test_transposes_compose_into_one():
    after = RemoveNoOps()(TransposeComposeBefore)
    tvm.ir.assert_structural_equal(after, TransposeComposeExpected)
    check_numerics(TransposeComposeBefore, after, rnd(2, 3, 4))


# ---------------------------------------------------------------- FoldConstants / DeadCode
def _const_module():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 3), "float32"))
    w = relax.const(rnd(3, 4, seed=1))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w, [1, 0]))
            unused = bb.emit(relax.op.add(x, x))  # noqa: F841
            y = bb.emit_output(relax.op.add(x, wt))
        bb.emit_func_output(y)
    return bb.get(), w


def test_fold_constants_and_dead_code():
    before, w = _const_module()
    fc = FoldConstants()
    after = fc(before)
    assert fc.stats["constants_folded"] == 1  # the transpose; TVM's FoldConstant also drops the dead add
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.const(w.value.numpy().T.copy())))
        bb.emit_func_output(y)
    tvm.ir.assert_structural_equal(after, bb.get())
    check_numerics(before, after, rnd(4, 3))


def test_dead_code():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            bb.emit(relax.op.multiply(x, x))
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    dc = DeadCode()
    after = dc(bb.get())
    assert dc.stats["dead_removed"] == 1 and analysis.op_histogram(after) == {"add": 1}


# ---------------------------------------------------------------- FoldBatchNorm
def _bn_consts(c, seed=0):
    r = np.random.default_rng(seed)
    return [
        relax.const(v.astype("float32"))
        for v in (r.uniform(0.5, 1.5, c), r.normal(0, 0.1, c), r.normal(0, 0.1, c), r.uniform(0.5, 1.5, c))
    ]


def _conv_bn(with_bias: bool, producer: str = "conv2d"):
    bb = relax.BlockBuilder()
    if producer == "matmul":
        x = relax.Var("x", relax.TensorType((2, 6), "float32"))
        w = relax.const(rnd(6, 8, seed=1))
    elif producer == "conv2d_transpose":
        x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
        w = relax.const(rnd(4, 4, 3, 3, seed=1))  # IOHW, groups=2 -> 8 output channels
    else:
        x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
        w = relax.const(rnd(8, 3, 3, 3, seed=1))
    bias_shape = (8,) if producer == "matmul" else (1, 8, 1, 1)
    with bb.function("main", [x]):
        with bb.dataflow():
            if producer == "matmul":
                y = bb.emit(relax.op.matmul(x, w))
            elif producer == "conv2d_transpose":
                y = bb.emit(relax.op.nn.conv2d_transpose(x, w, padding=[1, 1], groups=2))
            else:
                y = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1]))
            if with_bias:
                y = bb.emit(relax.op.add(y, relax.const(rnd(*bias_shape, seed=2))))
            bn = bb.emit(relax.op.nn.batch_norm(y, *_bn_consts(8), axis=1, epsilon=1e-5, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    return bb.get(), x


@pytest.mark.parametrize(
    "producer,with_bias", [("conv2d", False), ("conv2d", True), ("conv2d_transpose", True), ("matmul", True)]
)
def test_fold_batchnorm(producer, with_bias):
    before, x = _conv_bn(with_bias, producer)
    p = FoldBatchNorm()
    after = p(before)
    assert p.stats["batchnorm_folded"] == 1
    assert analysis.count_op(after, "nn.batch_norm") == 0
    hist = analysis.op_histogram(after)
    assert hist == {producer if producer == "matmul" else f"nn.{producer}": 1, "add": 1}
    shape = [int(v) for v in x.ty.shape.values]
    check_numerics(before, after, rnd(*shape, seed=3), rtol=1e-4, atol=1e-5)


def test_fold_batchnorm_golden():
    before, x = _conv_bn(False)
    after = FoldBatchNorm()(before)
    conv = before["main"].body.blocks[0].bindings[0].value
    g, b, m, v = (a.value.numpy().astype(np.float64) for a in _bn_consts(8))
    eps = float(before["main"].body.blocks[0].bindings[1].value.attrs.epsilon)  # stored as float32
    s = g / np.sqrt(v + eps)
    w = conv.args[1].value.numpy().astype(np.float64)
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(x, relax.const((w * s.reshape(-1, 1, 1, 1)).astype("float32")), padding=[1, 1])
            )
            out = bb.emit_output(relax.op.add(y, relax.const(((0 - m) * s + b).astype("float32").reshape(1, 8, 1, 1))))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(after, bb.get())


def test_fold_batchnorm_leaves_training_mode_and_the_input_module_alone():
    before, _ = _conv_bn(False)
    text = before.script()
    p = FoldBatchNorm()
    p(before)
    assert before.script() == text and p.stats["batchnorm_folded"] == 1
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 6, 6), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rnd(8, 3, 3, 3)), padding=[1, 1]))
            out = bb.emit_output(
                relax.TupleGetItem(bb.emit(relax.op.nn.batch_norm(y, *_bn_consts(8), axis=1, training=True)), 0)
            )
        bb.emit_func_output(out)
    p = FoldBatchNorm()
    p(bb.get())
    assert p.stats["batchnorm_folded"] == 0


def test_fold_batchnorm_skips_wrong_axis():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 6, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(rnd(8, 3, 3, 3)), padding=[1, 1]))
            bn = bb.emit(relax.op.nn.batch_norm(y, *_bn_consts(8), axis=3, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    p = FoldBatchNorm()
    p(bb.get())
    assert p.stats["batchnorm_folded"] == 0


# ---------------------------------------------------------------- CanonicalizeClip
def test_canonicalize_clip_from_onnx():
    from helpers import make_model
    from onnx import helper

    from kiln.frontends import import_onnx

    x = rnd(1, 4, 3, 3) * 5
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["a"]), helper.make_node("Clip", ["a", "lo"], ["y"])]
    m = make_model(nodes, {"x": x}, ["y"], {"lo": np.float32(0), "hi": np.float32(6)})
    before = FoldConstants()(import_onnx(m).mod)
    p = CanonicalizeClip()
    after = p(before)
    assert p.stats["clips_canonicalized"] == 2
    assert analysis.op_histogram(after) == {"clip": 1, "nn.relu": 1}
    check_numerics(before, after, x)


# ---------------------------------------------------------------- ConvertLayout
def test_convert_layout_nhwc_transforms_only_at_edges():
    from kiln import zoo
    from kiln.frontends import import_onnx

    before = FoldBatchNorm()(FoldConstants()(import_onnx(zoo.resnet18(size=32, classes=10), ["input:1x3x32x32"]).mod))
    p = ConvertLayout("NHWC")
    after = DeadCode()(p(before))
    convs = [c for c in ir.calls(after["main"]) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.conv2d"]
    assert len(convs) == 20 and all(c.attrs.data_layout == "NHWC" and c.attrs.kernel_layout == "OHWI" for c in convs)
    assert all(isinstance(c.args[1], tvm.ir.expr.GenericConst) for c in convs)  # weights re-laid out at compile time
    assert p.stats["layout_transforms"] <= 2  # in at the input, out before the global pool
    check_numerics(before, after, rnd(1, 3, 32, 32), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- FuseEpilogue
@I.ir_module
class EpilogueBefore:
    @R.function
    def main(
        x: R.Tensor((1, 4, 6, 6), "float32"), w: R.Tensor((4, 4, 3, 3), "float32"), r: R.Tensor((1, 4, 6, 6), "float32")
    ) -> R.Tensor((1, 4, 6, 6), "float32"):
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            b = R.add(c, R.const(0.5, "float32"))
            s = R.add(b, r)
            y = R.nn.relu(s)
            R.output(y)
        return y


@I.ir_module
class EpilogueExpected:
    @R.function(private=True)
    def fused_relax_nn_conv2d_relax_add_relax_add_relax_nn_relu(
        x: R.Tensor((1, 4, 6, 6), "float32"),
        w: R.Tensor((4, 4, 3, 3), "float32"),
        param_0: R.Tensor((), "float32"),
        r: R.Tensor((1, 4, 6, 6), "float32"),
    ) -> R.Tensor((1, 4, 6, 6), "float32"):
        R.func_attr({"Composite": "kiln.epilogue_res_act", "Primitive": True})
        with R.dataflow():
            c = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            b = R.add(c, param_0)
            s = R.add(b, r)
            gv = R.nn.relu(s)
            R.output(gv)
        return gv

    @R.function
    def main(
        x: R.Tensor((1, 4, 6, 6), "float32"), w: R.Tensor((4, 4, 3, 3), "float32"), r: R.Tensor((1, 4, 6, 6), "float32")
    ) -> R.Tensor((1, 4, 6, 6), "float32"):
        cls = EpilogueExpected
        with R.dataflow():
            gv = cls.fused_relax_nn_conv2d_relax_add_relax_add_relax_nn_relu(x, w, R.const(0.5, "float32"), r)
            R.output(gv)
        return gv


def _kernels(mod):
    with TARGET:
        mod = tvm.transform.Sequential(
            [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseTIR()]
        )(mod)
    return ir.kernels(mod)


def test_fuse_epilogue_golden_and_one_kernel():
    p = FuseEpilogue()
    after = p(EpilogueBefore)
    tvm.ir.assert_structural_equal(after, EpilogueExpected)
    assert p.stats["epilogues_fused"] == 1
    assert len(_kernels(after)) == 1 and len(_kernels(EpilogueBefore)) == 4
    check_numerics(EpilogueBefore, after, rnd(1, 4, 6, 6), rnd(4, 4, 3, 3, seed=1), rnd(1, 4, 6, 6, seed=2))


def _chain(act: str):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.add(bb.emit(relax.op.matmul(x, relax.const(rnd(8, 8, seed=1)))), relax.const(rnd(8, seed=2)))
            )
            if act == "relu6":
                y = bb.emit(relax.op.clip(y, 0.0, 6.0))
            elif act == "silu":
                y = bb.emit(relax.op.multiply(y, bb.emit(relax.op.sigmoid(y))))
            elif act == "gelu":
                y = bb.emit(relax.op.nn.gelu(y))
            elif act == "sigmoid":
                y = bb.emit(relax.op.sigmoid(y))
            elif act == "hardswish":
                t = bb.emit(relax.op.clip(bb.emit(relax.op.add(y, relax.const(3.0))), 0.0, 6.0))
                y = bb.emit(relax.op.multiply(y, bb.emit(relax.op.divide(t, relax.const(6.0)))))
            elif act == "gelu_erf":
                e = bb.emit(relax.op.erf(bb.emit(relax.op.divide(y, relax.const(np.float32(np.sqrt(2)))))))
                y = bb.emit(
                    relax.op.multiply(
                        bb.emit(relax.op.multiply(y, bb.emit(relax.op.add(e, relax.const(1.0))))), relax.const(0.5)
                    )
                )
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("act", ["relu6", "silu", "gelu", "sigmoid", "hardswish", "gelu_erf"])
def test_fuse_epilogue_activations_one_kernel(act):
    before = _chain(act)
    after = FuseEpilogue()(before)
    assert len(_kernels(after)) == 1, _kernels(after)
    check_numerics(before, after, rnd(2, 8, seed=4))


def test_fuse_epilogue_residual_whose_other_operand_is_a_conv_chain_used_twice():
    """x_in = conv + bias feeds both the next conv and the residual add x_in + (conv + bias): MobileNetV2's first
    residual of a stage. The second conv, its bias and the add are one kernel. The residual patterns matched a
    bias add as a residual by a constant, taking the second conv before the add could join it: 3 kernels and an
    add of its own."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():

            def conv_bias(a, seed):
                c = bb.emit(relax.op.nn.conv2d(a, relax.const(rnd(4, 4, 1, 1, seed=seed))))
                return bb.emit(relax.op.add(c, relax.const(rnd(1, 4, 1, 1, seed=seed + 1))))

            x_in = conv_bias(x, 1)
            out = bb.emit_output(relax.op.add(x_in, conv_bias(x_in, 3)))
        bb.emit_func_output(out)
    before = bb.get()
    after = FuseEpilogue()(before)
    assert len(_kernels(after)) == 2, _kernels(after)
    check_numerics(before, after, rnd(1, 4, 5, 5, seed=5))


@pytest.mark.parametrize("dtype, fused", [("bfloat16", True), ("float16", True), ("int32", False)])
def test_fuse_epilogue_takes_a_cast_to_a_reduced_float(dtype, fused):
    """conv + bias + ReLU cast to bf16/fp16 (what a reduced-precision conv reads) is one kernel that
    writes the reduced type; other casts stay kernels of their own."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.relu(
                    bb.emit(
                        relax.op.add(
                            bb.emit(relax.op.nn.conv2d(x, relax.const(rnd(4, 4, 1, 1, seed=1)))),
                            relax.const(rnd(1, 4, 1, 1)),
                        )
                    )
                )
            )
            out = bb.emit_output(
                relax.op.astype(bb.emit(relax.op.astype(y, dtype)), "float32")
            )  # back to float32 to compare
        bb.emit_func_output(out)
    before = bb.get()
    after = FuseEpilogue()(before)
    kernels = _kernels(after)
    assert len(kernels) == (2 if fused else 3), kernels  # [conv..cast], cast back  /  [conv..relu], cast, cast back
    assert any(k.endswith("relax_astype") for k in kernels) == fused
    # within one rounding of the reduced type (run whole, the cast there and back may fold away)
    check_numerics(
        before, after, rnd(1, 4, 5, 5, seed=3), rtol={"bfloat16": 2**-8, "float16": 2**-11, "int32": 0}[dtype], atol=0
    )


def test_fuse_epilogue_never_swallows_a_value_used_elsewhere():
    """Two conv branches meet in an add, and one branch's output is also used later (MobileNetV2's
    residual): fusing the add into that branch would lose the value."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(
                relax.op.add(
                    bb.emit(relax.op.nn.conv2d(x, relax.const(rnd(4, 4, 1, 1, seed=1)))), relax.const(rnd(1, 4, 1, 1))
                )
            )
            b = bb.emit(
                relax.op.add(
                    bb.emit(relax.op.nn.conv2d(a, relax.const(rnd(4, 4, 1, 1, seed=2)))), relax.const(rnd(1, 4, 1, 1))
                )
            )
            s = bb.emit(relax.op.add(a, b))
            out = bb.emit_output(relax.op.multiply(s, a))
        bb.emit_func_output(out)
    before = bb.get()
    after = FuseEpilogue()(before)
    relax.analysis.well_formed(after)  # raises on a use of an undefined value
    assert len(_kernels(after)) < len(_kernels(before))
    check_numerics(before, after, rnd(1, 4, 5, 5, seed=3))


def test_convert_layout_takes_a_float_to_int_cast_between_blocked_convs(tmp_path):
    """A Cast from float to int between two blocked convs (the importer's where(!isfinite(x), 0, x) makes a bool
    mask, blocked with them): TVM's layout_transform lowering pads a bool tensor with float 0.0 and its schedule
    refuses it, so the whole ConvertLayout pass was skipped (ddddocr's dynamically quantized OCR model ran
    unblocked, 3.2x onnxruntime). Bool transforms go through uint8: no pass skipped, the convs blocked, and
    the outputs match onnxruntime."""
    from helpers import make_model, ort_run, rand
    from onnx import helper

    import kiln

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["c1", "k"], ["s"]),
        helper.make_node("Cast", ["s"], ["q"], to=6),  # float -> int32
        helper.make_node("Cast", ["q"], ["f"], to=1),
        helper.make_node("Conv", ["f", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    # small integers and a scale of 0.5: the first conv's sums are exact in float32, so both engines truncate alike
    g = np.random.default_rng(0)
    ints = lambda *shape: g.integers(-3, 4, shape).astype(np.float32)
    inits = {"w1": ints(48, 32, 3, 3), "w2": rand(32, 48, 3, 3, seed=2), "k": np.float32(0.5)}
    x = ints(1, 32, 12, 12)
    model = make_model(nodes, {"x": x}, ["y"], inits)
    r = kiln.compile(model, tmp_path / "m.kiln")
    assert r.report["passes_skipped"] == [] and "NCHW" not in r.report["conv_layouts"], r.report["conv_layouts"]
    ref = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(kiln.load(tmp_path / "m.kiln").run({"x": x})["y"], ref, rtol=1e-4, atol=1e-3)
