"""ONNX file -> Relax IRModule, the Kiln way: load, preflight every op, pin shapes, simplify at the
ONNX level, rewrite ops TVM lacks, then TVM 0.27's own importer (wrapped, not forked)."""

from __future__ import annotations

import dataclasses
import os
import warnings

import onnx

from ..errors import CompileError, PassError, UnsupportedModelError, pass_errors
from ..runtime.artifact import TensorSpec
from . import impossible_branches, preflight
from . import simplify as simplify_mod
from .constant_inputs import check_constant_inputs
from .decompose import decompose, rewrite_for
from .decompose.rnn import ONE_KERNEL
from .freeze import freeze_inputs, parse_frozen_inputs
from .onnx_load import check_onnx, load_onnx, to_array
from .sequence_io import expand_inputs, is_structured, read_structure
from .sequences import flatten_sequences
from .shape_values import cast_shape_values, clamp_slice_bounds
from .shapes import graph_inputs, parse_input_shapes, pin_input_shapes
from .tvm_converters import kiln_converters


@dataclasses.dataclass
class ImportedModel:
    mod: object  # tvm.IRModule
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    opsets: dict[str, int]
    stats: dict[str, int]
    onnx_model: onnx.ModelProto  # the simplified model TVM imported

    @property
    def structure(self) -> dict | None:
        """The sequence/optional structure of the model's inputs and outputs (sequence_io.py); None: tensors."""
        return read_structure(self.onnx_model)


def prepare_onnx(
    model: onnx.ModelProto, input_shapes=None, where: str = "<model>", frozen=()
) -> tuple[onnx.ModelProto, dict]:
    """Preflight, freeze, pin, simplify, decompose: the ONNX-level half of the import."""
    preflight.check_supported(model, where)
    _check_tensor_io(model, where)
    model_c = onnx.ModelProto()
    model_c.CopyFrom(model)
    freeze_inputs(model_c, parse_frozen_inputs(frozen), where)
    shapes = dict(parse_input_shapes(input_shapes))
    in_structure, seeds = expand_inputs(model_c, shapes, where)  # sequence/optional inputs as tensors
    pin_input_shapes(model_c, shapes, where)
    flatten_sequences(model_c, seeds, in_structure, where)  # sequences and optionals as tensors (sequences.py)
    simple, stats = simplify_mod.simplify(model_c, where)
    preflight.check_supported(simple, where)  # what the rewrites below and TVM's importer take
    stats["rewritten"] = _decompose(simple, where)
    stats["shape_casts"] = cast_shape_values(simple)
    clamp_slice_bounds(simple)
    check_constant_inputs(simple, where)
    return simple, stats


def import_onnx(
    model: str | os.PathLike | onnx.ModelProto,
    input_shapes=None,
    where: str | None = None,
    checked: bool = False,
    frozen=(),
    recurrence_kernel: bool = True,
) -> ImportedModel:
    """checked=True: the caller already ran ONNX's checker on this proto (compile_model does, once
    for all its buckets). frozen: inputs that become constants (--freeze-input). recurrence_kernel: LSTM/GRU/RNN
    layers as one CPU kernel each (decompose/rnn.py), else unrolled into per-step ops (GPU targets)."""
    where = where or ("<model>" if isinstance(model, onnx.ModelProto) else str(model))
    if not isinstance(model, onnx.ModelProto):
        model = load_onnx(model)  # checks it
    elif not checked:
        check_onnx(model, where)
    token = ONE_KERNEL.set(recurrence_kernel)
    try:
        simple, stats = prepare_onnx(model, input_shapes, where, frozen)
    finally:
        ONE_KERNEL.reset(token)
    inputs = _input_specs(simple, where)
    try:
        mod = _tvm_import(simple, inputs, where)
    except PassError as e:  # a branch that cannot run for these shapes? (impossible_branches.py)
        simple, mod = _without_impossible_branches(simple, inputs, where, stats, e)
    outputs = output_specs(mod, [o.name for o in simple.graph.output], where)
    return ImportedModel(mod, inputs, outputs, preflight.opsets(model), stats, simple)


def _input_specs(model: onnx.ModelProto, where: str) -> list[TensorSpec]:
    return [
        TensorSpec(
            vi.name,
            tuple(d.dim_value for d in vi.type.tensor_type.shape.dim),
            _np_dtype(vi.type.tensor_type.elem_type, vi.name, where),
        )
        for vi in graph_inputs(model)
    ]


