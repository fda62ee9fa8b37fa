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

from ....accel.vta import isa, runtime
from ....accel.vta.config import VTAConfig
from ....accel.vta.conv import N_CONST, ONES, ConvLayer, Schedule, bias_weights, check, plan
from ....accel.vta.sim import Simulator, Stats


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
    """The layer's program under `schedule` (conv.plan's when None): the loop nest of the module
    docstring, emitted tile by tile; NotOffloadable when the schedule does not fit the buffers."""
    g = _Codegen(layer, cfg, schedule or plan(layer, cfg))
    if g.bias_gemm:  # the load module's first instruction: the constant vector, once
        g.insns.append(_load(isa.MEM_INP, g.one_at, ("one", 0), 1, 1, 1))
    tiles = g.tiles()
    for t, (c0, r0) in enumerate(tiles):
        g.tile(g.place(t, c0, r0))
    # drain: compute takes the store tokens it has not taken yet, then FINISH
    for _ in range(min(g.parts, len(tiles))):
        g.insns.append(isa.make(isa.ALU, uop_bgn=0, uop_end=0, iter_out=0, iter_in=0, pop_next_dep=1))
    g.insns.append(isa.make(isa.FINISH))
    return g.program()


def _load(memory_type: int, sram_base: int, dram_base: tuple, y_size: int, x_size: int, x_stride: int, **f):
    """A LOAD instruction; dram_base is (region, element offset), made absolute by _Codegen.program."""
    return isa.make(
        isa.LOAD,
        memory_type=memory_type,
        sram_base=sram_base,
        dram_base=dram_base,
        y_size=y_size,
        x_size=x_size,
        x_stride=x_stride,
        **f,
    )


@dataclasses.dataclass(frozen=True)
class _Tile:
    """Where one output tile sits: output-channel blocks c0.. (tco of them) x output rows r0.. (th),
    its accumulator half (ha, from acc_base), and the input rows its steps read: from row y0, `rows`
    of them, the first `top` and last `bottom` of those padding (inserted by the DMA, not loaded)."""

    index: int
    c0: int
    r0: int
    tco: int
    th: int
    ha: int
    acc_base: int
    y0: int
    top: int
    bottom: int
    rows: int


