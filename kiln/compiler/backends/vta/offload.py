"""Partition a float model between the simulated accelerator and the CPU (compile side).

Chains conv2d [+ per-channel bias add] [+ residual add] [+ ReLU] and dense (matmul by a
constant) + bias + ReLU, each intermediate used once, become one accelerator layer (a dense layer
runs as a 1x1 conv on a 1x1 image): the CPU quantizes the input to int8 (symmetric, calibrated scale), the
accelerator runs conv + bias [+ residual add] + requantization (+ ReLU) and writes int8; a
neighbouring accelerator layer takes that int8 as it is, the CPU dequantizes only for its own
consumers. Everything else (the first conv, depthwise convs, pooling, the classifier) stays on
the CPU, and the report says why for each conv that is not offloaded. Each layer's program (tiling,
instruction stream, micro-ops, packed weights) is generated here, at compile time, and stored in
the artifact; the model calls it through a packed function the runtime registers."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

from ....accel.vta import conv, runtime
from ....accel.vta.config import VTAConfig
from ...ir import op_name as _op
from ...ir import var_users, var_uses
from ...optimize import Optimized, optimize
from ...quantize.calibrate import calibrate, finish
from ...quantize.layers import LayerNames, candidate, with_taps
from . import codegen
from .lower import offloaded


@dataclasses.dataclass
class Chain:
    name: str
    conv: relax.Call  # the conv2d, or the matmul of a dense layer (run as a 1x1 conv on a 1x1 image)
    x: relax.Var
    bias: np.ndarray | None
    relu: bool
    end: relax.Expr  # the value whose binding the accelerator layer replaces
    reason: str | None = None
    end_var: relax.Var | None = None  # the variable bound to `end` (what neighbouring layers read)
    residual: relax.Expr | None = None  # the other operand of a residual add the chain ends with (on the ALU)

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
    chains, claimed = [], set()  # claimed: residual adds a chain already ends with
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
        residual = None
        if kind == "conv2d" and not relu and uses.get(var, 0) == 1 and len(nxt) == 1 and nxt[0].var not in claimed:
            add = nxt[0].value
            if _op(add) == "relax.add" and not isinstance(add.args[0], GenericConst):
                other = add.args[1] if add.args[0].same_as(var) else add.args[0]
                if not isinstance(other, GenericConst) and _same_shape(other, var) and not other.same_as(var):
                    end, var, residual = add, nxt[0].var, other
                    claimed.add(var)
                    nxt = users.get(var, [])
        if uses.get(var, 0) == 1 and len(nxt) == 1 and _op(nxt[0].value) == "relax.nn.relu":
            end, var, relu = nxt[0].value, nxt[0].var, True
        chain = Chain(name, c, c.args[0], bias, relu, end, end_var=var, residual=residual)
        chain.reason = _why_cpu(chain, params, cfg)
        chains.append(chain)
    return chains


def _same_shape(a, b) -> bool:
    sa, sb = getattr(a.ty, "shape", None), getattr(b.ty, "shape", None)
    return (
        sa is not None
        and sb is not None
        and len(sa.values) == len(sb.values)
        and all(int(x) == int(y) for x, y in zip(sa.values, sb.values))
        and str(a.ty.dtype) == str(b.ty.dtype) == "float32"
    )


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
    made = _output_scales(chains, ranges)
    for ch in chains:
        if ch.reason is not None:
            continue
        q = _quantize(ch, ranges, made)
        if q is None:
            continue
        try:
            prog, default_cycles, record = _program(q.layer, cfg, tuned)
        except conv.NotOffloadable as e:
            ch.reason = str(e)
            continue
        info = {
            "sx": q.sx,
            "sy": q.sy,
            "sr": q.sr,
            "int8_input_from": q.src["name"] if q.src else None,
            "int8_residual_from": q.rsrc["name"] if q.rsrc else None,
            "schedule": prog.schedule.to_json(),
            "tuned": record is not None,
            "default_cycles": default_cycles,
            "alu_epilogue": conv.alu_epilogue(q.layer, cfg),
            "macs": int(np.prod(q.layer.out_shape)) * q.macs_per_output,
            "name": ch.name,
        }
        out.append((ch, codegen.to_layer_program(prog, ch.name, cfg), info))
    done = {ch.name for ch, _, _ in out}
    for _, _, info in out:  # a producer that stayed on the CPU hands over floats
        for k in ("int8_input_from", "int8_residual_from"):
            info[k] = info[k] if info[k] in done else None
    return out


def _scale(r) -> float:
    """The symmetric int8 scale of a calibrated (min, max) range."""
    return max(abs(r[0]), abs(r[1]), 1e-12) / 127.0


def _output_scales(chains: list[Chain], ranges: dict) -> dict:
    """End variable -> {"name", "sy": output scale} of every offloadable layer: its int8 output feeds
    neighbours as it is (if it ends up on the CPU after all, the neighbour quantizes its float output
    at that same scale)."""
    return {
        ch.end_var: {"name": ch.name, "sy": _out_scale(ranges[ch.name + ":out"], ch.relu)}
        for ch in chains
        if ch.reason is None
    }


def _out_scale(r, relu: bool) -> float:
    """A layer output's int8 scale: after a ReLU the values are >= 0, so [0, max] gets all 127 steps."""
    return max(r[1], 1e-12) / 127.0 if relu else _scale(r)


