"""The accelerator's hardware configuration as data: VTA's bitstream name
`{batch}x{block}_i{inp}w{wgt}a{acc}_{uop}_{inp}_{wgt}_{acc}` (log2 sizes of the on-chip buffers in
bytes), plus the clock and the AXI bus width of a board. Parsed once, here."""

from __future__ import annotations

import dataclasses
import re

from ...errors import OptionsError

DEFAULT = "1x16_i8w8a32_15_15_18_17"
# board -> (clock MHz, AXI data bytes); from VTA's pkg_config.py
BOARDS = {"sim": (100.0, 8), "pynq": (100.0, 8), "de10nano": (100.0, 8), "ultra96": (333.0, 16), "zcu104": (333.0, 16)}
_NAME = re.compile(r"^(\d+)x(\d+)_i(\d+)w(\d+)a(\d+)_(\d+)_(\d+)_(\d+)_(\d+)$")


@dataclasses.dataclass(frozen=True)
class VTAConfig:
    batch: int = 1
    block: int = 16  # BLOCK_IN = BLOCK_OUT
    inp_bits: int = 8
    wgt_bits: int = 8
    acc_bits: int = 32
    log_uop_bytes: int = 15
    log_inp_bytes: int = 15
    log_wgt_bytes: int = 18
    log_acc_bytes: int = 17
    board: str = "sim"
    clock_mhz: float = 100.0
    axi_bytes: int = 8
    # timing model (cycles): fixed cost per DMA instruction and per DMA row, GEMM/ALU pipeline fill
    dma_latency: int = 32
    dma_row_overhead: int = 1
    gemm_fill: int = 4
    alu_fill: int = 4
    token_depth: int = 8

    @staticmethod
    def parse(name: str = DEFAULT, board: str = "sim") -> VTAConfig:
        m = _NAME.match(name)
        if not m:
            raise OptionsError(f"bad VTA configuration {name!r}", where="vta config", fix=f"write it like {DEFAULT}")
        if board not in BOARDS:
            raise OptionsError(f"unknown board {board!r}", where="-board", fix=f"use one of {', '.join(BOARDS)}")
        b, blk, i, w, a, lu, li, lw, la = (int(g) for g in m.groups())
        if (i, w, a) != (8, 8, 32) or b != 1 or blk not in (8, 16, 32):
            raise OptionsError(
                f"VTA configuration {name!r} is not supported",
                where="vta config",
                fix="Kiln simulates batch 1, int8 inputs/weights, int32 accumulators, blocks of 8, 16 or 32",
            )
        clock, axi = BOARDS[board]
        return VTAConfig(b, blk, i, w, a, lu, li, lw, la, board, clock, axi)

    @property
    def name(self) -> str:
        return (
            f"{self.batch}x{self.block}_i{self.inp_bits}w{self.wgt_bits}a{self.acc_bits}_"
            f"{self.log_uop_bytes}_{self.log_inp_bytes}_{self.log_wgt_bytes}_{self.log_acc_bytes}"
        )

    # element sizes (bytes) of each memory type, and buffer depths (elements)
    @property
    def inp_elem_bytes(self) -> int:
        return self.batch * self.block * self.inp_bits // 8

    @property
    def wgt_elem_bytes(self) -> int:
        return self.block * self.block * self.wgt_bits // 8

    @property
    def acc_elem_bytes(self) -> int:
        return self.batch * self.block * self.acc_bits // 8

    @property
    def out_elem_bytes(self) -> int:
        return self.batch * self.block * self.inp_bits // 8

    @property
    def uop_depth(self) -> int:
        return (1 << self.log_uop_bytes) // 4

    @property
    def inp_depth(self) -> int:
        return (1 << self.log_inp_bytes) // self.inp_elem_bytes

    @property
    def wgt_depth(self) -> int:
        return (1 << self.log_wgt_bytes) // self.wgt_elem_bytes

    @property
    def acc_depth(self) -> int:
        return (1 << self.log_acc_bytes) // self.acc_elem_bytes

    @property
    def macs_per_cycle(self) -> int:
        return self.batch * self.block * self.block

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "board": self.board,
            "clock_mhz": self.clock_mhz,
            "axi_bytes": self.axi_bytes,
            "macs_per_cycle": self.macs_per_cycle,
        }
