"""The accelerator's side of an artifact, runtime only (no compiler imports): the compiled layer
programs (instruction stream, micro-ops, packed weights and requantization constants, DRAM layout)
as two artifact members, and the packed functions the model's code calls for each offloaded layer
(`kiln.vta.<program digest>.<layer>`), which run the program on a fresh simulator.

The same layer can run on `reference` (numpy, the same integer arithmetic) instead of the
simulator: load(..., accelerator="reference")."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import threading

import numpy as np

from . import isa
from .config import VTAConfig
from .sim import Simulator, Stats

MEMBERS = ("vta.json", "vta.npz")
BACKENDS = ("sim", "reference")


@dataclasses.dataclass
class LayerProgram:
    name: str
    in_shape: tuple  # N, C, H, W (int8)
    out_shape: tuple
    stride: tuple
    padding: tuple
    relu: bool
    shift1: int
    shift2: int
    dram_bytes: int
    regions: dict  # name -> [element offset, count]
    arrays: dict  # stream (uint8), wgt, bias, mult, uop, weight (int8 OIHW, for the reference)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("arrays")
        return d


def pack(cfg: VTAConfig, layers: list[LayerProgram]) -> dict[str, bytes]:
    buf = io.BytesIO()
    np.savez(buf, **{f"{i}.{k}": v for i, l in enumerate(layers) for k, v in l.arrays.items()})
    meta = {"config": dataclasses.asdict(cfg), "layers": [l.to_json() for l in layers]}
    return {"vta.json": json.dumps(meta).encode(), "vta.npz": buf.getvalue()}


def unpack(members: dict[str, bytes]) -> tuple[VTAConfig, list[LayerProgram]]:
    meta = json.loads(members["vta.json"])
    cfg = VTAConfig(**meta["config"])
    with np.load(io.BytesIO(members["vta.npz"]), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    layers = []
    for i, l in enumerate(meta["layers"]):
        mine = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.split(".", 1)[0] == str(i)}
        layers.append(
            LayerProgram(
                **{
                    **l,
                    "in_shape": tuple(l["in_shape"]),
                    "out_shape": tuple(l["out_shape"]),
                    "stride": tuple(l["stride"]),
                    "padding": tuple(l["padding"]),
                    "arrays": mine,
                }
            )
        )
    return cfg, layers


def digest(members: dict[str, bytes]) -> str:
    return hashlib.sha256(members["vta.json"] + members["vta.npz"]).hexdigest()[:16]


def func_name(uid: str, index: int) -> str:
    return f"kiln.vta.{uid}.{index}"


class LayerRunner:
    """Runs one layer program; the instruction stream is decoded once (a malformed one fails at load)."""

    def __init__(self, cfg: VTAConfig, prog: LayerProgram):
        self.cfg, self.prog = cfg, prog
        self.insns = isa.decode_stream(prog.arrays["stream"].tobytes(), cfg)
        self.stats = Stats()
        self.runs = 0
        self._lock = threading.Lock()

    def run(self, x: np.ndarray, backend: str = "sim") -> np.ndarray:
        if backend == "reference":
            return reference(self.prog, x)
        p, cfg, blk = self.prog, self.cfg, self.cfg.block
        _, c, h, w = p.in_shape
        _, o, oh, ow = p.out_shape
        ib, ob = -(-c // blk), -(-o // blk)
        sim = Simulator(cfg, np.zeros(p.dram_bytes, np.uint8))
        xp = np.zeros((ib * blk, h, w), np.int8)
        xp[:c] = x[0]
        views = {
            "inp": sim._dram("inp"),
            "wgt": sim._dram("wgt"),
            "bias": sim._dram("acc"),
            "mult": sim._dram("acc"),
            "uop": sim._dram("uop"),
            "out": sim._dram("out"),
        }
        put = lambda name, a: views[name].__setitem__(slice(p.regions[name][0], p.regions[name][0] + len(a)), a)
        put("inp", xp.reshape(ib, blk, h, w).transpose(0, 2, 3, 1).reshape(-1, *views["inp"].shape[1:]))
        for name in ("wgt", "bias", "mult", "uop"):
            put(name, p.arrays[name].reshape(-1, *views[name].shape[1:]))
        st = sim.run(self.insns)
        with self._lock:
            self.stats.add(st)
            self.runs += 1
        out = views["out"][p.regions["out"][0] : p.regions["out"][0] + ob * oh * ow].reshape(ob, oh, ow, blk)
        return out.transpose(0, 3, 1, 2).reshape(ob * blk, oh, ow)[:o][None].copy()


MAX_STEP = 15  # the rounding constant 2^(s-1) must fit the ALU's signed 16-bit immediate


def shift_steps(s: int) -> list[int]:
    """A right shift by s as ALU steps of at most MAX_STEP bits, each rounding half up (the
    compiled stream and the reference take the same steps)."""
    return [MAX_STEP] * (s // MAX_STEP) + ([s % MAX_STEP] if s % MAX_STEP else [])


def _rshift_round(x: np.ndarray, s: int) -> np.ndarray:
    for step in shift_steps(s):
        x = (x + (1 << (step - 1))) >> step
    return x


def reference(p: LayerProgram, x: np.ndarray) -> np.ndarray:
    """The layer's integer arithmetic in numpy: conv (int64, exact), then int32 bias add, rounded
    shifts, multiply, clip, as the ALU sequence does it."""
    wt = (p.arrays["weight"] if "weight" in p.arrays else _unpack_weight(p)).astype(np.int64)
    _, _, kh, kw = wt.shape
    pt, pl, pb, pr = p.padding
    sh, sw = p.stride
    _, o, oh, ow = p.out_shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    acc = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for a in range(kh):
        for b in range(kw):
            acc += np.einsum("nchw,oc->nohw", xp[:, :, a : a + sh * oh : sh, b : b + sw * ow : sw], wt[:, :, a, b])
    wrap = lambda v: v.astype(np.int64).astype(np.uint32).view(np.int32).astype(np.int64)
    bias = p.arrays["bias"].reshape(-1)[:o].astype(np.int64).reshape(1, -1, 1, 1)
    mult = p.arrays["mult"].reshape(-1)[:o].astype(np.int64).reshape(1, -1, 1, 1)
    y = wrap(_rshift_round(wrap(acc + bias), p.shift1) * mult)
    y = _rshift_round(y, p.shift2)
    return np.clip(y, 0 if p.relu else -127, 127).astype(np.int8)


def _unpack_weight(p: LayerProgram) -> np.ndarray:
    """OIHW int8 weights from the program's OIHW16o16i blocks (the artifact stores them once)."""
    w = p.arrays["wgt"]
    ob, ib, kh, kw, bo, bi = w.shape
    return w.transpose(0, 4, 1, 5, 2, 3).reshape(ob * bo, ib * bi, kh, kw)[: p.out_shape[1], : p.in_shape[1]]


def register(members: dict[str, bytes], backend: str = "sim") -> tuple[str, list[LayerRunner]]:
    """Register one packed function per offloaded layer (before the VM is created); returns the
    program digest (part of the function names) and the runners (their stats)."""
    import tvm

    cfg, layers = unpack(members)
    uid = digest(members)
    runners = [LayerRunner(cfg, l) for l in layers]
    for i, r in enumerate(runners):

        def fn(x, out, r=r):
            out.copyfrom(r.run(x.numpy(), backend))

        tvm.register_global_func(func_name(uid, i), fn, override=True)
    return uid, runners
