"""Capabilities (kiln.capabilities): what each target's hardware can do, from LLVM's feature sets.
Nothing is compiled and nothing depends on the host CPU (x86 rows name their triple)."""

import json

import pytest

from kiln.capabilities import Capabilities, GpuCapabilities, capabilities, from_features
from kiln.target import Target

X86 = "-mtriple=x86_64-linux-gnu"
# target: isa, vector_bits, vector registers, f32 block, fma bits, int8_dot, int8_path, bf16, native fp16, amx
TABLE = {
    f"llvm -mcpu=haswell {X86}": ("avx2", 256, 16, 8, 256, None, "avx2-pmaddubsw", None, False, False),
    f"llvm -mcpu=znver3 {X86}": ("avx2", 256, 16, 8, 256, None, "avx2-pmaddubsw", None, False, False),
    f"llvm -mcpu=znver4 {X86}": ("avx512", 512, 32, 16, 512, "avx512-vnni", "avx512-vnni", "avx512-bf16", False, False),
    f"llvm -mcpu=skylake-avx512 {X86}": ("avx512", 512, 32, 16, 512, None, "avx512-pmaddubsw", None, False, False),
    f"llvm -mcpu=icelake-server {X86}": ("avx512", 512, 32, 16, 512, "avx512-vnni", "avx512-vnni", None, False, False),
    f"llvm -mcpu=alderlake {X86}": ("avx2", 256, 16, 8, 256, "avx-vnni", "avx-vnni", None, False, False),
    f"llvm -mcpu=sapphirerapids {X86}": ("avx512", 512, 32, 16, 512, "amx-int8", "amx-int8", "amx-bf16", True, True),
    f"llvm -mcpu=x86-64 {X86}": ("sse", 128, 16, 4, 0, None, "generic", None, False, False),
    "rpi4": ("neon", 128, 32, 4, 128, None, "neon-smlal", None, False, False),
    "rpi5": ("neon", 128, 32, 4, 128, "dotprod", "dotprod", None, True, False),
    "graviton3": ("neon", 128, 32, 4, 128, "i8mm", "i8mm", "arm-bf16", True, False),
}


@pytest.mark.parametrize("spec", list(TABLE))
def test_capabilities_table(spec):
    t = Target.parse(spec)
    c = t.caps
    assert isinstance(c, Capabilities) and c is capabilities(t)  # cached per frozen target
    got = (
        c.isa,
        c.vector_bits,
        c.vector_registers,
        c.f32_block,
        c.fma_bits,
        c.int8_dot,
        c.int8_path,
        c.bf16,
        c.native_fp16,
        c.amx,
    )
    assert got == TABLE[spec]
    assert c.fma == (c.fma_bits > 0) and c.lanes("float32") == c.f32_block
    assert c.lanes("int8") == c.vector_bits // 8 and c.lanes("bf16") == c.lanes("float16") == c.vector_bits // 16
    assert list(c.isa_features) == t.required_features()
    assert c.arch == ("aarch64" if "-mtriple" not in spec else "x86_64")
    json.dumps(c.to_json())  # JSON-ready
    assert c.describe().startswith(f"target: {t}")


def test_feature_details():
    """The finer points the table does not show, checked against LLVM's features."""
    alder = Target.parse(f"llvm -mcpu=alderlake {X86}").caps
    assert not alder.has("avx512f") and alder.has("avxvnni") and not alder.has_vnni512
    spr = Target.parse(f"llvm -mcpu=sapphirerapids {X86}").caps
    assert spr.has_vnni512 and spr.has("avx512bf16") and spr.has("avx512fp16")  # AMX CPUs also have the AVX-512 paths
    assert Target.parse(f"llvm -mcpu=icelake-server {X86}").caps.has_vnni512
    assert not Target.parse(f"llvm -mcpu=skylake-avx512 {X86}").caps.has_vnni512
    rpi4, rpi5, g3 = (Target.parse(p).caps for p in ("rpi4", "rpi5", "graviton3"))
    assert not rpi4.has("dotprod") and rpi5.has("dotprod") and not rpi5.has("i8mm")
    assert g3.has("dotprod") and g3.has("i8mm") and g3.has("bf16") and g3.sve and not rpi5.sve
    assert Target.parse(f"llvm -mcpu=haswell -mattr=-avx2,-fma {X86}").caps.isa == "avx"  # -mattr counts


