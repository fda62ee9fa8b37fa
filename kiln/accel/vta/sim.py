"""A behavioural simulator of a VTA-compatible accelerator with a timing model on top.

Semantics are those of VTA's functional simulator (fsim, vta-spec.md 2.1): 2D DMA loads with zero
padding, int8 x int8 -> int32 GEMM over micro-op loops, the tensor ALU (MIN/MAX/ADD/SHR/MUL with
immediates or accumulator operands), stores that truncate int32 to int8, and the four
dependency-token queues between the load, compute and store modules. Each instruction runs
vectorized with numpy over its whole loop nest (per micro-op), not per element.

Timing: the three modules run concurrently, each in program order, an instruction starting when
its module is free and the tokens it pops have been pushed; GEMM costs 1 cycle per micro-op
iteration, ALU 2, DMA one beat per AXI word plus a fixed latency per instruction and per row
(VTAConfig). A token stream in which no module can proceed is reported as AcceleratorError
(fsim would spin forever)."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from ...errors import AcceleratorError
from . import isa
from .config import VTAConfig

MODULES = ("load", "compute", "store")
# module -> {flag: (token queue, "pop"|"push")}
TOKENS = {
    "load": {"pop_next_dep": ("g2l", "pop"), "push_next_dep": ("l2g", "push")},
    "compute": {
        "pop_prev_dep": ("l2g", "pop"),
        "pop_next_dep": ("s2g", "pop"),
        "push_prev_dep": ("g2l", "push"),
        "push_next_dep": ("g2s", "push"),
    },
    "store": {"pop_prev_dep": ("g2s", "pop"), "push_prev_dep": ("s2g", "push")},
}


def module_of(insn: isa.Insn) -> str:
    """VTA's fetch stage: STORE -> store; LOAD of INP/WGT -> load; the rest -> compute."""
    if insn.opcode == isa.STORE:
        return "store"
    if insn.opcode == isa.LOAD and insn.memory_type in (isa.MEM_INP, isa.MEM_WGT):
        return "load"
    return "compute"


