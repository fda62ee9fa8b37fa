"""VTA's ISA: 128-bit LOAD/STORE/GEMM/ALU/FINISH instructions and 32-bit micro-ops, with encode and
decode that round-trip bit for bit. Field layouts are data derived from the configuration (index
widths follow the buffer depths); a field never straddles bit 64, as in VTA's C bitfields. For the
default config the positions are those of vta-spec.md section 2."""

from __future__ import annotations

import dataclasses
from functools import cache

from .config import VTAConfig

LOAD, STORE, GEMM, FINISH, ALU = 0, 1, 2, 3, 4
OPCODES = {LOAD: "LOAD", STORE: "STORE", GEMM: "GEMM", FINISH: "FINISH", ALU: "ALU"}
MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT, MEM_ACC_8BIT = 0, 1, 2, 3, 4, 5
MEM_TYPES = {MEM_UOP: "uop", MEM_WGT: "wgt", MEM_INP: "inp", MEM_ACC: "acc", MEM_OUT: "out", MEM_ACC_8BIT: "acc8"}
ALU_MIN, ALU_MAX, ALU_ADD, ALU_SHR, ALU_MUL = 0, 1, 2, 3, 4
ALU_OPS = {ALU_MIN: "MIN", ALU_MAX: "MAX", ALU_ADD: "ADD", ALU_SHR: "SHR", ALU_MUL: "MUL"}
COMMON = [("opcode", 3), ("pop_prev_dep", 1), ("pop_next_dep", 1), ("push_prev_dep", 1), ("push_next_dep", 1)]
SIGNED = {"imm"}


def _bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def _place(fields: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """name -> (lsb, width), packed from bit 0; a field that would cross bit 64 starts at 64."""
    out, pos = {}, 0
    for name, width in fields:
        if pos < 64 < pos + width:
            pos = 64
        out[name] = (pos, width)
        pos += width
    assert pos <= 128, fields
    return out


@cache
def layouts(cfg: VTAConfig) -> dict[str, dict[str, tuple[int, int]]]:
    uop, acc, inp, wgt = _bits(cfg.uop_depth), _bits(cfg.acc_depth), _bits(cfg.inp_depth), _bits(cfg.wgt_depth)
    loops = [
        ("reset_reg", 1),
        ("uop_bgn", uop),
        ("uop_end", uop + 1),
        ("iter_out", 14),
        ("iter_in", 14),
        ("dst_factor_out", acc),
        ("dst_factor_in", acc),
        ("src_factor_out", max(acc, inp)),
        ("src_factor_in", max(acc, inp)),
    ]
    return {
        "mem": _place(
            COMMON
            + [
                ("memory_type", 3),
                ("sram_base", 16),
                ("dram_base", 32),
                ("y_size", 16),
                ("x_size", 16),
                ("x_stride", 16),
                ("y_pad_0", 4),
                ("y_pad_1", 4),
                ("x_pad_0", 4),
                ("x_pad_1", 4),
            ]
        ),
        "gemm": _place(COMMON + loops + [("wgt_factor_out", wgt), ("wgt_factor_in", wgt)]),
        "alu": _place(COMMON + loops + [("alu_opcode", 3), ("use_imm", 1), ("imm", 16)]),
        "finish": _place(COMMON),
        "uop": _place([("dst_idx", acc), ("src_idx", max(acc, inp)), ("wgt_idx", wgt)]),
    }


def _kind(opcode: int) -> str:
    return {LOAD: "mem", STORE: "mem", GEMM: "gemm", ALU: "alu", FINISH: "finish"}[opcode]


@dataclasses.dataclass
class Insn:
    """One instruction; `f` holds its fields by name (the layout says which apply)."""

    opcode: int
    f: dict

    def __getattr__(self, name):  # a field the instruction does not set reads 0, as in its encoding
        if name.startswith("_") or "f" not in self.__dict__:
            raise AttributeError(name)
        return self.__dict__["f"].get(name, 0)

    def __repr__(self) -> str:
        return f"{OPCODES[self.opcode]}({', '.join(f'{k}={v}' for k, v in self.f.items() if v)})"


def make(opcode: int, **fields) -> Insn:
    f = {"pop_prev_dep": 0, "pop_next_dep": 0, "push_prev_dep": 0, "push_next_dep": 0}
    f.update(fields)
    return Insn(opcode, f)


def encode(insn: Insn, cfg: VTAConfig) -> bytes:
    """16 bytes, little-endian (bit 0 = LSB of byte 0)."""
    layout = layouts(cfg)[_kind(insn.opcode)]
    word = 0
    for name, (lsb, width) in layout.items():
        v = insn.opcode if name == "opcode" else int(insn.f.get(name, 0))
        lo, hi = (-(1 << (width - 1)), (1 << (width - 1)) - 1) if name in SIGNED else (0, (1 << width) - 1)
        if not lo <= v <= hi:
            raise ValueError(f"{OPCODES[insn.opcode]} field {name}={v} does not fit {width} bits")
        word |= (v & ((1 << width) - 1)) << lsb
    return word.to_bytes(16, "little")


def decode(data: bytes, cfg: VTAConfig) -> Insn:
    word = int.from_bytes(data[:16], "little")
    opcode = word & 7
    if opcode not in OPCODES:
        raise ValueError(f"unknown opcode {opcode}")
    f = {}
    for name, (lsb, width) in layouts(cfg)[_kind(opcode)].items():
        v = (word >> lsb) & ((1 << width) - 1)
        if name in SIGNED and v >> (width - 1):
            v -= 1 << width
        if name != "opcode":
            f[name] = v
    return Insn(opcode, f)


@dataclasses.dataclass(frozen=True)
class Uop:
    dst: int
    src: int
    wgt: int = 0

    def encode(self, cfg: VTAConfig) -> int:
        lay = layouts(cfg)["uop"]
        word = 0
        for name, v in (("dst_idx", self.dst), ("src_idx", self.src), ("wgt_idx", self.wgt)):
            lsb, width = lay[name]
            if not 0 <= v < 1 << width:
                raise ValueError(f"micro-op {name}={v} does not fit {width} bits")
            word |= v << lsb
        return word

    @staticmethod
    def decode(word: int, cfg: VTAConfig) -> Uop:
        lay = layouts(cfg)["uop"]
        get = lambda n: (word >> lay[n][0]) & ((1 << lay[n][1]) - 1)
        return Uop(get("dst_idx"), get("src_idx"), get("wgt_idx"))


def encode_stream(insns: list[Insn], cfg: VTAConfig) -> bytes:
    return b"".join(encode(i, cfg) for i in insns)


def decode_stream(data: bytes, cfg: VTAConfig) -> list[Insn]:
    if len(data) % 16:
        raise ValueError(f"an instruction stream is a multiple of 16 bytes, got {len(data)}")
    return [decode(data[i : i + 16], cfg) for i in range(0, len(data), 16)]
