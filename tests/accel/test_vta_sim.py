"""The VTA ISA and simulator: encode/decode bit for bit, DMA padding, store truncation, GEMM and
ALU semantics against numpy, dependency tokens (a broken stream is an error, not a hang) and the
timing model's concurrency."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.accel.vta import isa
from kiln.accel.vta.config import VTAConfig
from kiln.accel.vta.sim import AcceleratorError, Simulator
from kiln.errors import OptionsError

CFG = VTAConfig.parse()


def test_config_and_boards():
    assert CFG.name == "1x16_i8w8a32_15_15_18_17"
    assert (CFG.uop_depth, CFG.inp_depth, CFG.wgt_depth, CFG.acc_depth) == (8192, 2048, 1024, 2048)
    u = VTAConfig.parse(board="ultra96")
    assert (u.clock_mhz, u.axi_bytes) == (333.0, 16)
    with pytest.raises(OptionsError, match="ultra96"):
        VTAConfig.parse(board="nope")
    with pytest.raises(OptionsError):
        VTAConfig.parse("1x16_i4w4a32_15_15_18_17")


def test_default_layout_matches_the_spec():
    lay = isa.layouts(CFG)
    assert (
        lay["mem"]["dram_base"] == (26, 32) and lay["mem"]["y_size"] == (64, 16) and lay["mem"]["x_pad_1"] == (124, 4)
    )
    assert (
        lay["gemm"]["uop_end"] == (21, 14)
        and lay["gemm"]["dst_factor_out"] == (64, 11)
        and lay["gemm"]["wgt_factor_in"] == (118, 10)
    )
    assert lay["alu"]["alu_opcode"] == (108, 3) and lay["alu"]["imm"] == (112, 16)
    assert lay["uop"] == {"dst_idx": (0, 11), "src_idx": (11, 11), "wgt_idx": (22, 10)}


def test_isa_round_trip_bit_for_bit():
    rng = np.random.default_rng(0)
    for _ in range(300):
        kind = rng.choice(["mem", "gemm", "alu", "finish"])
        opcode = {
            "mem": int(rng.choice([isa.LOAD, isa.STORE])),
            "gemm": isa.GEMM,
            "alu": isa.ALU,
            "finish": isa.FINISH,
        }[kind]
        fields = {}
        for name, (_, width) in isa.layouts(CFG)[kind].items():
            if name == "opcode":
                continue
            fields[name] = (
                int(rng.integers(-(1 << (width - 1)), 1 << (width - 1)))
                if name in isa.SIGNED
                else int(rng.integers(0, 1 << width))
            )
        insn = isa.Insn(opcode, fields)
        raw = isa.encode(insn, CFG)
        back = isa.decode(raw, CFG)
        assert back.opcode == opcode and back.f == fields and isa.encode(back, CFG) == raw
    word = int(rng.integers(0, 1 << 32))
    assert isa.Uop.decode(word, CFG).encode(CFG) == word
    with pytest.raises(ValueError, match="does not fit"):
        isa.encode(isa.make(isa.ALU, imm=40000), CFG)


def _dram(nbytes=1 << 20):
    return np.zeros(nbytes, np.uint8)


def test_padded_load_and_truncating_store():
    dram = _dram()
    sim = Simulator(CFG, dram)
    inp = sim._dram("inp")
    src = np.arange(3 * 5 * 16, dtype=np.int64).reshape(15, 1, 16) % 251 - 125
    inp[100:115] = src.astype(np.int8)
    # 3 rows of 4 elements (DRAM rows 5 apart), padded 1 above, 2 below, 1 left, 0 right
    load = isa.make(
        isa.LOAD,
        memory_type=isa.MEM_INP,
        sram_base=7,
        dram_base=100,
        y_size=3,
        x_size=4,
        x_stride=5,
        y_pad_0=1,
        y_pad_1=2,
        x_pad_0=1,
        x_pad_1=0,
        push_next_dep=1,
    )
    sim.run([load, isa.make(isa.FINISH, pop_prev_dep=1)])
    got = sim.inp[7 : 7 + 6 * 5].reshape(6, 5, 16)
    want = np.zeros((6, 5, 16), np.int8)
    want[1:4, 1:5] = src.reshape(3, 5, 16)[:, :4]
    np.testing.assert_array_equal(got, want)
    # store truncates int32 to int8 (wrap, no saturation)
    sim.acc[0:2] = np.array([[[300, -129, 127, -128] * 4], [[256, 255, -1, 1000] * 4]], np.int32)
    sim.run(
        [
            isa.make(
                isa.STORE,
                memory_type=isa.MEM_OUT,
                sram_base=0,
                dram_base=10,
                y_size=1,
                x_size=2,
                x_stride=2,
                push_prev_dep=1,
            ),
            isa.make(isa.FINISH, pop_next_dep=1),
        ]
    )
    np.testing.assert_array_equal(
        sim._dram("out")[10:12].reshape(2, 16)[:, :4], [[44, 127, 127, -128], [0, -1, -1, -24]]
    )
    with pytest.raises(AcceleratorError, match="buffer overflow"):
        sim.run(
            [
                isa.make(
                    isa.LOAD,
                    memory_type=isa.MEM_INP,
                    sram_base=2040,
                    dram_base=0,
                    y_size=4,
                    x_size=4,
                    x_stride=4,
                    push_next_dep=1,
                ),
                isa.make(isa.FINISH, pop_prev_dep=1),
            ]
        )


def _uops(sim, uops, at=0):
    sim._dram("uop")[at : at + len(uops)] = [u.encode(CFG) for u in uops]
    return isa.make(
        isa.LOAD, memory_type=isa.MEM_UOP, sram_base=0, dram_base=at, y_size=1, x_size=len(uops), x_stride=len(uops)
    )


def test_gemm_over_a_loop_nest_matches_numpy():
    rng = np.random.default_rng(1)
    sim = Simulator(CFG, _dram())
    x = rng.integers(-128, 128, (8, 1, 16)).astype(np.int8)
    w = rng.integers(-128, 128, (3, 16, 16)).astype(np.int8)
    sim.inp[:8], sim.wgt[:3] = x, w
    # acc[o*8 + j] = sum over the 3 weight blocks? here: acc[i*4 + j] += inp[j + i] . wgt[i]   (i < 3, j < 4)
    insns = [
        _uops(sim, [isa.Uop(0, 0, 0)]),
        isa.make(isa.GEMM, reset_reg=1, uop_bgn=0, uop_end=1, iter_out=3, iter_in=4, dst_factor_out=4, dst_factor_in=1),
        isa.make(
            isa.GEMM,
            uop_bgn=0,
            uop_end=1,
            iter_out=3,
            iter_in=4,
            dst_factor_out=4,
            dst_factor_in=1,
            src_factor_out=1,
            src_factor_in=1,
            wgt_factor_out=1,
            wgt_factor_in=0,
        ),
        isa.make(isa.FINISH),
    ]
    st = sim.run(insns)
    for i in range(3):
        for j in range(4):
            np.testing.assert_array_equal(sim.acc[i * 4 + j, 0], w[i].astype(np.int32) @ x[j + i, 0].astype(np.int32))
    assert st.gemm_ops == 12  # the reset is not counted, as in fsim


@pytest.mark.parametrize(
    "op,imm,fn",
    [
        (isa.ALU_MIN, -5, lambda a: np.minimum(a, -5)),
        (isa.ALU_MAX, 0, lambda a: np.maximum(a, 0)),
        (isa.ALU_ADD, 1000, lambda a: a + 1000),
        (isa.ALU_SHR, 3, lambda a: a >> 3),
        (isa.ALU_SHR, -2, lambda a: a << 2),
        (isa.ALU_MUL, 7, lambda a: a * 7),
    ],
)
def test_alu_immediates(op, imm, fn):
    rng = np.random.default_rng(2)
    sim = Simulator(CFG, _dram())
    a = rng.integers(-(10**6), 10**6, (6, 1, 16)).astype(np.int32)
    sim.acc[10:16] = a
    sim.run(
        [
            _uops(sim, [isa.Uop(10, 0)]),
            isa.make(
                isa.ALU,
                uop_bgn=0,
                uop_end=1,
                iter_out=2,
                iter_in=3,
                dst_factor_out=3,
                dst_factor_in=1,
                alu_opcode=op,
                use_imm=1,
                imm=imm,
            ),
            isa.make(isa.FINISH),
        ]
    )
    np.testing.assert_array_equal(sim.acc[10:16], fn(a.astype(np.int64)).astype(np.int32))


def test_alu_with_accumulator_operand_and_wrap():
    sim = Simulator(CFG, _dram())
    sim.acc[0] = 2**31 - 1
    sim.acc[1] = 1
    sim.run(
        [
            _uops(sim, [isa.Uop(0, 1)]),
            isa.make(isa.ALU, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1, alu_opcode=isa.ALU_ADD),
            isa.make(isa.FINISH),
        ]
    )
    assert (sim.acc[0] == -(2**31)).all()  # 32-bit add wraps


def test_tokens_order_modules_and_a_broken_stream_is_reported():
    sim = Simulator(CFG, _dram())
    sim._dram("inp")[0:4] = 3
    ok = [
        isa.make(
            isa.LOAD, memory_type=isa.MEM_INP, sram_base=0, dram_base=0, y_size=1, x_size=4, x_stride=4, push_next_dep=1
        ),
        isa.make(isa.ALU, uop_bgn=0, uop_end=0, iter_out=1, iter_in=1, pop_prev_dep=1, push_next_dep=1),
        isa.make(
            isa.STORE,
            memory_type=isa.MEM_OUT,
            sram_base=0,
            dram_base=0,
            y_size=1,
            x_size=1,
            x_stride=1,
            pop_prev_dep=1,
            push_prev_dep=1,
        ),
        isa.make(isa.FINISH, pop_next_dep=1),
    ]
    st = sim.run(ok)
    assert st.stall["compute"] > 0 and st.stall["store"] > 0  # compute waited for the load, store for compute
    broken = [
        ok[0],
        isa.make(isa.ALU, uop_bgn=0, uop_end=0, iter_out=1, iter_in=1, pop_prev_dep=1, pop_next_dep=1),
        isa.make(isa.FINISH),
    ]
    with pytest.raises(AcceleratorError, match="deadlock") as e:
        sim.run(broken)
    assert "compute waits" in str(e.value)
    with pytest.raises(AcceleratorError, match="no such token queue"):
        sim.run(
            [
                isa.make(
                    isa.LOAD,
                    memory_type=isa.MEM_INP,
                    sram_base=0,
                    dram_base=0,
                    y_size=1,
                    x_size=1,
                    x_stride=1,
                    push_prev_dep=1,
                ),
                isa.make(isa.FINISH),
            ]
        )
    with pytest.raises(AcceleratorError, match="without FINISH"):
        sim.run(ok[:1])
    with pytest.raises(AcceleratorError, match="FINISH ran while"):  # FINISH not synchronized with the store
        sim.run(ok[:3] + [isa.make(isa.FINISH)])


def test_modules_overlap_in_time():
    """Two independent loads then GEMMs: the second load runs while the first GEMM computes."""
    sim = Simulator(CFG, _dram())
    ld = lambda base: isa.make(
        isa.LOAD,
        memory_type=isa.MEM_INP,
        sram_base=base,
        dram_base=0,
        y_size=1,
        x_size=64,
        x_stride=64,
        push_next_dep=1,
    )
    gemm = isa.make(isa.GEMM, uop_bgn=0, uop_end=1, iter_out=16, iter_in=64, pop_prev_dep=1)
    st = sim.run(
        [_uops(sim, [isa.Uop(0, 0, 0)]), ld(0), ld(64), gemm, gemm, isa.make(isa.FINISH)]
    )  # GEMMs waited for both loads
    serial = sum(st.busy.values())
    assert st.cycles < serial and st.gemm_cycles == 2 * 16 * 64
