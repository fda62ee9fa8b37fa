import pytest

from kiln import TargetError
from kiln.target import Target


def test_host_is_detected_not_hard_coded(monkeypatch):
    from tvm.target import codegen

    from kiln.capabilities import host_cpu_name
    from kiln.runtime.hostinfo import host_cpu_flags

    monkeypatch.delenv("KILN_TARGET", raising=False)  # the suite may run with another default target
    t = Target.parse(None)
    assert t == Target.parse("host") == Target.parse("llvm")
    # LLVM's name from the model number, unless the CPU's features say otherwise (an AMX host read as rocketlake)
    llvm = codegen.llvm_get_system_cpu()
    assert t.mcpu == host_cpu_name(llvm, host_cpu_flags())[0] and t.kind == "llvm"
    if "amx_tile" in host_cpu_flags():
        assert t.mcpu != "rocketlake"
    assert str(t).startswith(f"llvm -mcpu={t.mcpu}")


def test_round_trip_and_dict():
    t = Target.parse("llvm -mcpu=skylake-avx512 -num-cores=4 -mattr=+avx512f,+fma")
    assert t.to_dict() == {"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["+avx512f", "+fma"], "num-cores": 4}
    assert Target.parse(str(t)) == t
    assert "avx512f" in t.required_features() and "amx-tile" not in t.required_features()


def test_arm64_preset():
    t = Target.parse("arm64")
    assert t.arch == "aarch64" and t.mtriple == "aarch64-linux-gnu" and "neon" in t.required_features()


@pytest.mark.parametrize("bad", ["opencl", "llvm -mcpu", "llvm -num-cores=zero", "llvm -foo=bar", "llvm 'unclosed"])
def test_bad_targets_list_forms(bad):
    with pytest.raises(TargetError, match="use one of: host \\| llvm"):
        Target.parse(bad)


def test_board_presets():
    from kiln.target import Target

    t = Target.parse("rpi5")
    assert (t.mtriple, t.mcpu, t.arch) == (
        "aarch64-linux-gnu",
        "cortex-a76",
        "aarch64",
    ) and "dotprod" in t.required_features()
    assert Target.parse(str(t)) == t


def test_unknown_mcpu_is_a_target_error_and_quiet(capfd):
    """LLVM itself would print one "not valid" line per codegen call and build for a generic CPU."""
    with pytest.raises(TargetError) as e:
        Target.parse("llvm -mcpu=haswel -mtriple=x86_64-linux-gnu")
    msg = str(e.value)
    assert msg.startswith("--target: ") and "does not know -mcpu=haswel" in msg and "did you mean haswell" in msg
    assert "skylake-avx512" in msg and "znver4" in msg  # the fix lists every CPU LLVM knows for the triple
    with pytest.raises(TargetError, match="notacpu"):
        Target.parse("llvm -mcpu=notacpu")
    with pytest.raises(TargetError, match="for aarch64-linux-gnu.*cortex-a72"):
        Target.parse("rpi4 -mcpu=haswell")  # an x86 CPU for an Arm triple
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.parametrize(
    "bad, msg",
    [
        ("llvm -mattr=avx2 -mtriple=x86_64-linux-gnu", "needs a leading \\+ .* -> write -mattr=\\+avx2"),
        ("llvm -mattr=+avx3 -mtriple=x86_64-linux-gnu", "does not know the feature 'avx3'.*did you mean avx, avx2"),
        ("llvm -mattr=+avx2,-avx2 -mtriple=x86_64-linux-gnu", "both enables and disables 'avx2'"),
        ("arm64 -mattr=+neon,+dotprd", "'dotprd'.*did you mean dotprod"),
        ("llvm -mtriple=foo-bar-baz", "no backend for -mtriple=foo-bar-baz"),
    ],
)
def test_bad_mattr_and_triple(bad, msg, capfd):
    with pytest.raises(TargetError, match=msg):
        Target.parse(bad)
    assert capfd.readouterr().err == ""  # LLVM's "not a recognized feature" kept off stderr


def test_valid_features_are_not_rejected(capfd):
    """Features no CPU enables by default are still LLVM features; disabling one is fine too."""
    t = Target.parse("llvm -mcpu=haswell -mtriple=x86_64-linux-gnu -mattr=+rtm,+retpoline,-avx2,+fma")
    assert t.mattr == ("+rtm", "+retpoline", "-avx2", "+fma") and "avx2" not in t.required_features()
    assert "sve2" in Target.parse("graviton3 -mattr=+neon,+sve2").caps.llvm_features
    assert Target.parse("llvm -mtriple=armv7a-linux-gnueabihf -mcpu=cortex-a9").mcpu == "cortex-a9"
    assert capfd.readouterr().err == ""


def test_cuda_arch_is_checked():
    for ok in ("sm_50", "sm_80", "sm_90a", "sm_100", "sm_120"):
        assert Target.parse(f"cuda -arch={ok}").gpu_arch == ok
    with pytest.raises(TargetError, match="unknown CUDA arch 'sm_999'.* -> use one of: sm_50, .*sm_90a, .*sm_120"):
        Target.parse("cuda -arch=sm_999")
    with pytest.raises(TargetError, match="did you mean .*sm_86"):
        Target.parse("cuda -arch=sm_85")


def test_a_target_is_a_kind_and_its_record():
    from kiln.target import CPUSpec, CUDASpec, Kind, VTASpec

    cpu = Target.parse("llvm -mcpu=znver3 -mtriple=x86_64-linux-gnu -num-cores=2")
    assert (cpu.kind, cpu.spec) == (Kind.LLVM, CPUSpec("znver3", "x86_64-linux-gnu", (), 2)) and cpu.cpu is cpu.spec
    gpu = Target.parse("cuda -arch=sm_86")
    assert (gpu.kind, gpu.spec, gpu.cpu, gpu.mcpu, gpu.mattr) == (Kind.CUDA, CUDASpec("sm_86"), None, None, ())
    vta = Target.parse("vta-sim -board=ultra96 -mcpu=znver3 -mtriple=x86_64-linux-gnu")
    assert vta.kind == "vta-sim" and isinstance(vta.spec, VTASpec) and vta.spec.board == "ultra96"
    assert vta.cpu == CPUSpec("znver3", "x86_64-linux-gnu") and vta.to_dict() == vta.cpu.to_dict()
    assert vta.vta_config().board == "ultra96" and cpu.vta_config() is None and gpu.gpu_arch == "sm_86"
    for t in (cpu, gpu, vta):
        assert Target.parse(str(t)) == t and hash(Target.parse(str(t))) == hash(t)
    assert str(vta) == "vta-sim -board=ultra96 -config=1x16_i8w8a32_15_15_18_17 -mcpu=znver3 -mtriple=x86_64-linux-gnu"
    with pytest.raises(TypeError, match="CUDASpec"):
        Target(Kind.CUDA, CPUSpec())  # a record of another kind


def test_with_cpu_replaces_the_cpu_record_only():
    vta = Target.parse("vta-sim -board=pynq -mcpu=znver3 -mtriple=x86_64-linux-gnu")
    moved = vta.with_cpu(mcpu="haswell", mtriple=None, num_cores=3)
    assert moved.kind == vta.kind and moved.spec.board == "pynq" and (moved.mcpu, moved.mtriple) == ("haswell", None)
    assert str(moved).startswith("vta-sim -board=pynq -config=") and moved.num_cores == 3
    assert Target.parse("llvm -mcpu=znver3").with_cpu(mattr=("+avx2",)).mattr == ("+avx2",)
    with pytest.raises(ValueError, match="no CPU options"):
        Target.parse("cuda").with_cpu(mcpu="znver3")