@dataclasses.dataclass
class Stats:
    cycles: int = 0
    insns: int = 0
    gemm_ops: int = 0  # micro-op iterations (VTA's gemm_counter); x 256 MACs each
    alu_ops: int = 0
    load_bytes: dict = dataclasses.field(default_factory=lambda: {"inp": 0, "wgt": 0, "acc": 0, "uop": 0})
    store_bytes: int = 0
    busy: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(MODULES, 0))
    stall: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(MODULES, 0))
    gemm_cycles: int = 0

    def add(self, other: Stats) -> None:
        for f in ("cycles", "insns", "gemm_ops", "alu_ops", "store_bytes", "gemm_cycles"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for d in ("load_bytes", "busy", "stall"):
            for k, v in getattr(other, d).items():
                getattr(self, d)[k] += v

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class Simulator:
    """SRAMs of one accelerator; `dram` is the byte array instructions address (in elements)."""

    def __init__(self, cfg: VTAConfig, dram: np.ndarray | None, timing_only: bool = False):
        """timing_only: count cycles and bytes without computing (the timing model does not depend
        on the data; the tuner measures with it), dram may then be None."""
        self.cfg, self.dram, self.timing_only = cfg, dram, timing_only
        b, n = cfg.batch, cfg.block
        self.uop = np.zeros(cfg.uop_depth, np.uint32)
        self.inp = np.zeros((cfg.inp_depth, b, n), np.int8)
        self.wgt = np.zeros((cfg.wgt_depth, n, n), np.int8)
        self.acc = np.zeros((cfg.acc_depth, b, n), np.int32)
        self._views = {}

    # --- DRAM views (element arrays of each memory type over the same bytes) ---
    def _dram(self, kind: str) -> np.ndarray:
        if kind not in self._views:
            c, d = self.cfg, self.dram
            shape = {
                "inp": (np.int8, (c.batch, c.block)),
                "out": (np.int8, (c.batch, c.block)),
                "acc8": (np.int8, (c.batch, c.block)),
                "wgt": (np.int8, (c.block, c.block)),
                "acc": (np.int32, (c.batch, c.block)),
                "uop": (np.uint32, ()),
            }[kind]
            dt, inner = shape
            eb = np.dtype(dt).itemsize * int(np.prod(inner))
            self._views[kind] = d[: len(d) // eb * eb].view(dt).reshape(-1, *inner)
        return self._views[kind]

    def run(self, insns: list[isa.Insn], max_insns: int | None = None) -> Stats:
        queues = {m: collections.deque() for m in MODULES}
        for i, insn in enumerate(insns):
            queues[module_of(insn)].append((i, insn))
        tokens = {q: collections.deque() for q in ("l2g", "g2l", "g2s", "s2g")}
        free = dict.fromkeys(MODULES, 0)
        st = Stats()
        finished = False
        while not finished and any(queues.values()):
            best = None
            for m in MODULES:
                if not queues[m]:
                    continue
                _, insn = queues[m][0]
                ready, start = True, free[m]
                for flag, (q, kind) in TOKENS[m].items():
                    if not getattr(insn, flag):
                        continue
                    if kind == "pop":
                        if not tokens[q]:
                            ready = False
                            break
                        start = max(start, tokens[q][0])
                    elif len(tokens[q]) >= self.cfg.token_depth:
                        ready = False
                        break
                bad = [
                    f
                    for f in ("pop_prev_dep", "pop_next_dep", "push_prev_dep", "push_next_dep")
                    if getattr(insn, f) and f not in TOKENS[m]
                ]
                if bad:
                    raise AcceleratorError(
                        f"instruction #{queues[m][0][0]} {insn!r} on the {m} module sets {bad}: "
                        "there is no such token queue",
                        where="vta stream",
                        fix="load<->store tokens do not exist; route them through compute",
                    )
                if ready and (best is None or start < best[0]):
                    best = (start, m)
            if best is None:
                waits = "; ".join(f"{m} waits at #{queues[m][0][0]} {queues[m][0][1]!r}" for m in MODULES if queues[m])
                raise AcceleratorError(
                    f"deadlock: no module can proceed ({waits}); tokens queued: "
                    + ", ".join(f"{q}={len(v)}" for q, v in tokens.items()),
                    where="vta stream",
                    fix="every pop needs a matching push from the peer module (check the dependency flags)",
                )
            start, m = best
            idx, insn = queues[m].popleft()
            for flag, (q, kind) in TOKENS[m].items():
                if getattr(insn, flag) and kind == "pop":
                    tokens[q].popleft()
            cycles = self._execute(idx, insn, st)
            st.stall[m] += start - free[m]
            st.busy[m] += cycles
            free[m] = start + cycles
            for flag, (q, kind) in TOKENS[m].items():
                if getattr(insn, flag) and kind == "push":
                    tokens[q].append(free[m])
            st.insns += 1
            finished = insn.opcode == isa.FINISH
            if finished and any(queues.values()):
                left = "; ".join(f"{m}: #{queues[m][0][0]} {queues[m][0][1]!r}" for m in MODULES if queues[m])
                raise AcceleratorError(
                    f"FINISH ran while other modules still had instructions ({left})",
                    where="vta stream",
                    fix="make FINISH pop the tokens of the last load and store so the pipeline drains first",
                )
            if max_insns is not None and st.insns > max_insns:
                raise AcceleratorError(
                    f"more than {max_insns} instructions executed", where="vta stream", fix="check the stream for loops"
                )
        if not finished:
            raise AcceleratorError(
                "the stream ended without FINISH", where="vta stream", fix="end every stream with FINISH"
            )
        st.cycles = max(free.values())
        return st

    # --- semantics ---
    def _execute(self, idx: int, insn: isa.Insn, st: Stats) -> int:
        if self.timing_only:
            return self._cost(insn, st)
        try:
            if insn.opcode == isa.LOAD:
                return self._load(insn, st)
            if insn.opcode == isa.STORE:
                return self._store(insn, st)
            if insn.opcode == isa.GEMM:
                return self._gemm(insn, st)
            if insn.opcode == isa.ALU:
                return self._alu(insn, st)
            return 1  # FINISH
        except IndexError as e:
            raise AcceleratorError(
                f"instruction #{idx} {insn!r} addresses memory out of range ({e})",
                where="vta stream",
                fix="tile the layer to fit the on-chip buffers",
            ) from None

    def _cost(self, i: isa.Insn, st: Stats) -> int:
        """What _load/_store/_gemm/_alu count, from the fields alone."""
        c = self.cfg
        if i.opcode == isa.FINISH:
            return 1
        if i.opcode in (isa.GEMM, isa.ALU):
            iters = i.iter_out * i.iter_in * max(0, i.uop_end - i.uop_bgn)
            if i.opcode == isa.ALU:
                st.alu_ops += iters
                return c.alu_fill + 2 * iters
            if not i.reset_reg:
                st.gemm_ops += iters
            st.gemm_cycles += iters
            return c.gemm_fill + iters
        if i.opcode == isa.LOAD and i.memory_type == isa.MEM_UOP:
            st.load_bytes["uop"] += 4 * i.x_size
            return self._dma_cycles(4 * i.x_size, 1)
        eb = {
            isa.MEM_INP: c.inp_elem_bytes,
            isa.MEM_WGT: c.wgt_elem_bytes,
            isa.MEM_ACC: c.acc_elem_bytes,
            isa.MEM_ACC_8BIT: c.out_elem_bytes,
            isa.MEM_OUT: c.out_elem_bytes,
        }[i.memory_type]
        if i.opcode == isa.STORE:
            st.store_bytes += i.y_size * i.x_size * eb
            return self._dma_cycles(i.y_size * i.x_size * eb, i.y_size)
        rows, x_total = i.y_pad_0 + i.y_size + i.y_pad_1, i.x_pad_0 + i.x_size + i.x_pad_1
        kind = {isa.MEM_INP: "inp", isa.MEM_WGT: "wgt"}.get(i.memory_type, "acc")
        st.load_bytes[kind] += i.x_size * i.y_size * eb
        return self._dma_cycles(rows * x_total * eb, rows)

    def _dma_cycles(self, nbytes: int, rows: int) -> int:
        c = self.cfg
        return c.dma_latency + rows * c.dma_row_overhead + -(-nbytes // c.axi_bytes)

    def _load(self, i: isa.Insn, st: Stats) -> int:
        mt = i.memory_type
        if mt == isa.MEM_UOP:
            if i.sram_base + i.x_size > len(self.uop):
                raise IndexError(f"uop buffer overflow: {i.sram_base}+{i.x_size} > {len(self.uop)}")
            self.uop[i.sram_base : i.sram_base + i.x_size] = self._dram("uop")[i.dram_base : i.dram_base + i.x_size]
            st.load_bytes["uop"] += 4 * i.x_size
            return self._dma_cycles(4 * i.x_size, 1)
        kind, sram = {
            isa.MEM_INP: ("inp", self.inp),
            isa.MEM_WGT: ("wgt", self.wgt),
            isa.MEM_ACC: ("acc", self.acc),
            isa.MEM_ACC_8BIT: ("acc8", self.acc),
        }.get(mt, (None, None))
        if kind is None:
            raise AcceleratorError(
                f"LOAD of memory type {isa.MEM_TYPES.get(mt, mt)} is not valid",
                where="vta stream",
                fix="LOAD takes uop, wgt, inp, acc or acc8",
            )
        x_total = i.x_pad_0 + i.x_size + i.x_pad_1
        rows = i.y_pad_0 + i.y_size + i.y_pad_1
        n = rows * x_total
        if i.sram_base + n > len(sram):
            raise IndexError(f"{kind} buffer overflow: {i.sram_base}+{n} > {len(sram)}")
        block = np.zeros((rows, x_total, *sram.shape[1:]), sram.dtype)
        if i.y_size and i.x_size:
            idx = i.dram_base + np.arange(i.y_size)[:, None] * i.x_stride + np.arange(i.x_size)[None, :]
            block[i.y_pad_0 : i.y_pad_0 + i.y_size, i.x_pad_0 : i.x_pad_0 + i.x_size] = self._dram(kind)[idx]
        sram[i.sram_base : i.sram_base + n] = block.reshape(n, *sram.shape[1:])
        eb = self._dram(kind)[0].nbytes
        nbytes = i.x_size * i.y_size * eb
        st.load_bytes["acc" if kind == "acc8" else kind] += nbytes
        return self._dma_cycles(nbytes + (n - i.x_size * i.y_size) * eb, rows)

    def _store(self, i: isa.Insn, st: Stats) -> int:
        if i.memory_type != isa.MEM_OUT or i.y_pad_0 or i.y_pad_1 or i.x_pad_0 or i.x_pad_1:
            raise AcceleratorError(
                f"STORE must write the out buffer without padding: {i!r}",
                where="vta stream",
                fix="store from out (memory type 4) with all pads 0",
            )
        n = i.y_size * i.x_size
        if i.sram_base + n > len(self.acc):
            raise IndexError(f"out buffer overflow: {i.sram_base}+{n} > {len(self.acc)}")
        idx = i.dram_base + np.arange(i.y_size)[:, None] * i.x_stride + np.arange(i.x_size)[None, :]
        src = self.acc[i.sram_base : i.sram_base + n].reshape(i.y_size, i.x_size, *self.acc.shape[1:])
        self._dram("out")[idx] = src.astype(np.int8)  # truncation: two's-complement wrap, no saturation
        eb = self._dram("out")[0].nbytes
        st.store_bytes += n * eb
        return self._dma_cycles(n * eb, i.y_size)

    def _loop(self, i: isa.Insn):
        """The instruction's two loop counters, flattened, and its micro-ops."""
        I, J = np.meshgrid(np.arange(i.iter_out), np.arange(i.iter_in), indexing="ij")
        return I.ravel(), J.ravel(), [isa.Uop.decode(int(w), self.cfg) for w in self.uop[i.uop_bgn : i.uop_end]]

    def _gemm(self, i: isa.Insn, st: Stats) -> int:
        I, J, uops = self._loop(i)
        for u in uops:
            a = u.dst + I * i.dst_factor_out + J * i.dst_factor_in
            if i.reset_reg:
                self.acc[a] = 0
                continue
            x = u.src + I * i.src_factor_out + J * i.src_factor_in
            w = u.wgt + I * i.wgt_factor_out + J * i.wgt_factor_in
            prod = np.einsum("nbk,nok->nbo", self.inp[x].astype(np.int32), self.wgt[w].astype(np.int32))
            np.add.at(self.acc, a, prod)  # int32, wraps like the hardware
        iters = len(I) * len(uops)
        if not i.reset_reg:
            st.gemm_ops += iters
        st.gemm_cycles += iters
        return self.cfg.gemm_fill + iters

    def _alu(self, i: isa.Insn, st: Stats) -> int:
        I, J, uops = self._loop(i)
        for u in uops:
            d = u.dst + I * i.dst_factor_out + J * i.dst_factor_in
            if i.reset_reg:
                self.acc[d] = 0
                continue
            s = None if i.use_imm else u.src + I * i.src_factor_out + J * i.src_factor_in
            if len(np.unique(d)) == len(d) and (s is None or np.array_equal(d, s) or np.intersect1d(d, s).size == 0):
                self.acc[d] = self._alu_op(i, self.acc[d], i.imm if s is None else self.acc[s])
            else:  # overlapping in-place chains: element by element, in loop order
                for k in range(len(d)):
                    self.acc[d[k]] = self._alu_op(i, self.acc[d[k]], i.imm if s is None else self.acc[s[k]])
        iters = len(I) * len(uops)
        st.alu_ops += iters
        return self.cfg.alu_fill + 2 * iters

    @staticmethod
    def _alu_op(i: isa.Insn, x: np.ndarray, y) -> np.ndarray:
        op = i.alu_opcode
        y = np.asarray(y, np.int64)
        x64 = x.astype(np.int64)
        if op == isa.ALU_MIN:
            r = np.minimum(x64, y)
        elif op == isa.ALU_MAX:
            r = np.maximum(x64, y)
        elif op == isa.ALU_ADD:
            r = x64 + y
        elif op == isa.ALU_MUL:
            r = x64 * y
        elif op == isa.ALU_SHR:  # arithmetic right shift by the low 5 bits; negative: left shift
            r = np.where(y >= 0, x64 >> (y & 31), x64 << ((-y) & 31))
        else:
            raise AcceleratorError(
                f"ALU opcode {op} is not valid", where="vta stream", fix="MIN=0 MAX=1 ADD=2 SHR=3 MUL=4"
            )
        return r.astype(np.int64).astype(np.uint32).view(np.int32) if r.dtype != np.int32 else r  # wrap to int32
