"""conv2d + bias (+ residual) + requantization on the accelerator: int8 NCHW input, int8 OIHW
weights, int32 accumulation, then on the tensor ALU

    acc = conv(x, w) [+ residual * rmul[o]]        (the residual loaded as int8 into acc, scaled, then accumulated)
    y   = clip((acc + bias[o]) >> shift[o], lo, 127)

with the bias added in the GEMM (ONES x bias weights, `bias_weights`; an ALU ADD if too large)
and 3 ALU ops (SHR shift, MAX lo, MIN 127; +1 MUL for a residual): the weights are quantized
per channel with scales that make the requantization multiplier a power of two
(`shift_quantize`), and the rounding constant 2^(shift-1) is folded into `bias`, as VTA's own
shift-based flow does (vta-spec 4.2). STORE truncates to int8. `reference` is the same integer
arithmetic in numpy, so an offloaded layer is checked bit for bit.

Layouts (vta-spec 4.3): activations NCHW -> NCHW1n16c, weights OIHW -> OIHW16o16i, channels
zero-padded to the block. A `Schedule` says how a layer is tiled (compiler/backends/vta/codegen.py turns it into a
stream); `plan` is the default heuristic, `check` refuses a schedule that does not fit."""

from __future__ import annotations

import dataclasses

import numpy as np

from ...errors import OptionsError
from .config import VTAConfig


class NotOffloadable(Exception):
    """Why a layer (or a schedule of it) cannot run on the accelerator (goes into the report)."""


@dataclasses.dataclass(frozen=True)
class ConvLayer:
    weight: np.ndarray  # int8 [O, I, KH, KW]
    bias: np.ndarray  # int32 [O], in accumulator units, the rounding constant 2^(shift-1) included
    shift: np.ndarray  # int32 [O]: arithmetic right shift (negative: left shift)
    relu: bool
    in_shape: tuple[int, int, int, int]  # N, C, H, W
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    rmul: np.ndarray | None = None  # int32 [O]: a residual input (int8, the output's shape) times rmul joins acc

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        n, _, h, w = self.in_shape
        o, _, kh, kw = self.weight.shape
        pt, pl, pb, pr = self.padding
        return n, o, (h + pt + pb - kh) // self.stride[0] + 1, (w + pl + pr - kw) // self.stride[1] + 1

    def workload(self) -> dict:
        """What the cycle count depends on (not the values): the tuning database's key."""
        o, c, kh, kw = self.weight.shape
        return {
            "in": list(self.in_shape),
            "out_channels": o,
            "kernel": [kh, kw],
            "stride": list(self.stride),
            "padding": list(self.padding),
            "relu": self.relu,
            "residual": self.rmul is not None,
        }


MAX_SHIFT = 31


