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
    residual: bool  # a second int8 input (the output's shape) joins the accumulators
    dram_bytes: int
    regions: dict  # name -> [element offset, count]
    arrays: dict  # stream (uint8), wgt, bias, shift, [rmul], uop, weight (int8 OIHW, for the reference)

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

    def run(self, x: np.ndarray, backend: str = "sim", residual: np.ndarray | None = None) -> np.ndarray:
        if backend == "reference":
            return reference(self.prog, x, residual)
        p, cfg, blk = self.prog, self.cfg, self.cfg.block
        _, o, oh, ow = p.out_shape
        ob = -(-o // blk)
        sim = Simulator(cfg, np.zeros(p.dram_bytes, np.uint8))
        views = {k: sim._dram(v) for k, v in VIEWS.items()}
        put = lambda name, a: views[name].__setitem__(slice(p.regions[name][0], p.regions[name][0] + len(a)), a)
        put("inp", to_blocks(x, blk))
        if p.residual:
            put("res", to_blocks(residual, blk))
        for name in ("wgt", "bias", "shift", "rmul", "uop", "bwgt", "one"):
            if name in p.regions:
                put(name, p.arrays[name].reshape(-1, *views[name].shape[1:]))
        st = sim.run(self.insns)
        with self._lock:
            self.stats.add(st)
            self.runs += 1
        out = views["out"][p.regions["out"][0] : p.regions["out"][0] + ob * oh * ow].reshape(ob, oh, ow, blk)
        return out.transpose(0, 3, 1, 2).reshape(ob * blk, oh, ow)[:o][None].copy()


# DRAM region -> the element view it is written through
VIEWS = {"inp": "inp", "res": "out", "wgt": "wgt", "bias": "acc", "shift": "acc", "rmul": "acc", "uop": "uop"}
VIEWS.update(out="out", bwgt="wgt", one="inp")


def to_blocks(x: np.ndarray, blk: int) -> np.ndarray:
    """int8 NCHW (N=1) -> the accelerator's NCHW1n16c elements, channels zero-padded to the block."""
    _, c, h, w = x.shape
    cb = -(-c // blk)
    xp = np.zeros((cb * blk, h, w), np.int8)
    xp[:c] = x[0]
    return xp.reshape(cb, blk, h, w).transpose(0, 2, 3, 1).reshape(-1, 1, blk)


def reference(p: LayerProgram, x: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
    """The layer's integer arithmetic in numpy (conv.reference), from the program's arrays."""
    from .conv import ConvLayer
    from .conv import reference as conv_reference

    o = p.out_shape[1]
    a = p.arrays
    layer = ConvLayer(
        a["weight"] if "weight" in a else _unpack_weight(p),
        a["bias"].reshape(-1)[:o],
        a["shift"].reshape(-1)[:o],
        p.relu,
        tuple(p.in_shape),
        tuple(p.stride),
        tuple(p.padding),
        a["rmul"].reshape(-1)[:o] if p.residual else None,
    )
    return conv_reference(layer, x, residual)


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

        def fn(*args, r=r):  # (x, [residual,] out): destination-passing
            ins, out = [a.numpy() for a in args[:-1]], args[-1]
            out.copyfrom(r.run(ins[0], backend, ins[1] if len(ins) > 1 else None))

        tvm.register_global_func(func_name(uid, i), fn, override=True)
    return uid, runners
