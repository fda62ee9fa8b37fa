"""Partition a float model between the simulated accelerator and the CPU (compile side).

Chains conv2d [+ per-channel bias add] [+ ReLU] and dense (matmul by a constant) + bias + ReLU,
each intermediate used once, become one accelerator layer (a dense layer runs as a 1x1 conv on a
1x1 image): the CPU quantizes the input to int8 (symmetric, calibrated scale), the
accelerator runs conv + bias + requantization (+ ReLU) and writes int8, the CPU dequantizes.
Everything else (the first conv, pooling, residual adds, the classifier) stays on the CPU, and
the report says why for each conv that is not offloaded. Each layer's program (tiling,
instruction stream, micro-ops, packed weights) is generated here, at compile time, and stored in
the artifact; the model calls it through a packed function the runtime registers."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ...compiler.ir import op_name as _op
from ...compiler.ir import var_users, var_uses
from ...compiler.optimize import Optimized, optimize
from ...compiler.quantize.calibrate import calibrate, finish
from ...compiler.quantize.layers import LayerNames, candidate, with_taps
from . import codegen, conv, runtime
from .config import VTAConfig


@dataclasses.dataclass
class Chain:
    name: str
    conv: relax.Call  # the conv2d, or the matmul of a dense layer (run as a 1x1 conv on a 1x1 image)
    x: relax.Var
    bias: np.ndarray | None
    relu: bool
    end: relax.Expr  # the value whose binding the accelerator layer replaces
    reason: str | None = None

    @property
    def dense(self) -> bool:
        return self.conv.op.name == "relax.matmul"


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def find_chains(func, onnx_model, cfg: VTAConfig) -> list[Chain]:
    """Every conv2d in graph order, each with the chain it heads and, if it cannot be offloaded, why."""
    uses = var_uses(func)
    bindings = list(_bindings(func))
    users = {v: [bindings[i] for i in idx] for v, idx in var_users(bindings).items()}
    names = LayerNames(onnx_model)
    params = set(func.params)
    chains = []
    for b in _bindings(func):
        c = b.value
        kind = candidate(c)
        if kind is None:
            continue  # not a conv2d, nor a matmul by a constant 2-D weight
        name = names.next(c)
        channels = int(c.ty.shape.values[1 if kind == "conv2d" else -1])
        end, var, bias, relu = c, b.var, None, False
        nxt = users.get(var, [])
        if (
            uses.get(var, 0) == 1
            and len(nxt) == 1
            and _op(nxt[0].value) == "relax.add"
            and isinstance(nxt[0].value.args[1], GenericConst)
        ):
            bv = nxt[0].value.args[1].value.numpy()
            if bv.size == channels and (kind == "matmul" or bv.size == bv.shape[-3 if bv.ndim >= 3 else 0]):
                end, var, bias = nxt[0].value, nxt[0].var, bv.reshape(-1)
                nxt = users.get(var, [])
        if uses.get(var, 0) == 1 and len(nxt) == 1 and _op(nxt[0].value) == "relax.nn.relu":
            end, relu = nxt[0].value, True
        chain = Chain(name, c, c.args[0], bias, relu, end)
        chain.reason = _why_cpu(chain, params, cfg)
        chains.append(chain)
    return chains


def _why_cpu(ch: Chain, params, cfg: VTAConfig) -> str | None:
    c, x = ch.conv, ch.conv.args[0]
    if str(x.ty.dtype) != "float32":
        return f"input is {x.ty.dtype}"
    if ch.dense:
        if len(x.ty.shape.values) != 2 or int(x.ty.shape.values[0]) != 1:
            return "dense layer on a batch other than 1 or a 3-D input"
        if not ch.relu:
            return (
                "dense layer without an activation (the logits): kept on the CPU in float, as VTA's flow skips "
                "dense layers"
            )
        return None
    if x in params or int(x.ty.shape.values[1]) < cfg.block:
        return (
            "the first conv (its few input channels fill a 16-channel block poorly; it stays on the CPU, as in "
            "VTA's flow)"
        )
    a = c.attrs
    if not isinstance(c.args[1], GenericConst):
        return "weight is not a constant"
    if int(a.groups) != 1:
        return "grouped/depthwise conv: the GEMM core has no depthwise mode"
    if a.data_layout != "NCHW" or a.kernel_layout != "OIHW" or any(int(d) != 1 for d in a.dilation):
        return "dilated conv or non-NCHW layout"
    return None


def make_layers(
    chains: list[Chain], ranges: dict, cfg: VTAConfig, tuned: dict | None = None
) -> list[tuple[Chain, runtime.LayerProgram, dict]]:
    """Quantize each offloadable chain (symmetric int8 input/output at the calibrated scales,
    per-channel weights on a power-of-two grid, see conv.shift_quantize) and compile its program with
    its schedule (tuned: workload key -> (Schedule, cycles) from a tuning database, else conv.plan);
    one that does not fit gets a reason."""
    out, tuned = [], tuned or {}
    for ch in chains:
        if ch.reason is not None:
            continue
        c = ch.conv
        w = c.args[1].value.numpy().astype(np.float32)
        if ch.dense:  # [K, N] -> a 1x1 conv's [N, K, 1, 1] on a [1, K, 1, 1] input
            w = np.ascontiguousarray(w.T)[:, :, None, None]
        lo, hi = ranges[ch.name]
        sx = max(abs(lo), abs(hi), 1e-12) / 127.0
        ylo, yhi = ranges[ch.name + ":out"]
        sy = max(yhi if ch.relu else max(abs(ylo), abs(yhi)), 1e-12) / 127.0
        wq, sw, shift = conv.shift_quantize(w, sx, sy)
        bias = ch.bias if ch.bias is not None else np.zeros(w.shape[0], np.float32)
        bq = conv.rounded_bias(np.round(bias / (sx * sw)), shift)
        if conv.acc_bound(wq, bq, None) >= 2**31:
            ch.reason = "accumulator range exceeds 32 bits"
            continue
        in_shape = tuple(int(v) for v in c.args[0].ty.shape.values)
        geometry = {}
        if ch.dense:
            in_shape = (1, in_shape[1], 1, 1)
        else:
            a = c.attrs
            geometry = {"stride": tuple(int(s) for s in a.strides), "padding": tuple(int(p) for p in a.padding)}
        layer = conv.ConvLayer(wq, bq.astype(np.int32), shift, ch.relu, in_shape, **geometry)
        try:
            prog = codegen.compile_conv(layer, cfg)
        except conv.NotOffloadable as e:
            ch.reason = str(e)
            continue
        default_cycles = codegen.cycles(prog, cfg).cycles
        record = tuned.get(json.dumps(layer.workload(), sort_keys=True))
        if record is not None and record[0] != prog.schedule:
            prog = codegen.compile_conv(layer, cfg, record[0])
        out.append(
            (
                ch,
                codegen.to_layer_program(prog, ch.name, cfg),
                {
                    "sx": sx,
                    "sy": sy,
                    "schedule": prog.schedule.to_json(),
                    "tuned": record is not None,
                    "default_cycles": default_cycles,
                    "macs": int(np.prod(layer.out_shape)) * int(np.prod(w.shape[1:])),
                },
            )
        )
    return out


def _lower_layer(bb, ch: Chain, x, compiled: tuple, uid: str):
    """quantize (CPU) -> the layer's packed function (accelerator) -> dequantize (CPU)."""
    index, prog, info = compiled
    op = relax.op
    xq = bb.emit(
        op.astype(op.clip(op.round(op.multiply(x, relax.const(np.float32(1.0 / info["sx"])))), -127.0, 127.0), "int8")
    )
    if ch.dense:
        xq = bb.emit(op.reshape(xq, list(prog.in_shape)))
    yq = bb.emit(
        relax.call_dps_packed(runtime.func_name(uid, index), [xq], relax.TensorType(list(prog.out_shape), "int8"))
    )
    if ch.dense:
        yq = bb.emit(op.reshape(yq, [1, prog.out_shape[1]]))
    return op.multiply(op.astype(yq, "float32"), relax.const(np.float32(info["sy"])))