def test_f32_block_matches_convert_layout():
    """The layout pass's vector_block and caps.f32_block agree on every table target (the migration contract)."""
    from kiln.compiler.passes.convert_layout import vector_block

    for spec in TABLE:
        t = Target.parse(spec)
        assert t.caps.f32_block == vector_block(t.required_features()), spec


def test_rules_without_llvm():
    generic = from_features(frozenset(), arch="aarch64")
    got = (generic.isa, generic.vector_bits, generic.f32_block, generic.int8_path, generic.fma)
    assert got == ("generic", 0, 4, "generic", False)
    assert generic.lanes("float32") == 1
    with pytest.raises(ValueError, match="unknown dtype"):
        generic.lanes("complex64")


def test_missing_on():
    spr = Target.parse(f"llvm -mcpu=sapphirerapids {X86}").caps
    haswell = Target.parse(f"llvm -mcpu=haswell {X86}").caps
    missing = spr.missing_on(haswell)
    assert "avx512f" in missing and "amx-int8" in missing and "avx2" not in missing
    assert haswell.missing_on(spr) == []
    assert haswell.missing_on({"sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c"}) == []  # /proc/cpuinfo spellings
    assert haswell.missing_on(["avx", "avx2"]) == ["sse4.1", "sse4.2", "fma", "f16c"]
    assert Target.parse("rpi5").caps.missing_on(haswell)[0] == "arch:aarch64"


def test_gpu_capabilities():
    c = Target.parse("cuda -arch=sm_90a").caps
    assert isinstance(c, GpuCapabilities)
    assert (c.compute_capability, c.bf16, c.int8_dot, c.fp8) == (90, "mma-bf16", "imma", True)
    old = Target.parse("cuda -arch=sm_61").caps
    assert (old.tensor_cores, old.int8_dot, old.bf16, old.native_fp16) == (False, "dp4a", None, True)
    assert c.missing_on(["anything"]) == [] and json.dumps(c.to_json())


def test_cli_inspect_target(capsys):
    from kiln.cli import main

    assert main(["inspect", "--target", f"llvm -mcpu=haswell {X86}"]) == 0
    out = capsys.readouterr().out
    assert "isa avx2, 256-bit vectors x 16" in out and "avx2-pmaddubsw" in out
    assert main(["inspect", "--target", "graviton3", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["int8_dot"], d["bf16"], d["lanes"]["float32"]) == ("i8mm", "arm-bf16", 4)
    assert main(["inspect", "--target", "llvm -mcpu=notacpu"]) == 2
    assert "does not know -mcpu=notacpu" in capsys.readouterr().err
    assert main(["inspect"]) == 2  # neither a model nor a target
    assert "give a model" in capsys.readouterr().err


def test_cli_inspect_model_with_target(small_onnx_path, capsys):
    from kiln.cli import main

    assert main(["inspect", str(small_onnx_path), "--target", "rpi5"]) == 0
    out = capsys.readouterr().out
    assert "unsupported: none" in out and "int8     dotprod" in out
    assert main(["inspect", str(small_onnx_path), "--json", "--target", "rpi4"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "onnx" and d["capabilities"]["cpu"] == "cortex-a72"


def test_a_host_with_amx_is_named_sapphirerapids_whatever_its_model_number():
    """KVM reports an Emerald Rapids as model 167 (LLVM: rocketlake, a client core without AMX); AMX means Sapphire
    Rapids or later, so the host target is named so, and kiln inspect --target says why."""
    from kiln.capabilities import host_cpu_name

    name, why = host_cpu_name("rocketlake", frozenset({"amx_tile", "avx512f"}))
    assert name == "sapphirerapids" and "rocketlake" in why and "AMX" in why
    assert host_cpu_name("emeraldrapids", frozenset({"amx_tile"})) == ("emeraldrapids", None)
    assert host_cpu_name("znver4", frozenset({"avx512f"})) == ("znver4", None)
    assert host_cpu_name("rocketlake", frozenset({"avx512f"})) == ("rocketlake", None)  # no AMX: LLVM's guess stands


def test_inspect_target_host_names_its_cpu():
    from kiln.describe import format_capabilities, host_cpu_line, target_capabilities

    assert host_cpu_line("llvm -mcpu=znver4") is None
    text = format_capabilities(target_capabilities("host"), "host")
    assert "host cpu " in text.splitlines()[-1]
