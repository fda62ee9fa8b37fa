"""A conv layer and its Schedule -> the accelerator's instruction stream, micro-ops and DRAM layout.

Loop nest: output tiles (tco oc blocks x th rows, order "oc" or "row" outer), and inside each
tile its input-channel steps (tci blocks each): per step the load module brings in the step's
input rows (2D DMA, padding inserted on the fly) and weights, unless a buffer half still holds
them, and compute runs one GEMM over them into the tile's accumulators; after the last step the
ALU requantizes and the store module writes the tile (one 2D STORE).

Tokens (depth 8): load -> compute once per step (its data is in); compute -> load once per step
(the half it read is free: load waits for the token of step k-2, k-1 without double buffering,
before overwriting); compute -> store once per tile (requantized); store -> compute once per tile
(its acc half is free again). Micro-op kernels are cached in the uop buffer (loaded once while
they fit), and each acc half keeps the constants of the output channels it held last."""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np

from . import isa, runtime
from .config import VTAConfig
from .conv import N_CONST, ONES, ConvLayer, Schedule, bias_weights, check, plan
from .sim import Simulator, Stats


@dataclasses.dataclass
class Program:
    """A compiled layer: instruction stream, micro-ops and constants, and where each lives in DRAM."""

    layer: ConvLayer
    schedule: Schedule
    insns: list
    dram_bytes: int
    regions: dict  # name -> (element offset, element count)
    consts: dict  # name -> packed array written into DRAM before each run

    def stream(self, cfg: VTAConfig) -> bytes:
        return isa.encode_stream(self.insns, cfg)


class _Uops:
    """Micro-op kernels: each distinct one stored once in DRAM, loaded into the uop buffer when it
    is not resident (the buffer is refilled from its start when full)."""

    def __init__(self, depth: int):
        self.depth, self.dram, self.at_dram, self.resident, self.fill = depth, [], {}, {}, 0

    def use(self, key, make, insns: list) -> int:
        """The kernel's uop-buffer offset; appends its LOAD(UOP) to insns if needed."""
        if key in self.resident:
            return self.resident[key]
        if key not in self.at_dram:
            self.at_dram[key] = (len(self.dram), make())
            self.dram += self.at_dram[key][1]
        at, uops = self.at_dram[key]
        if self.fill + len(uops) > self.depth:
            self.resident, self.fill = {}, 0
        base = self.fill
        insns.append(
            isa.make(
                isa.LOAD,
                memory_type=isa.MEM_UOP,
                sram_base=base,
                dram_base=("uop", at),
                y_size=1,
                x_size=len(uops),
                x_stride=len(uops),
            )
        )
        self.resident[key], self.fill = base, base + len(uops)
        return base


