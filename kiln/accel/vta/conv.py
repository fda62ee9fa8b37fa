"""conv2d + bias + requantization on the accelerator: int8 NCHW input, int8 OIHW weights, int32
accumulation, then on the tensor ALU  y = clip(((acc + bias) >> s1) * m[o] >> s2, lo, 127)  with
round-half-up shifts (ADD 2^(s-1), SHR s, in steps of at most 15 bits so the constant fits the
16-bit immediate), and STORE truncating to int8. `reference` is the same
integer arithmetic in numpy, so an offloaded layer can be checked bit for bit.

Layouts (vta-spec 4.3): activations NCHW -> NCHW1n16c, weights OIHW -> OIHW16o16i, channels
zero-padded to the block. Tiling: a tile is `tco` output-channel blocks x `th` output rows (all
input channels, all columns); input rows come in by 2D DMA with the zero padding inserted on the
fly. Tiles alternate between two halves of the inp/wgt/acc/uop buffers so the load of tile k+1 and
the store of tile k-1 overlap tile k's compute (tokens: load waits for compute to release the
half it reuses, compute for the store of the tile that used its acc half)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from . import isa, runtime
from .config import VTAConfig
from .sim import Stats


class NotOffloadable(Exception):
    """Why a layer stays on the CPU (goes into the report)."""


@dataclasses.dataclass(frozen=True)
class ConvLayer:
    weight: np.ndarray  # int8 [O, I, KH, KW]
    bias: np.ndarray  # int32 [O], in accumulator units
    mult: np.ndarray  # int32 [O], 1..255
    shift1: int  # applied before the multiply (keeps it within 32 bits)
    shift2: int
    relu: bool
    in_shape: tuple[int, int, int, int]  # N, C, H, W
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        n, _, h, w = self.in_shape
        o, _, kh, kw = self.weight.shape
        pt, pl, pb, pr = self.padding
        return n, o, (h + pt + pb - kh) // self.stride[0] + 1, (w + pl + pr - kw) // self.stride[1] + 1


def requant_params(real_mult: np.ndarray, acc_bound: float) -> tuple[np.ndarray, int, int]:
    """(m per channel in 1..255, shift1, shift2) with m * 2^-(shift1+shift2) ~ real_mult and
    |acc >> shift1| * 255 < 2^31 for |acc| <= acc_bound."""
    top = float(np.max(real_mult))
    total = max(0, int(math.floor(math.log2(255.0 / top)))) if top > 0 else 0
    m = np.clip(np.round(real_mult * 2.0**total), 1, 255).astype(np.int32)
    s1 = max(0, int(math.ceil(math.log2(max(acc_bound, 1) * 255.0 / 2**31))))
    s1 = min(s1, total)
    return m, s1, total - s1


def reference(layer: ConvLayer, x: np.ndarray) -> np.ndarray:
    """The layer's exact integer result (int8 NCHW), computed in numpy."""
    return runtime.reference(_program_fields(layer, "ref", {}, {}, 0), x)


@dataclasses.dataclass
class Tiling:
    tco: int  # output-channel blocks per tile
    th: int  # output rows per tile
    x_total: int  # padded input row length (elements)
    rows_in: int  # input rows a full tile needs


@dataclasses.dataclass
class Program:
    """A compiled layer: instruction stream, micro-ops and constants, and where each lives in DRAM."""

    layer: ConvLayer
    tiling: Tiling
    insns: list
    dram_bytes: int
    regions: dict  # name -> (element kind, element offset, element count)
    consts: dict  # name -> packed array written into DRAM before each run

    def stream(self, cfg: VTAConfig) -> bytes:
        return isa.encode_stream(self.insns, cfg)


