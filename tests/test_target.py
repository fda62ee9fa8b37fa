import pytest

from kiln import TargetError
from kiln.target import Target


def test_host_is_detected_not_hard_coded():
    from tvm.target import codegen
    t = Target.parse(None)
    assert t == Target.parse("host") == Target.parse("llvm")
    assert t.mcpu == codegen.llvm_get_system_cpu() and t.kind == "llvm"
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
    assert (t.mtriple, t.mcpu, t.arch) == ("aarch64-linux-gnu", "cortex-a76", "aarch64") and "dotprod" in t.required_features()
    assert Target.parse(str(t)) == t