class _Codegen:
    """compile_conv's state while it emits: the buffer halves (two with double buffering, so a load
    overlaps the compute on the other half), what each half holds (a step whose inputs or weights
    are still resident skips their load), the micro-op cache and the instruction list."""

    def __init__(self, layer: ConvLayer, cfg: VTAConfig, s: Schedule):
        self.layer, self.cfg, self.s = layer, cfg, s
        self.d = d = check(layer, s, cfg)
        self.parts = parts = 2 if s.double else 1
        self.half = {k: getattr(cfg, f"{k}_depth") // parts for k in ("inp", "wgt", "acc")}
        self.const_at = self.half["acc"] - N_CONST * s.tco  # constant slots at the end of each acc half
        self.consts = _pack(layer, d, cfg.block)
        self.bias_gemm = (
            "bwgt" in self.consts
        )  # the bias joins in the GEMM (ONES x per-channel weights), not an ALU ADD
        self.one_at = cfg.inp_depth - 1  # the ONES vector's inp element (conv.check keeps it out of the tiles)
        self.uops = _Uops(cfg.uop_depth)
        self.insns: list[isa.Insn] = []
        self.held = {"inp": [None] * parts, "wgt": [None] * parts, "const": [None] * parts}
        self.last = {"inp": parts - 1, "wgt": parts - 1}  # the half each buffer's previous step used
        self.step = 0  # input-channel steps emitted so far (a load waits for the compute of step - parts)

    def tiles(self) -> list[tuple[int, int]]:
        """(first oc block, first row) of every output tile, in the schedule's loop order."""
        d, s = self.d, self.s
        tiles = [(c, r) for c in range(0, d.ob, s.tco) for r in range(0, d.oh, s.th)]
        if s.order == "row":
            tiles.sort(key=lambda t: (t[1], t[0]))
        return tiles

    def place(self, t: int, c0: int, r0: int) -> _Tile:
        """Tile t's extent (the last ones may be partial), acc half and the input rows it reads."""
        d, s, (sh, _), (pt, *_) = self.d, self.s, self.layer.stride, self.layer.padding
        ha = t % self.parts
        th = min(s.th, d.oh - r0)
        y0 = r0 * sh - pt
        y1 = (r0 + th - 1) * sh - pt + d.kh  # exclusive
        top, bottom = max(0, -y0), max(0, y1 - d.h)
        return _Tile(t, c0, r0, min(s.tco, d.ob - c0), th, ha, ha * self.half["acc"], y0, top, bottom, y1 - y0)

    def tile(self, tl: _Tile) -> None:
        """One output tile: initialise its accumulators, accumulate every input-channel step,
        requantize, store."""
        first = len(self.insns)  # the tile's first (compute) instruction waits for the store of tile t-parts
        self.init_acc(tl)
        self.insns[first].f["pop_next_dep"] = int(tl.index >= self.parts)
        for i0 in range(0, self.d.ib, self.s.tci):
            self.ic_step(tl, i0)
        self.requantize(tl)
        self.store(tl)

    def alu_kernels(self, tl: _Tile) -> int:
        """The uop-buffer offset of the tile's acc half's ALU kernels (loading them if not resident)."""
        return self.uops.use(("alu", tl.ha), partial(_alu_uops, tl.acc_base, self.const_at, self.s.tco), self.insns)

    def alu_loop(self, tl: _Tile) -> dict:
        """An ALU instruction's loop over the tile: oc blocks outer, the tile's pixels inner."""
        n = tl.th * self.d.ow
        return dict(iter_out=tl.tco, iter_in=n, dst_factor_out=n, dst_factor_in=1, src_factor_out=1)

    def init_acc(self, tl: _Tile) -> None:
        """Compute: the accumulators start as the residual scaled by rmul (loaded, then an ALU MUL),
        or zero (a GEMM with reset); the half's per-channel constants are loaded unless it holds them."""
        d, rmul = self.d, self.layer.rmul
        if rmul is not None:
            x = tl.th * d.ow
            where = ("res", (tl.c0 * d.oh + tl.r0) * d.ow)
            self.insns.append(_load(isa.MEM_ACC_8BIT, tl.acc_base, where, tl.tco, x, d.oh * d.ow))
        if self.held["const"][tl.ha] != (tl.c0, tl.tco):
            for j, name in enumerate(("bias", "shift", "rmul")[: N_CONST if rmul is not None else 2]):
                at = tl.acc_base + self.const_at + j * self.s.tco
                self.insns.append(_load(isa.MEM_ACC, at, (name, tl.c0), 1, tl.tco, tl.tco))
            self.held["const"][tl.ha] = (tl.c0, tl.tco)
        alu_base = self.alu_kernels(tl)
        if rmul is not None:
            mul = dict(uop_bgn=alu_base + 2, uop_end=alu_base + 3, alu_opcode=isa.ALU_MUL)
            self.insns.append(isa.make(isa.ALU, **mul, **self.alu_loop(tl)))
        else:
            n = tl.th * d.ow
            reset = dict(reset_reg=1, uop_bgn=alu_base + 3, uop_end=alu_base + 4)
            self.insns.append(
                isa.make(isa.GEMM, **reset, iter_out=tl.tco, iter_in=n, dst_factor_out=n, dst_factor_in=1)
            )

    def ic_step(self, tl: _Tile, i0: int) -> None:
        """One input-channel step (blocks i0..): load its input rows and weights into a free half
        unless a half still holds them, then GEMM them into the tile's accumulators."""
        tci = min(self.s.tci, self.d.ib - i0)
        where, loads = {}, []
        for buf, key in (("inp", (i0, tci, tl.r0, tl.th)), ("wgt", (tl.c0, tl.tco, i0, tci))):
            if key in self.held[buf]:
                where[buf] = self.held[buf].index(key)
                continue
            hb = (self.last[buf] + 1) % self.parts
            where[buf], self.held[buf][hb] = hb, key
            base = hb * self.half[buf]
            loads += self.inp_loads(tl, i0, tci, base) if buf == "inp" else self.wgt_loads(tl, i0, tci, base)
        self.last.update(where)
        if not loads:  # both resident: a no-op load carries the tokens
            loads.append(isa.make(isa.LOAD, memory_type=isa.MEM_INP, sram_base=0, dram_base=("inp", 0)))
        loads[0].f["pop_next_dep"] = int(self.step >= self.parts)
        loads[-1].f["push_next_dep"] = 1
        self.insns += loads
        self.gemm(tl, i0, tci, where["inp"], where["wgt"])
        self.step += 1

    def inp_loads(self, tl: _Tile, i0: int, tci: int, base: int) -> list:
        """The step's input rows, one 2D DMA per input-channel block, padding inserted on the fly."""
        d, (_, pl, _, pr) = self.d, self.layer.padding
        return [
            _load(
                isa.MEM_INP,
                base + i * tl.rows * d.x_total,
                ("inp", ((i0 + i) * d.h + max(tl.y0, 0)) * d.w),
                tl.rows - tl.top - tl.bottom,
                d.w,
                d.w,
                y_pad_0=tl.top,
                y_pad_1=tl.bottom,
                x_pad_0=pl,
                x_pad_1=pr,
            )
            for i in range(tci)
        ]

    def wgt_loads(self, tl: _Tile, i0: int, tci: int, base: int) -> list:
        """The step's weights, one 2D DMA; the first step's also brings the bias weights (after them)."""
        d, k = self.d, self.d.kh * self.d.kw
        loads = []
        if self.bias_gemm and i0 == 0:  # the bias weights ride with the first step's weights
            loads.append(_load(isa.MEM_WGT, base + tl.tco * tci * k, ("bwgt", tl.c0), 1, tl.tco, tl.tco))
        loads.append(_load(isa.MEM_WGT, base, ("wgt", (tl.c0 * d.ib + i0) * k), tl.tco, tci * k, d.ib * k))
        return loads

    def gemm(self, tl: _Tile, i0: int, tci: int, hi: int, hw: int) -> None:
        """The step's GEMM over input half hi and weight half hw (one micro-op per oc block x ic block
        x kernel tap; the instruction loops over the tile's pixels); on the first step of a bias-GEMM
        layer, then acc += ONES x bias weights at every pixel (1 cycle each; an ALU ADD takes 2)."""
        d, sh, sw = self.d, *self.layer.stride
        ib_, ia = hi * self.half["inp"], hw * self.half["wgt"]
        gb = self.uops.use(
            ("gemm", hi, hw, tl.ha, tl.tco, tci, tl.th, tl.rows),
            partial(_gemm_uops, d, tl.acc_base, ib_, ia, tl.tco, tci, tl.th, tl.rows),
            self.insns,
        )
        bias_now = self.bias_gemm and i0 == 0
        self.insns.append(
            isa.make(
                isa.GEMM,
                uop_bgn=gb,
                uop_end=gb + tl.tco * tci * d.kh * d.kw,
                iter_out=tl.th,
                iter_in=d.ow,
                dst_factor_out=d.ow,
                dst_factor_in=1,
                src_factor_out=sh * d.x_total,
                src_factor_in=sw,
                pop_prev_dep=1,
                push_prev_dep=int(not bias_now),
            )
        )
        if bias_now:
            bb = self.uops.use(
                ("bias", hw, tl.ha, tl.tco, tci, tl.th),
                partial(_bias_uops, d, tl.acc_base, self.one_at, ia + tl.tco * tci * d.kh * d.kw, tl.tco, tl.th),
                self.insns,
            )
            loop = dict(iter_out=1, iter_in=tl.th * d.ow, dst_factor_in=1, push_prev_dep=1)
            self.insns.append(isa.make(isa.GEMM, uop_bgn=bb, uop_end=bb + tl.tco, **loop))

    def requantize(self, tl: _Tile) -> None:
        """Requantization on the ALU: ADD bias (unless the GEMM added it), SHR shift, MAX lo (0 with
        ReLU), MIN 127; the last pushes the store's token."""
        seq = [] if self.bias_gemm else [(isa.ALU_ADD, 0, 0)]
        seq += [(isa.ALU_SHR, 1, 0), (isa.ALU_MAX, 3, 0 if self.layer.relu else -127)]
        seq.append((isa.ALU_MIN, 3, 127))
        alu_base, loop = self.alu_kernels(tl), self.alu_loop(tl)
        for j, (op, u, imm) in enumerate(seq):
            last = int(j == len(seq) - 1)
            ops = dict(uop_bgn=alu_base + u, uop_end=alu_base + u + 1, alu_opcode=op, use_imm=int(u == 3), imm=imm)
            self.insns.append(isa.make(isa.ALU, **ops, push_next_dep=last, **loop))

    def store(self, tl: _Tile) -> None:
        """The tile's output, one 2D DMA (acc rows co*th*ow.. are contiguous)."""
        d = self.d
        self.insns.append(
            isa.make(
                isa.STORE,
                memory_type=isa.MEM_OUT,
                sram_base=tl.acc_base,
                dram_base=("out", (tl.c0 * d.oh + tl.r0) * d.ow),
                y_size=tl.tco,
                x_size=tl.th * d.ow,
                x_stride=d.oh * d.ow,
                pop_prev_dep=1,
                push_prev_dep=1,
            )
        )

    def program(self) -> Program:
        """The Program: micro-ops into their DRAM region, the DRAM layout, and every instruction's
        (region, offset) DRAM address made an absolute element address."""
        consts = self.consts
        consts["uop"] = np.array([u.encode(self.cfg) for u in self.uops.dram], np.uint32)
        regions, size = _layout(self.cfg, self.d, consts, self.layer.rmul is not None)
        for i in self.insns:
            base = i.f.get("dram_base")
            if isinstance(base, tuple):
                i.f["dram_base"] = regions[base[0]][0] + base[1]
        return Program(self.layer, self.s, self.insns, size, regions, consts)


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