def shift_quantize(w: np.ndarray, sx: float, sy: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-output-channel int8 weights whose scale sw[o] makes sx * sw[o] / sy = 2^-shift[o]
    exactly: (wq int8, sw float64, shift int32). Each channel keeps the largest grid that fits
    127, so it uses between half and all of the int8 range."""
    o = w.shape[0]
    top = np.abs(w.reshape(o, -1)).max(1).astype(np.float64)
    ratio = 127.0 * sy / (sx * np.maximum(top, 1e-30))
    shift = np.where(top > 0, np.floor(np.log2(ratio)), 0).clip(-MAX_SHIFT, MAX_SHIFT).astype(np.int32)
    sw = sy * 2.0 ** (-shift.astype(np.float64)) / sx
    wq = np.clip(np.round(w / sw.reshape(-1, *[1] * (w.ndim - 1))), -127, 127).astype(np.int8)
    return wq, sw, shift


def rounded_bias(bias_acc: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """The bias in accumulator units with the round-half-up constant of the shift folded in."""
    return (bias_acc.astype(np.int64) + np.where(shift > 0, 1 << np.maximum(shift - 1, 0), 0)).astype(np.int64)


def acc_bound(layer_w: np.ndarray, bias: np.ndarray, rmul: np.ndarray | None) -> float:
    """The largest |accumulator| any int8 input can produce (must stay under 2^31)."""
    o = layer_w.shape[0]
    b = np.abs(layer_w.astype(np.int64)).reshape(o, -1).sum(1) * 127 + np.abs(bias.astype(np.int64))
    if rmul is not None:
        b = b + 127 * np.abs(rmul.astype(np.int64))
    return float(b.max())


def wrap32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.int64).astype(np.uint32).view(np.int32).astype(np.int64)


def reference(layer: ConvLayer, x: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
    """The layer's exact integer result (int8 NCHW) in numpy, in the ALU's order and wrap-around."""
    wt = layer.weight.astype(np.int64)
    _, _, kh, kw = wt.shape
    pt, pl, pb, pr = layer.padding
    sh, sw = layer.stride
    _, o, oh, ow = layer.out_shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    acc = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for a in range(kh):
        for b in range(kw):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, a : a + sh * oh : sh, b : b + sw * ow : sw], wt[:, :, a, b])
    col = lambda v: v.reshape(-1)[:o].astype(np.int64).reshape(1, -1, 1, 1)
    if layer.rmul is not None:
        if residual is None:
            raise ValueError("this layer adds a residual input: pass it")
        acc = wrap32(wrap32(residual.astype(np.int64) * col(layer.rmul)) + wrap32(acc))
    y = wrap32(wrap32(acc) + col(layer.bias))
    s = col(layer.shift)
    y = np.where(s >= 0, y >> np.clip(s, 0, 31), wrap32(y << np.clip(-s, 0, 31)))
    return np.clip(y, 0 if layer.relu else -127, 127).astype(np.int8)


ORDERS = ("oc", "row")  # oc: output-channel tiles outer (weights stay), row: row tiles outer (inputs stay)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a layer is tiled. An output tile is `tco` output-channel blocks x `th` output rows (all
    columns); it accumulates over input-channel steps of `tci` blocks each (input-channel tiling),
    each step's input rows and weights loaded by DMA. `double`: two halves of every buffer, so the
    next step's loads and the previous tile's store overlap this step's GEMM (VTA's virtual
    threads); without it each buffer is whole and the modules take turns. A buffer half that
    still holds what a step needs is not loaded again."""

    tco: int
    th: int
    tci: int
    order: str = "oc"
    double: bool = True

    def __post_init__(self):
        if self.order not in ORDERS:
            raise OptionsError(f"schedule order {self.order!r}", where="vta schedule", fix=f"use one of {ORDERS}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> Schedule:
        return Schedule(int(d["tco"]), int(d["th"]), int(d["tci"]), str(d["order"]), bool(d["double"]))


@dataclasses.dataclass(frozen=True)
class Dims:
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    ib: int  # input-channel blocks
    ob: int  # output-channel blocks
    oh: int
    ow: int
    x_total: int  # padded input row length (elements)


def dims(layer: ConvLayer, cfg: VTAConfig) -> Dims:
    n, c, h, w = layer.in_shape
    o, _, kh, kw = layer.weight.shape
    _, _, oh, ow = layer.out_shape
    _, pl, _, pr = layer.padding
    if n != 1:
        raise NotOffloadable("batch > 1")
    if max(layer.padding) > 15:
        raise NotOffloadable("padding over 15 (the DMA pad fields are 4 bits)")
    return Dims(c, h, w, o, kh, kw, -(-c // cfg.block), -(-o // cfg.block), oh, ow, w + pl + pr)


N_CONST = 3  # acc slots per output-channel block for constants: bias, shift, residual multiplier


def rows_in(layer: ConvLayer, th: int) -> int:
    return (th - 1) * layer.stride[0] + layer.weight.shape[2]


def check(layer: ConvLayer, s: Schedule, cfg: VTAConfig) -> Dims:
    """The layer's dims if schedule s fits the on-chip buffers and ISA fields, else NotOffloadable."""
    d = dims(layer, cfg)
    if not (1 <= s.tco <= d.ob and 1 <= s.th <= d.oh and 1 <= s.tci <= d.ib):
        raise NotOffloadable(f"schedule {s} outside the layer's {d.ob} oc blocks, {d.oh} rows, {d.ib} ic blocks")
    parts = 2 if s.double else 1
    need = {  # +1 inp element: the bias GEMM's constant vector; +tco wgt elements: its weights
        "inp": s.tci * rows_in(layer, s.th) * d.x_total + 1,
        "wgt": s.tco * s.tci * d.kh * d.kw + s.tco,
        "acc": s.tco * s.th * d.ow + N_CONST * s.tco,
        "uop": s.tco * s.tci * d.kh * d.kw,
    }
    have = {
        "inp": cfg.inp_depth // parts,
        "wgt": cfg.wgt_depth // parts,
        "acc": cfg.acc_depth // parts,
        "uop": cfg.uop_depth // 4,
    }
    over = [f"{k} {need[k]} > {have[k]}" for k in need if need[k] > have[k]]
    if over:
        raise NotOffloadable(f"schedule {s} does not fit the on-chip buffers ({', '.join(over)})")
    if s.th * d.ow >= 1 << 14 or d.ow * s.th > 2047:
        raise NotOffloadable(f"schedule {s}: a tile row count exceeds the ISA's loop fields")
    return d


def plan(layer: ConvLayer, cfg: VTAConfig) -> Schedule:
    """The default heuristic: double-buffered, output-channel tiles outer; as many input-channel
    blocks per step as fit (all of them if possible), then the largest output tile (tco x th)."""
    d = dims(layer, cfg)
    for tci in range(d.ib, 0, -1):
        best = None
        for tco in range(d.ob, 0, -1):
            for th in range(d.oh, 0, -1):
                s = Schedule(tco, th, tci)
                try:
                    check(layer, s, cfg)
                except NotOffloadable:
                    continue
                if best is None or tco * th > best.tco * best.th:
                    best = s
                break
        if best is not None:
            return best
    raise NotOffloadable("no tile fits the on-chip buffers, even one input-channel block per step")


def space(layer: ConvLayer, cfg: VTAConfig) -> list[Schedule]:
    """Every schedule that fits, with tile sizes that split the layer evenly or nearly (the tuner's space)."""
    d = dims(layer, cfg)

    def sizes(n: int) -> list[int]:
        return sorted({-(-n // k) for k in range(1, n + 1)})  # every distinct ceil(n / tiles)

    out = []
    for tci in sizes(d.ib):
        for tco in sizes(d.ob):
            for th in sizes(d.oh):
                for order in ORDERS:
                    for double in (True, False):
                        s = Schedule(tco, th, tci, order, double)
                        try:
                            check(layer, s, cfg)
                        except NotOffloadable:
                            continue
                        out.append(s)
    return out


ONES = np.array([127] * 15 + [1], np.int8)  # the bias GEMM's input vector (a block of 16 lanes)
BIAS_GEMM_MAX = 127 * (15 * 126)  # |bias| the 16 int8 lanes can represent against ONES (with margin)


def alu_epilogue(layer: ConvLayer, cfg: VTAConfig) -> str:
    """The layer's ALU sequence, as codegen emits it (the report says which each layer uses)."""
    ops = ["MUL (residual)"] if layer.rmul is not None else []
    ops += [] if bias_weights(layer.bias, cfg.block) is not None else ["ADD (bias)"]
    return ", ".join([*ops, "SHR", "MAX", "MIN"])


def bias_weights(bias: np.ndarray, blk: int) -> np.ndarray | None:
    """int8 weight blocks [ob, blk(out), blk(in)] with W @ ONES == bias exactly (bias = 127 q + r:
    q spread over 15 lanes, r on the last), or None when a bias is too large (the ALU adds it)."""
    if blk != 16 or np.abs(bias.astype(np.int64)).max(initial=0) > BIAS_GEMM_MAX:
        return None
    ob = -(-len(bias) // blk)
    b = np.zeros(ob * blk, np.int64)
    b[: len(bias)] = bias
    q = np.round(b / 127).astype(np.int64)
    r = b - 127 * q
    lanes = (q[:, None] // 15) + (np.arange(15)[None, :] < (q[:, None] % 15))
    w = np.concatenate([lanes, r[:, None]], 1).astype(np.int8).reshape(ob, blk, blk)
    assert np.array_equal(w.reshape(-1, blk).astype(np.int64) @ ONES.astype(np.int64), b)
    return w