@relax.expr_functor.mutator
class _Taps(relax.PyExprMutator):
    """Each offloadable chain's input and output become extra outputs (calibration)."""

    def __init__(self, mod, chains: list[Chain]):
        super().__init__(mod)
        self.by_end = {ch.end: ch for ch in chains if ch.reason is None}
        self.taps: list = []

    def visit_call_(self, call):
        ch = self.by_end.get(call)
        new = super().visit_call_(call)
        if ch is None:
            return new
        self.taps.append((ch.name, self.builder_.emit_output(self.visit_expr(ch.x))))
        v = self.builder_.emit_output(new)
        self.taps.append((ch.name + ":out", v))
        return v


def tapped(mod, chains):
    r = _Taps(mod, chains)
    main = r.visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out["main"] = with_taps(main, [v for _, v in r.taps]) if r.taps else main
    return relax.transform.Normalize()(out), [n for n, _ in r.taps]


def partition(mod, chains: list[Chain]) -> tvm.IRModule:
    """TVM's partitioning: FuseOpsByPattern turns each offloadable chain into a composite function
    (`vta.conv2d_bias_relu`, `vta.dense_bias_relu`, ...; its check accepts exactly the chains
    find_chains accepted, each one whole), MergeCompositeFunctions groups neighbouring composites
    into `Codegen="vta"` functions."""
    from tvm.relax.dpl import is_const, is_op, wildcard
    from tvm.relax.transform import FusionPattern

    accepted = {_weight_key(ch.conv): ch for ch in chains if ch.reason is None}

    def check(ctx) -> bool:
        # by weights, not object identity: fusing one pattern rebuilds the calls downstream of it
        ch = accepted.get(_weight_key(ctx.annotated_expr["root"]))
        return ch is not None and _op(ctx.matched_expr) == _op(ch.end)

    patterns = []
    for base, tag in (("relax.nn.conv2d", "conv2d"), ("relax.matmul", "dense")):
        root = is_op(base)(wildcard(), is_const())
        add = is_op("relax.add")(root, is_const())
        for name, top in (
            (f"vta.{tag}_bias_relu", is_op("relax.nn.relu")(add)),
            (f"vta.{tag}_bias", add),
            (f"vta.{tag}_relu", is_op("relax.nn.relu")(root)),
            (f"vta.{tag}", root),
        ):
            patterns.append(FusionPattern(name, top, {"root": root}, check))
    fused = relax.transform.FuseOpsByPattern(patterns, bind_constants=True, annotate_codegen=False)(mod)
    return relax.transform.MergeCompositeFunctions()(fused)