def compile_conv(layer: ConvLayer, cfg: VTAConfig, schedule: Schedule | None = None) -> Program:
    s = schedule or plan(layer, cfg)
    d = check(layer, s, cfg)
    blk, (sh, sw), (pt, pl, _pb, pr) = cfg.block, layer.stride, layer.padding
    parts = 2 if s.double else 1
    half = {k: getattr(cfg, f"{k}_depth") // parts for k in ("inp", "wgt", "acc")}
    const_at = half["acc"] - N_CONST * s.tco  # constant slots at the end of each acc half
    consts = _pack(layer, d, blk)
    bias_gemm = "bwgt" in consts  # the bias joins in the GEMM (ONES x per-channel weights), not an ALU ADD
    one_at = cfg.inp_depth - 1  # the ONES vector's inp element (conv.check keeps it out of the tiles)
    oc_tiles, row_tiles = range(0, d.ob, s.tco), range(0, d.oh, s.th)
    ic_tiles = list(range(0, d.ib, s.tci))
    tiles = [(c, r) for c in oc_tiles for r in row_tiles]
    if s.order == "row":
        tiles.sort(key=lambda t: (t[1], t[0]))
    uops = _Uops(cfg.uop_depth)
    insns: list[isa.Insn] = []
    held = {"inp": [None] * parts, "wgt": [None] * parts, "const": [None] * parts}
    last = {"inp": parts - 1, "wgt": parts - 1}  # the half each buffer's previous step used
    step = 0
    if bias_gemm:  # the load module's first instruction: the constant vector, once
        insns.append(
            isa.make(
                isa.LOAD,
                memory_type=isa.MEM_INP,
                sram_base=one_at,
                dram_base=("one", 0),
                y_size=1,
                x_size=1,
                x_stride=1,
            )
        )
    for t, (c0, r0) in enumerate(tiles):
        ha = t % parts
        acc_base = ha * half["acc"]
        tco, th = min(s.tco, d.ob - c0), min(s.th, d.oh - r0)
        y0 = r0 * sh - pt
        y1 = (r0 + th - 1) * sh - pt + d.kh  # exclusive
        top, bottom, rows = max(0, -y0), max(0, y1 - d.h), y1 - y0
        first = len(insns)  # the tile's first (compute) instruction waits for the store of tile t-parts
        # --- compute: initialise the tile's accumulators (reset, or the residual scaled by rmul)
        if layer.rmul is not None:
            insns.append(
                isa.make(
                    isa.LOAD,
                    memory_type=isa.MEM_ACC_8BIT,
                    sram_base=acc_base,
                    dram_base=("res", (c0 * d.oh + r0) * d.ow),
                    y_size=tco,
                    x_size=th * d.ow,
                    x_stride=d.oh * d.ow,
                )
            )
        if held["const"][ha] != (c0, tco):
            for j, name in enumerate(("bias", "shift", "rmul")[: N_CONST if layer.rmul is not None else 2]):
                insns.append(
                    isa.make(
                        isa.LOAD,
                        memory_type=isa.MEM_ACC,
                        sram_base=acc_base + const_at + j * s.tco,
                        dram_base=(name, c0),
                        y_size=1,
                        x_size=tco,
                        x_stride=tco,
                    )
                )
            held["const"][ha] = (c0, tco)
        alu_base = uops.use(("alu", ha), partial(_alu_uops, acc_base, const_at, s.tco), insns)
        alu = dict(iter_out=tco, iter_in=th * d.ow, dst_factor_out=th * d.ow, dst_factor_in=1, src_factor_out=1)
        if layer.rmul is not None:
            insns.append(isa.make(isa.ALU, uop_bgn=alu_base + 2, uop_end=alu_base + 3, alu_opcode=isa.ALU_MUL, **alu))
        else:
            insns.append(
                isa.make(
                    isa.GEMM,
                    reset_reg=1,
                    uop_bgn=alu_base + 3,
                    uop_end=alu_base + 4,
                    iter_out=tco,
                    iter_in=th * d.ow,
                    dst_factor_out=th * d.ow,
                    dst_factor_in=1,
                )
            )
        insns[first].f["pop_next_dep"] = int(t >= parts)
        # --- input-channel steps
        for i0 in ic_tiles:
            tci = min(s.tci, d.ib - i0)
            where = {}
            loads = []
            for buf, key in (("inp", (i0, tci, r0, th)), ("wgt", (c0, tco, i0, tci))):
                if key in held[buf]:
                    where[buf] = held[buf].index(key)
                    continue
                hb = (last[buf] + 1) % parts
                where[buf], held[buf][hb] = hb, key
                base = hb * half[buf]
                if buf == "inp":
                    loads += [
                        isa.make(
                            isa.LOAD,
                            memory_type=isa.MEM_INP,
                            sram_base=base + i * rows * d.x_total,
                            dram_base=("inp", ((i0 + i) * d.h + max(y0, 0)) * d.w),
                            y_size=rows - top - bottom,
                            x_size=d.w,
                            x_stride=d.w,
                            y_pad_0=top,
                            y_pad_1=bottom,
                            x_pad_0=pl,
                            x_pad_1=pr,
                        )
                        for i in range(tci)
                    ]
                else:
                    k = d.kh * d.kw
                    if bias_gemm and i0 == 0:  # the bias weights ride with the first step's weights
                        loads.append(
                            isa.make(
                                isa.LOAD,
                                memory_type=isa.MEM_WGT,
                                sram_base=base + tco * tci * k,
                                dram_base=("bwgt", c0),
                                y_size=1,
                                x_size=tco,
                                x_stride=tco,
                            )
                        )
                    loads.append(
                        isa.make(
                            isa.LOAD,
                            memory_type=isa.MEM_WGT,
                            sram_base=base,
                            dram_base=("wgt", (c0 * d.ib + i0) * k),
                            y_size=tco,
                            x_size=tci * k,
                            x_stride=d.ib * k,
                        )
                    )
            for buf in where:
                last[buf] = where[buf]
            if not loads:  # both resident: a no-op load carries the tokens
                loads.append(isa.make(isa.LOAD, memory_type=isa.MEM_INP, sram_base=0, dram_base=("inp", 0)))
            loads[0].f["pop_next_dep"] = int(step >= parts)
            loads[-1].f["push_next_dep"] = 1
            insns += loads
            hi, hw = where["inp"], where["wgt"]
            ib_, ia = hi * half["inp"], hw * half["wgt"]
            gb = uops.use(
                ("gemm", hi, hw, ha, tco, tci, th, rows),
                partial(_gemm_uops, d, acc_base, ib_, ia, tco, tci, th, rows),
                insns,
            )
            n = tco * tci * d.kh * d.kw
            insns.append(
                isa.make(
                    isa.GEMM,
                    uop_bgn=gb,
                    uop_end=gb + n,
                    iter_out=th,
                    iter_in=d.ow,
                    dst_factor_out=d.ow,
                    dst_factor_in=1,
                    src_factor_out=sh * d.x_total,
                    src_factor_in=sw,
                    pop_prev_dep=1,
                    push_prev_dep=int(not (bias_gemm and i0 == 0)),
                )
            )
            if bias_gemm and i0 == 0:  # acc += ONES x bias weights, every pixel: 1 cycle each (an ALU ADD takes 2)
                bb = uops.use(
                    ("bias", hw, ha, tco, tci, th),
                    partial(_bias_uops, d, acc_base, one_at, ia + tco * tci * d.kh * d.kw, tco, th),
                    insns,
                )
                insns.append(
                    isa.make(
                        isa.GEMM,
                        uop_bgn=bb,
                        uop_end=bb + tco,
                        iter_out=1,
                        iter_in=th * d.ow,
                        dst_factor_in=1,
                        push_prev_dep=1,
                    )
                )
            step += 1
        # --- requantization on the ALU: ADD bias, SHR shift, MAX lo, MIN 127
        seq = [] if bias_gemm else [(isa.ALU_ADD, 0, 0)]
        seq += [(isa.ALU_SHR, 1, 0), (isa.ALU_MAX, 3, 0 if layer.relu else -127)]
        seq.append((isa.ALU_MIN, 3, 127))
        alu_base = uops.use(("alu", ha), partial(_alu_uops, acc_base, const_at, s.tco), insns)
        for j, (op, u, imm) in enumerate(seq):
            insns.append(
                isa.make(
                    isa.ALU,
                    uop_bgn=alu_base + u,
                    uop_end=alu_base + u + 1,
                    alu_opcode=op,
                    use_imm=int(u == 3),
                    imm=imm,
                    push_next_dep=int(j == len(seq) - 1),
                    **alu,
                )
            )
        # --- store: the tile, one 2D DMA (acc rows co*th*ow.. are contiguous)
        insns.append(
            isa.make(
                isa.STORE,
                memory_type=isa.MEM_OUT,
                sram_base=acc_base,
                dram_base=("out", (c0 * d.oh + r0) * d.ow),
                y_size=tco,
                x_size=th * d.ow,
                x_stride=d.oh * d.ow,
                pop_prev_dep=1,
                push_prev_dep=1,
            )
        )
    # drain: compute takes the store tokens it has not taken yet, then FINISH
    for _ in range(min(parts, len(tiles))):
        insns.append(isa.make(isa.ALU, uop_bgn=0, uop_end=0, iter_out=0, iter_in=0, pop_next_dep=1))
    insns.append(isa.make(isa.FINISH))
    consts["uop"] = np.array([u.encode(cfg) for u in uops.dram], np.uint32)
    regions, size = _layout(cfg, d, consts, layer.rmul is not None)
    for i in insns:  # DRAM addresses were written as (region, offset): make them absolute element addresses
        base = i.f.get("dram_base")
        if isinstance(base, tuple):
            i.f["dram_base"] = regions[base[0]][0] + base[1]
    return Program(layer, s, insns, size, regions, consts)


def _alu_uops(acc_base: int, const_at: int, tco: int) -> list[isa.Uop]:
    """The tile's ALU kernels, one micro-op each (the loop over oc blocks is the instruction's outer
    loop): operand bias, shift, rmul, none (immediates, and the GEMM reset)."""
    return [isa.Uop(acc_base, acc_base + const_at + j * tco) for j in range(N_CONST)] + [isa.Uop(acc_base, 0)]


def _bias_uops(d, acc_base, one_at, bwgt_base, tco, th) -> list[isa.Uop]:
    return [isa.Uop(acc_base + co * th * d.ow, one_at, bwgt_base + co) for co in range(tco)]


def _gemm_uops(d, acc_base, inp_base, wgt_base, tco, tci, th, rows) -> list[isa.Uop]:
    return [
        isa.Uop(
            acc_base + co * th * d.ow,
            inp_base + i * rows * d.x_total + a * d.x_total + b,
            wgt_base + ((co * tci + i) * d.kh + a) * d.kw + b,
        )
        for co in range(tco)
        for i in range(tci)
        for a in range(d.kh)
        for b in range(d.kw)
    ]


def _pack(layer: ConvLayer, d, blk: int) -> dict:
    wq = np.zeros((d.ob * blk, d.ib * blk, d.kh, d.kw), np.int8)
    wq[: d.o, : d.c] = layer.weight
    wpk = wq.reshape(d.ob, blk, d.ib, blk, d.kh, d.kw).transpose(0, 2, 4, 5, 1, 3)  # OIHW16o16i
    pad_o = lambda v: np.concatenate([v.astype(np.int32), np.zeros(d.ob * blk - d.o, np.int32)]).reshape(d.ob, 1, blk)
    out = {"wgt": np.ascontiguousarray(wpk), "bias": pad_o(layer.bias), "shift": pad_o(layer.shift)}
    bw = bias_weights(layer.bias, blk)
    if bw is not None:
        out["bwgt"], out["one"] = bw, ONES.reshape(1, 1, blk)
    if layer.rmul is not None:
        out["rmul"] = pad_o(layer.rmul)
    return out


def _layout(cfg: VTAConfig, d, consts: dict, residual: bool) -> tuple[dict, int]:
    """Each region's (element offset, count), 64-byte aligned, and the DRAM size in bytes."""
    sizes = {
        "inp": (d.ib * d.h * d.w, cfg.inp_elem_bytes),
        "wgt": (d.ob * d.ib * d.kh * d.kw, cfg.wgt_elem_bytes),
        "bias": (d.ob, cfg.acc_elem_bytes),
        "shift": (d.ob, cfg.acc_elem_bytes),
        "out": (d.ob * d.oh * d.ow, cfg.out_elem_bytes),
        "uop": (len(consts["uop"]), 4),
    }
    if "bwgt" in consts:
        sizes["bwgt"] = (d.ob, cfg.wgt_elem_bytes)
        sizes["one"] = (1, cfg.inp_elem_bytes)
    if residual:
        sizes["rmul"] = (d.ob, cfg.acc_elem_bytes)
        sizes["res"] = (d.ob * d.oh * d.ow, cfg.out_elem_bytes)
    regions, pos = {}, 0
    for name, (count, eb) in sizes.items():
        pos = -(-pos // max(64, eb)) * max(64, eb)  # an element index is only exact on an element boundary
        regions[name] = (pos // eb, count)
        pos += count * eb
    return regions, -(-pos // 64) * 64 + 64


def to_layer_program(prog: Program, name: str, cfg: VTAConfig) -> runtime.LayerProgram:
    """What the artifact stores for a compiled layer (the reference unpacks the weights from "wgt")."""
    layer = prog.layer
    return runtime.LayerProgram(
        name,
        tuple(layer.in_shape),
        tuple(layer.out_shape),
        tuple(layer.stride),
        tuple(layer.padding),
        layer.relu,
        layer.rmul is not None,
        prog.dram_bytes,
        {k: list(v) for k, v in prog.regions.items()},
        {"stream": np.frombuffer(prog.stream(cfg), np.uint8).copy(), **prog.consts},
    )


def run(prog: Program, x: np.ndarray, cfg: VTAConfig, residual: np.ndarray | None = None):
    """Run the layer on int8 NCHW input x on the simulator: (int8 NCHW output, its Stats)."""
    r = runtime.LayerRunner(cfg, to_layer_program(prog, "layer", cfg))
    return r.run(x, residual=residual), r.stats


def cycles(prog: Program, cfg: VTAConfig) -> Stats:
    """The program's simulated Stats from the timing model alone (no data: what the tuner measures)."""
    return Simulator(cfg, None, timing_only=True).run(prog.insns)