def _tvm_import(model: onnx.ModelProto, inputs: list[TensorSpec], where: str):
    """TVM's from_onnx with Kiln's converters; its failures are PassErrors of its stage."""
    from tvm.relax.frontend.onnx import from_onnx

    with pass_errors("TVM's ONNX importer", where), warnings.catch_warnings(), kiln_converters():
        warnings.simplefilter("ignore")
        return from_onnx(
            model,
            shape_dict={i.name: list(i.shape) for i in inputs},
            dtype_dict={i.name: i.dtype for i in inputs},
            keep_params_in_input=False,
        )


def _without_impossible_branches(simple, inputs, where: str, stats: dict, error: PassError):
    """The model with the If branches that cannot run for the pinned shapes dropped, and its import; the
    original error when no branch was dropped or the model still fails."""
    pruned_model, pruned = impossible_branches.prune(
        simple, lambda sub: _tvm_import(sub, _input_specs(sub, where), where), where
    )
    if not pruned:
        raise error
    try:
        mod = _tvm_import(pruned_model, inputs, where)
    except PassError:
        raise error from None
    impossible_branches.warn(pruned, where)
    stats["branches_dropped"] = len(pruned)
    return pruned_model, mod


def _decompose(model: onnx.ModelProto, where: str) -> int:
    """The rewrites of decompose/ on the graph and, recursively, on the branches of its Ifs (in place)."""
    consts = {i.name: to_array(i, where) for i in model.graph.initializer}
    count = 0
    if any(rewrite_for(n) for n in model.graph.node):
        count = decompose(model, simplify_mod.static_shapes(model), consts, where)
        simplify_mod.write_constants(model.graph, consts)
    if any(n.op_type == "If" for n in model.graph.node):

        def branch(sub):
            nonlocal count
            count += _decompose(sub, where)
            return sub

        simplify_mod.map_branches(model, consts, branch)
    return count


def _check_tensor_io(model: onnx.ModelProto, where: str) -> None:
    """An artifact takes and returns tensors, and sequences and optionals of them (sequence_io.py): a map or a
    sparse tensor at the graph's boundary cannot be compiled."""
    inits = {i.name for i in model.graph.initializer}
    bad = [
        f"{kind} {vi.name!r} ({vi.type.WhichOneof('value')})"
        for kind, vis in (("input", model.graph.input), ("output", model.graph.output))
        for vi in vis
        if vi.name not in inits and vi.type.WhichOneof("value") not in ("tensor_type", None) and not is_structured(vi)
    ]
    if bad:
        raise UnsupportedModelError(
            f"the graph takes or returns values that are not tensors, sequences or optionals: {', '.join(bad)}",
            where=where,
            fix="a compiled model takes and returns tensors (and sequences or optionals of them): export a map's "
            "keys and values as separate tensors",
        )


def _np_dtype(elem_type: int, name: str, where: str) -> str:
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise UnsupportedModelError(
            f"input {name!r} has an unsupported element type {elem_type}",
            where=where,
            fix="inputs must be numeric tensors (float, int or bool); cast at the model's boundary",
        ) from None


def output_specs(mod, names: list[str], where: str) -> list[TensorSpec]:
    from tvm import relax

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    if len(fields) != len(names):
        raise CompileError(
            f"the model declares {len(names)} outputs but converts to {len(fields)}",
            where=where,
            fix="check that every graph output is produced by a node; report the model if it runs in onnxruntime",
        )
    specs = []
    for name, f in zip(names, fields):
        if not isinstance(f, relax.TensorType) or (f.shape is None and f.ndim < 0):
            raise UnsupportedModelError(
                f"output {name!r} is not a tensor of known rank (a sequence or an optional)",
                where=where,
                fix="outputs must be tensors; unpack sequences into separate outputs before export",
            )
        # a dim that depends on the data (NonZero, NMS, Unique) stays symbolic: -1 in the manifest,
        # TVM's VM sizes it per run
        dims = f.shape.values if f.shape is not None else [None] * f.ndim
        specs.append(
            TensorSpec(
                name,
                tuple(int(v.value if hasattr(v, "value") else v) if _static(v) else DYNAMIC for v in dims),
                str(f.dtype),
            )
        )
    return specs


DYNAMIC = -1  # an output dimension known only at run time


def _static(v) -> bool:
    return isinstance(v, int) or hasattr(v, "value")