@dataclasses.dataclass
class _Quantized:
    """A chain's integer layer and the scales it was quantized at (input sx, output sy, residual
    sr), with the accelerator layers whose int8 output it reads directly (src, rsrc: None for floats
    from the CPU)."""

    layer: conv.ConvLayer
    sx: float
    sy: float
    sr: float | None
    src: dict | None
    rsrc: dict | None
    macs_per_output: int


def _quantize(ch: Chain, ranges: dict, made: dict) -> _Quantized | None:
    """The chain as an integer conv layer; None (with ch.reason) when its accumulator could
    overflow 32 bits."""
    w = ch.conv.args[1].value.numpy().astype(np.float32)
    if ch.dense:  # [K, N] -> a 1x1 conv's [N, K, 1, 1] on a [1, K, 1, 1] input
        w = np.ascontiguousarray(w.T)[:, :, None, None]
    src = made.get(ch.x)  # an accelerator layer's output: its int8 and scale, no CPU re-quantization
    sx = src["sy"] if src else _scale(ranges[ch.name])
    sy = made[ch.end_var]["sy"]
    wq, sw, shift = conv.shift_quantize(w, sx, sy)
    bias = ch.bias if ch.bias is not None else np.zeros(w.shape[0], np.float32)
    bq = conv.rounded_bias(np.round(bias / (sx * sw)), shift)
    rsrc, sr, rmul = None, None, None
    if ch.residual is not None:
        rsrc = made.get(ch.residual)
        sr = rsrc["sy"] if rsrc else _scale(ranges[ch.name + ":res"])
        rmul = np.round(sr / (sx * sw)).astype(np.int64)  # residual units -> accumulator units
    if conv.acc_bound(wq, bq, rmul) >= 2**31:
        ch.reason = "accumulator range exceeds 32 bits"
        return None
    in_shape, geometry = _geometry(ch)
    rmul32 = None if rmul is None else rmul.astype(np.int32)
    layer = conv.ConvLayer(wq, bq.astype(np.int32), shift, ch.relu, in_shape, **geometry, rmul=rmul32)
    return _Quantized(layer, sx, sy, sr, src, rsrc, int(np.prod(w.shape[1:])))


def _geometry(ch: Chain) -> tuple[tuple, dict]:
    """The layer's NCHW input shape and its stride/padding (a dense layer: a 1x1 image, the defaults)."""
    c = ch.conv
    in_shape = tuple(int(v) for v in c.args[0].ty.shape.values)
    if ch.dense:
        return (1, in_shape[1], 1, 1), {}
    a = c.attrs
    return in_shape, {"stride": tuple(int(s) for s in a.strides), "padding": tuple(int(p) for p in a.padding)}


def _program(layer: conv.ConvLayer, cfg: VTAConfig, tuned: dict):
    """(program, its cycles under the default schedule, the tuning record or None): compiled with the
    tuned schedule where the database has one for this workload (the default's cycles are reported
    beside it); conv.NotOffloadable when the default schedule does not fit."""
    prog = codegen.compile_conv(layer, cfg)
    default_cycles = codegen.cycles(prog, cfg).cycles
    record = tuned.get(json.dumps(layer.workload(), sort_keys=True))
    if record is not None and record[0] != prog.schedule:
        prog = codegen.compile_conv(layer, cfg, record[0])
    return prog, default_cycles, record


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
        if ch.residual is not None:
            self.taps.append((ch.name + ":res", self.builder_.emit_output(self.visit_expr(ch.residual))))
        v = self.builder_.emit_output(new)
        self.taps.append((ch.name + ":out", v))
        return v


def tapped(mod, chains):
    r = _Taps(mod, chains)
    main = r.visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out["main"] = with_taps(main, [v for _, v in r.taps]) if r.taps else main
    return relax.transform.Normalize()(out), [n for n, _ in r.taps]


def vta_flow(imported, options, layout: str, where: str) -> Optimized:
    """The VTA backend's build flow: the optimized module with each offloadable chain
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
    from ....accel.vta.records import best_schedules, load_records

    return best_schedules(load_records(db_dir)) if db_dir else {}


def offload_plan(model, options, cfg: VTAConfig) -> dict[str, list[str]]:
    """{workload key: [layer names]} of the layers a compile with these options offloads (shapes
    only: no calibration), for `kiln tune`."""
    from ....frontends.importer import import_onnx

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
        "residual": ch.residual is not None,
    }


def simulate_report(cfg: VTAConfig, layers, chains) -> dict:
    """Simulated cycles per offloaded layer (the timing model does not depend on the data: a
    timing-only run of the stored stream), totals, achieved GOPS at the board's clock and
    utilization of the MAC array; with each layer's cycles under the default schedule beside."""
    from ....accel.vta.sim import Simulator

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
                "residual_on_alu": ch.residual is not None,
                "alu_epilogue": info["alu_epilogue"],
                "int8_input_from": info["int8_input_from"],
                "int8_residual_from": info["int8_residual_from"],
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