def _weight_key(call) -> bytes:
    w = call.args[1].value.numpy()
    return w.tobytes() + str(w.shape).encode()


def _root_weight(func) -> bytes:
    found = []
    relax.analysis.post_order_visit(
        func.body, lambda e: found.append(e) if _op(e) in ("relax.nn.conv2d", "relax.matmul") else None
    )
    return _weight_key(found[0])


@relax.expr_functor.mutator
class _Lower(relax.PyExprMutator):
    """Inline every `Codegen="vta"` function, each composite call in it lowered to its layer's
    accelerator call (the composite is matched to its chain by its weights)."""

    def __init__(self, mod, chains: list[Chain], compiled: dict, uid: str):
        super().__init__(mod)
        self.mod, self.compiled, self.uid = mod, compiled, uid
        self.by_weight = {_weight_key(ch.conv): ch for ch in chains if ch.reason is None}
        self.lowered = 0

    def visit_call_(self, call):
        f = self.mod[call.op] if isinstance(call.op, tvm.ir.GlobalVar) else None
        attrs = (f.attrs or {}) if isinstance(f, relax.Function) else {}
        if "Composite" not in attrs and "Codegen" not in attrs:
            return super().visit_call_(call)
        args = [self.visit_expr(a) for a in call.args]
        if "Composite" in attrs:
            return self._layer(f, args)
        for p, a in zip(f.params, args):
            self.set_var_remap(p, a)
        local = {}  # MergeCompositeFunctions binds each composite as a local function inside the Codegen one
        for block in f.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Function):
                    local[b.var] = v
                    continue
                callee = local.get(v.op) if isinstance(v, relax.Call) and isinstance(v.op, relax.Var) else None
                new = (
                    self._layer(callee, [self.visit_expr(a) for a in v.args])
                    if callee is not None
                    else self.visit_expr(v)
                )
                self.set_var_remap(b.var, self.builder_.emit(new))
        return self.visit_expr(f.body.body)

    def _layer(self, composite, args):
        ch = self.by_weight[_root_weight(composite)]
        self.lowered += 1
        return _lower_layer(self.builder_, ch, args[0], self.compiled[ch.name], self.uid)


def offloaded(mod, chains, layers, uid: str):
    compiled = {ch.name: (i, prog, info) for i, (ch, prog, info) in enumerate(layers)}
    offload = [
        dataclasses.replace(ch, reason=None)
        if ch.name in compiled
        else dataclasses.replace(ch, reason=ch.reason or "not compiled")
        for ch in chains
    ]
    parts = partition(mod, offload)
    lower = _Lower(parts, offload, compiled, uid)
    main = lower.visit_expr(parts["main"])
    keep = {
        gv: f
        for gv, f in parts.functions.items()  # the partition's functions are all inlined now
        if not (isinstance(f, relax.Function) and f.attrs and ("Codegen" in f.attrs or "Composite" in f.attrs))
    }
    out = tvm.IRModule(keep, attrs=parts.attrs)
    out["main"] = main
    if lower.lowered != len(compiled):
        raise AssertionError(f"partitioned {lower.lowered} accelerator layers, compiled {len(compiled)}")
    return relax.transform.DeadCodeElimination(["main"])(relax.transform.Normalize()(out))