def _dims(layer: ConvLayer, cfg: VTAConfig):
    """n, c, h, w, o, kh, kw, input blocks, output blocks, oh, ow, (pt, pl, pb, pr)."""
    n, c, h, w = layer.in_shape
    o, _, kh, kw = layer.weight.shape
    _, _, oh, ow = layer.out_shape
    return n, c, h, w, o, kh, kw, -(-c // cfg.block), -(-o // cfg.block), oh, ow, layer.padding


def plan(layer: ConvLayer, cfg: VTAConfig) -> Tiling:
    n, c, h, w, o, kh, kw, ib, ob, oh, ow, (pt, pl, pb, pr) = _dims(layer, cfg)
    if n != 1:
        raise NotOffloadable("batch > 1")
    if max(layer.padding) > 15:
        raise NotOffloadable("padding over 15 (the DMA pad fields are 4 bits)")
    x_total = w + pl + pr
    half = lambda depth: depth // 2
    best = None
    for tco in range(ob, 0, -1):
        if tco * ib * kh * kw > min(half(cfg.wgt_depth), half(cfg.uop_depth)):
            continue
        for th in range(oh, 0, -1):
            rows_in = (th - 1) * layer.stride[0] + kh
            if ib * rows_in * x_total > half(cfg.inp_depth) or tco * th * ow + 2 * tco > half(cfg.acc_depth):
                continue
            if best is None or tco * th > best.tco * best.th:
                best = Tiling(tco, th, x_total, rows_in)
            break
    if best is None:
        raise NotOffloadable(
            f"no tile of {ib} input-channel blocks fits the on-chip buffers (needs input-channel tiling)"
        )
    return best


def compile_conv(layer: ConvLayer, cfg: VTAConfig) -> Program:
    t = plan(layer, cfg)
    n, c, h, w, o, kh, kw, ib, ob, oh, ow, (pt, pl, pb, pr) = _dims(layer, cfg)
    blk = cfg.block
    sh, sw = layer.stride
    # DRAM regions, in elements of their kind (all offsets 64-byte aligned)
    wq = np.zeros((ob * blk, ib * blk, kh, kw), np.int8)
    wq[:o, :c] = layer.weight
    wpk = wq.reshape(ob, blk, ib, blk, kh, kw).transpose(0, 2, 4, 5, 1, 3)  # OIHW16o16i
    pad_o = lambda v: np.concatenate([v, np.zeros(ob * blk - o, v.dtype)]).reshape(ob, 1, blk)
    consts = {
        "wgt": np.ascontiguousarray(wpk),
        "bias": pad_o(layer.bias.astype(np.int32)),
        "mult": pad_o(layer.mult.astype(np.int32)),
    }
    sizes = {
        "inp": (ib * h * w, cfg.inp_elem_bytes),
        "wgt": (ob * ib * kh * kw, cfg.wgt_elem_bytes),
        "bias": (ob, cfg.acc_elem_bytes),
        "mult": (ob, cfg.acc_elem_bytes),
        "out": (ob * oh * ow, cfg.out_elem_bytes),
        "uop": (0, 4),
    }
    regions, pos = {}, 0
    uops_all: list[isa.Uop] = []
    insns: list[isa.Insn] = []
    tiles = [(c0, r0) for c0 in range(0, ob, t.tco) for r0 in range(0, oh, t.th)]
    wgt_held = {0: None, 1: None}  # which output-channel tile each half of the weight buffer holds
    for k, (c0, r0) in enumerate(tiles):
        hb = k % 2
        tco, th = min(t.tco, ob - c0), min(t.th, oh - r0)
        inp_base, wgt_base = hb * (cfg.inp_depth // 2), hb * (cfg.wgt_depth // 2)
        acc_base = hb * (cfg.acc_depth // 2)
        bias_slot, mult_slot = acc_base + tco * th * ow, acc_base + tco * th * ow + tco
        # input rows for output rows r0..r0+th-1 (with the padding rows this tile touches)
        y0 = r0 * sh - pt
        y1 = (r0 + th - 1) * sh - pt + kh  # exclusive
        top, bottom = max(0, -y0), max(0, y1 - h)
        rows = y1 - y0
        gemm = [
            isa.Uop(
                acc_base + co * th * ow,
                inp_base + i * rows * t.x_total + a * t.x_total + b,
                wgt_base + ((co * ib + i) * kh + a) * kw + b,
            )
            for i in range(ib)
            for a in range(kh)
            for b in range(kw)
            for co in range(tco)
        ]
        # ALU kernels: one micro-op per output-channel block, operand = its bias / multiplier slot, or none (immediates)
        alu = {
            src: [isa.Uop(acc_base + co * th * ow, (slot + co) if slot is not None else 0) for co in range(tco)]
            for src, slot in (("bias", bias_slot), ("mult", mult_slot), ("imm", None))
        }
        uop_gemm_at = len(uops_all)
        kernel = gemm + alu["bias"] + alu["mult"] + alu["imm"]
        uops_all += kernel
        ubase = hb * (cfg.uop_depth // 2)
        at = {"bias": ubase + len(gemm), "mult": ubase + len(gemm) + tco, "imm": ubase + len(gemm) + 2 * tco}
        # --- load module: input rows of every input-channel block, then this tile's weights unless this
        # buffer half still holds them (tile k-2 had the same output channels): weights load once per channel tile
        loads = [
            isa.make(
                isa.LOAD,
                memory_type=isa.MEM_INP,
                sram_base=inp_base + i * rows * t.x_total,
                dram_base=("inp", (i * h + max(y0, 0)) * w),
                y_size=rows - top - bottom,
                x_size=w,
                x_stride=w,
                y_pad_0=top,
                y_pad_1=bottom,
                x_pad_0=pl,
                x_pad_1=pr,
            )
            for i in range(ib)
        ]
        if wgt_held[hb] != c0:
            loads.append(
                isa.make(
                    isa.LOAD,
                    memory_type=isa.MEM_WGT,
                    sram_base=wgt_base,
                    dram_base=("wgt", c0 * ib * kh * kw),
                    y_size=1,
                    x_size=tco * ib * kh * kw,
                    x_stride=tco * ib * kh * kw,
                )
            )
            wgt_held[hb] = c0
        loads[0].f["pop_next_dep"] = int(k >= 2)
        loads[-1].f["push_next_dep"] = 1
        insns += loads
        # --- compute module: micro-ops, bias and multipliers, GEMM, requantization on the ALU
        insns.append(
            isa.make(
                isa.LOAD,
                memory_type=isa.MEM_UOP,
                sram_base=ubase,
                dram_base=("uop", uop_gemm_at),
                y_size=1,
                x_size=len(kernel),
                x_stride=len(kernel),
                pop_next_dep=int(k >= 2),
            )
        )
        for name, slot in (("bias", bias_slot), ("mult", mult_slot)):
            insns.append(
                isa.make(
                    isa.LOAD,
                    memory_type=isa.MEM_ACC,
                    sram_base=slot,
                    dram_base=(name, c0),
                    y_size=1,
                    x_size=tco,
                    x_stride=tco,
                )
            )
        g = dict(iter_out=th, iter_in=ow, dst_factor_out=ow, dst_factor_in=1)
        insns.append(isa.make(isa.GEMM, reset_reg=1, uop_bgn=ubase, uop_end=ubase + tco, **g))
        insns.append(
            isa.make(
                isa.GEMM,
                uop_bgn=ubase,
                uop_end=ubase + len(gemm),
                src_factor_out=sh * t.x_total,
                src_factor_in=sw,
                pop_prev_dep=1,
                push_prev_dep=1,
                **g,
            )
        )
        seq = [(isa.ALU_ADD, "bias", 0)]
        seq += [
            x
            for step in runtime.shift_steps(layer.shift1)
            for x in ((isa.ALU_ADD, "imm", 1 << (step - 1)), (isa.ALU_SHR, "imm", step))
        ]
        seq += [(isa.ALU_MUL, "mult", 0)]
        seq += [
            x
            for step in runtime.shift_steps(layer.shift2)
            for x in ((isa.ALU_ADD, "imm", 1 << (step - 1)), (isa.ALU_SHR, "imm", step))
        ]
        seq += [(isa.ALU_MAX, "imm", 0 if layer.relu else -127), (isa.ALU_MIN, "imm", 127)]
        for j, (op, src, imm) in enumerate(seq):
            insns.append(
                isa.make(
                    isa.ALU,
                    uop_bgn=at[src],
                    uop_end=at[src] + tco,
                    iter_out=1,
                    iter_in=th * ow,
                    dst_factor_in=1,
                    alu_opcode=op,
                    use_imm=int(src == "imm"),
                    imm=imm,
                    push_next_dep=int(j == len(seq) - 1),
                )
            )
        # --- store module
        for co in range(tco):
            insns.append(
                isa.make(
                    isa.STORE,
                    memory_type=isa.MEM_OUT,
                    sram_base=acc_base + co * th * ow,
                    dram_base=("out", ((c0 + co) * oh + r0) * ow),
                    y_size=1,
                    x_size=th * ow,
                    x_stride=th * ow,
                    pop_prev_dep=int(co == 0),
                    push_prev_dep=int(co == tco - 1),
                )
            )
    # drain: compute takes the store tokens of the last two tiles, then FINISH
    for _ in range(min(2, len(tiles))):
        insns.append(isa.make(isa.ALU, uop_bgn=0, uop_end=0, iter_out=0, iter_in=0, pop_next_dep=1))
    insns.append(isa.make(isa.FINISH))
    sizes["uop"] = (len(uops_all), 4)
    for name, (count, eb) in sizes.items():
        align = max(64, eb)  # an element index is only exact on an element boundary
        pos = -(-pos // align) * align
        regions[name] = (pos // eb, count)
        pos += count * eb
    consts["uop"] = np.array([u.encode(cfg) for u in uops_all], np.uint32)
    _resolve(insns, regions)
    return Program(layer, t, insns, -(-pos // 64) * 64 + 64, regions, consts)


def _resolve(insns, regions) -> None:
    """DRAM addresses were written as (region, offset): make them absolute element addresses."""
    for i in insns:
        base = i.f.get("dram_base")
        if isinstance(base, tuple):
            i.f["dram_base"] = regions[base[0]][0] + base[1]


def to_layer_program(prog: Program, name: str, cfg: VTAConfig) -> runtime.LayerProgram:
    """What the artifact stores for a compiled layer."""
    arrays = {"stream": np.frombuffer(prog.stream(cfg), np.uint8).copy(), **prog.consts}  # the reference unpacks "wgt"
    return _program_fields(prog.layer, name, prog.regions, arrays, prog.dram_bytes)


def _program_fields(layer: ConvLayer, name: str, regions: dict, arrays: dict, dram_bytes: int) -> runtime.LayerProgram:
    if "wgt" not in arrays:  # no program: numpy reference only
        arrays = {
            "weight": layer.weight,
            "bias": layer.bias.astype(np.int32),
            "mult": layer.mult.astype(np.int32),
            **arrays,
        }
    return runtime.LayerProgram(
        name,
        tuple(layer.in_shape),
        tuple(layer.out_shape),
        tuple(layer.stride),
        tuple(layer.padding),
        layer.relu,
        layer.shift1,
        layer.shift2,
        dram_bytes,
        {k: list(v) for k, v in regions.items()},
        arrays,
    )


def run(prog: Program, x: np.ndarray, cfg: VTAConfig) -> tuple[np.ndarray, Stats]:
    """Run the layer on int8 NCHW input x: int8 NCHW output and the simulator's stats."""
    r = runtime.LayerRunner(cfg, to_layer_program(prog, "layer", cfg))
    return r.run(x), r.stats