def vta_flow(imported, options, layout: str, where: str) -> Optimized:
    """The accelerator row of compiler/flows.py: the optimized module with each offloadable chain
    calling its layer's program, the programs as artifact members, and the report's `vta` section."""
    import time

    t0 = time.perf_counter()
    cfg = options.target.vta_config()
    pre = optimize(imported.mod, options, layout=layout, where=where, part="pre")
    chains = find_chains(pre.mod["main"], imported.onnx_model, cfg)
    mod, names = tapped(pre.mod, chains)
    ranges = calibrate(mod, names, imported, options, layout, where).ranges
    layers = make_layers(chains, ranges, cfg, tuned_records(options.tuning_db))
    members = runtime.pack(cfg, [prog for _, prog, _ in layers])
    uid = runtime.digest(members)
    opt = finish(pre, offloaded(pre.mod, chains, layers, uid), options, layout, where)
    report = simulate_report(cfg, layers, chains)
    report["seconds"] = {"partition_calibrate_program": round(time.perf_counter() - t0, 3)}
    opt.report["vta"] = report
    opt.members = members
    return opt


def tuned_records(db_dir) -> dict:
    """The best schedule of each workload in an accelerator tuning database folder ({} for none)."""
    from .tune import best_schedules, load_records

    return best_schedules(load_records(db_dir)) if db_dir else {}


def offload_plan(model, options, cfg: VTAConfig) -> dict[str, list[str]]:
    """{workload key: [layer names]} of the layers a compile with these options offloads (shapes
    only: no calibration), for `kiln tune`."""
    from ...frontends.importer import import_onnx

    imported = import_onnx(model, options.shapes, frozen=options.freeze_inputs)
    layout = options.layout
    pre = optimize(imported.mod, options, layout=layout, where=str(model), part="pre")
    out: dict[str, list[str]] = {}
    for ch in find_chains(pre.mod["main"], imported.onnx_model, cfg):
        if ch.reason is not None:
            continue
        key = json.dumps(_shape_workload(ch), sort_keys=True)
        out.setdefault(key, []).append(ch.name)
    return out


def _shape_workload(ch: Chain) -> dict:
    """conv.ConvLayer.workload() of the layer make_layers builds for this chain."""
    c = ch.conv
    shape = [int(v) for v in c.args[0].ty.shape.values]
    wshape = [int(v) for v in c.args[1].ty.shape.values]
    if ch.dense:
        return {
            "in": [1, shape[1], 1, 1],
            "out_channels": wshape[1],
            "kernel": [1, 1],
            "stride": [1, 1],
            "padding": [0, 0, 0, 0],
            "relu": ch.relu,
            "residual": False,
        }
    a = c.attrs
    return {
        "in": shape,
        "out_channels": wshape[0],
        "kernel": wshape[2:],
        "stride": [int(s) for s in a.strides],
        "padding": [int(p) for p in a.padding],
        "relu": ch.relu,
        "residual": False,
    }


def simulate_report(cfg: VTAConfig, layers, chains) -> dict:
    """Simulated cycles per offloaded layer (the timing model does not depend on the data: a
    timing-only run of the stored stream), totals, achieved GOPS at the board's clock and
    utilization of the MAC array; with each layer's cycles under the default schedule beside."""
    from .sim import Simulator

    per, total, gemm, macs = [], 0, 0, 0
    for ch, prog, info in layers:
        st = Simulator(cfg, None, timing_only=True).run(runtime.LayerRunner(cfg, prog).insns)
        per.append(
            {
                "layer": ch.name,
                "cycles": st.cycles,
                "gemm_cycles": st.gemm_cycles,
                "macs": info["macs"],
                "utilization": round(info["macs"] / max(st.cycles * cfg.macs_per_cycle, 1), 4),
                "schedule": info["schedule"],
                "tuned": info["tuned"],
                "default_cycles": info["default_cycles"],
                "insns": st.insns,
                "busy": st.busy,
                "stall": st.stall,
                "dram_bytes": {"load": st.load_bytes, "store": st.store_bytes},
            }
        )
        total, gemm, macs = total + st.cycles, gemm + st.gemm_cycles, macs + info["macs"]
    seconds = total / (cfg.clock_mhz * 1e6)
    default_total = sum(info["default_cycles"] for _, _, info in layers)
    return {
        "config": cfg.to_json(),
        "offloaded": [ch.name for ch, _, _ in layers],
        "not_offloaded": {ch.name: ch.reason for ch in chains if ch.reason is not None},
        "sim_cycles_total": total,
        "sim_cycles_default_schedules": default_total,
        "sim_gemm_cycles": gemm,
        "macs_offloaded": macs,
        "sim_seconds_at_clock": round(seconds, 6),
        "gops": round(2 * macs / seconds / 1e9, 3) if seconds else 0.0,
        "utilization": round(macs / max(total * cfg.macs_per_cycle, 1), 4),
        "layers": per,
    }
