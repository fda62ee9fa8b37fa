"""The CLI a new user meets (issue 23, item 7): one test per rough edge found by trying it on a fresh
clone, plus the options dataclasses being the only source of the flags' defaults (item 4)."""

import dataclasses
import subprocess
import sys

import onnx
import pytest
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.cli import main


def _conv(in_shape, size=8):
    """Conv + Relu + GlobalAveragePool: a CNN whose output does not depend on the spatial size."""
    nodes = [
        helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["output"]),
    ]
    return make_model(
        nodes,
        {"input": rand(1, 3, size, size)},
        ["output"],
        {"w": rand(4, 3, 3, 3, seed=1)},
        in_shapes={"input": in_shape},
    )


@pytest.fixture(scope="module")
def static_artifact(tmp_path_factory):
    """An artifact of a model whose input dims are all static (nothing to pin)."""
    d = tmp_path_factory.mktemp("static")
    onnx.save(_conv([1, 3, 8, 8]), d / "static.onnx")
    kiln.compile(d / "static.onnx", d / "static.kiln")
    return d / "static.kiln"


# --debug ------------------------------------------------------------------------------------------


def _raise_in_tvm(*_a, **_k):
    import tvm_ffi

    tvm_ffi.get_global_func("testing.test_raise_error")("ValueError", "boom from C++")


def test_debug_after_the_subcommand_shows_tvms_frames(tmp_path, monkeypatch, capsys):
    """`kiln inspect X --debug` is accepted (it was 'unrecognized arguments') and the traceback goes
    down into TVM's C++ frames (tvm_ffi appends them to the Python traceback)."""
    monkeypatch.setattr("kiln.describe.inspect_path", _raise_in_tvm)
    assert main(["inspect", str(tmp_path / "m.onnx"), "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "testing.cc" in err and "rerun with --debug" in err
    assert main(["inspect", str(tmp_path / "m.onnx")]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_debug_shows_the_tvm_error_a_kiln_error_hides(tmp_path, monkeypatch, capsys):
    """A KilnError raised `from None` over TVM's error: --debug still shows the TVM error and its frames."""

    def wrapped(*_a, **_k):
        try:
            _raise_in_tvm()
        except ValueError:
            raise kiln.KilnError("TVM failed", where="m.onnx", fix="report it") from None

    monkeypatch.setattr("kiln.describe.inspect_path", wrapped)
    assert main(["inspect", str(tmp_path / "m.onnx"), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "boom from C++" in err and "testing.cc" in err and "kiln inspect: error: m.onnx: TVM failed" in err


# bench --plot / --onnx ----------------------------------------------------------------------------


def test_bench_checks_optional_packages_before_running(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    ran = []
    monkeypatch.setattr("kiln.runtime.bench.bench", lambda *a, **k: ran.append(1))
    monkeypatch.setattr("kiln.runtime.profile.profile", lambda *a, **k: ran.append(1))
    for cmd in ("bench", "profile"):
        assert main([cmd, str(tmp_path / "m.kiln"), "--plot", str(tmp_path / "p.png")]) == 2
        err = capsys.readouterr().err
        assert "--plot needs matplotlib" in err and "pip install 'kiln[bench]'" in err, err
    assert main(["bench", str(tmp_path / "m.kiln"), "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert "folder does not exist" in capsys.readouterr().err
    assert main(["bench", str(tmp_path / "m.kiln"), "--warmup", "-1"]) == 2
    assert "warmup must be >= 0" in capsys.readouterr().err
    assert not ran


# --shape-buckets ----------------------------------------------------------------------------------


def test_shape_buckets_are_checked_before_any_is_built(tmp_path, monkeypatch, capsys):
    """Spatial buckets on a model whose spatial dims are static: refused at once (it took 14.5 s and
    named --input-shape), naming --shape-buckets, the bucket and the dims the model leaves open."""
    onnx.save(_conv(["N", 3, 8, 8]), tmp_path / "m.onnx")
    built = []
    monkeypatch.setattr("kiln.compiler.compile_model", lambda *a, **k: built.append(1))
    argv = ["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.kiln")]
    assert main([*argv, "--shape-buckets", "input:1x3x8x8,1x3x16x16"]) == 2
    err = capsys.readouterr().err
    assert not built  # refused before compile_model: no bucket was built
    assert "--shape-buckets gives 16" in err and "bucket 2 of 2" in err and "--input-shape" not in err, err
    assert "only dim(s) [0] of 'input' are symbolic" in err
    assert main([*argv, "--shape-buckets", "image:1x3x8x8,2x3x8x8"]) == 2
    assert "--shape-buckets names unknown input(s) ['image']" in capsys.readouterr().err


def test_python_api_checks_every_bucket_first(tmp_path, monkeypatch):
    """kiln.compile() runs the same bucket check as the CLI, before the first bucket is imported."""
    import kiln
    from kiln.errors import KilnError

    imported = []
    monkeypatch.setattr("kiln.compiler.build._import", lambda *a, **k: imported.append(1))
    with pytest.raises(KilnError, match="--shape-buckets gives 16") as e:
        kiln.compile(_conv(["N", 3, 8, 8]), tmp_path / "m.kiln", shape_buckets="input:1x3x8x8,1x3x16x16")
    assert not imported and "bucket 2 of 2" in str(e.value)


def test_spatial_buckets_on_a_model_with_symbolic_spatial_dims(tmp_path):
    """The working example: the model declares H and W symbolic, each bucket is one function."""
    onnx.save(_conv([1, 3, "H", "W"]), tmp_path / "m.onnx")
    art = tmp_path / "m.kiln"
    buckets = ["--shape-buckets", "input:1x3x8x8,1x3x16x16"]
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(art), *buckets]) == 0
    m = kiln.load(art)
    assert [b["name"] for b in m.manifest["buckets"]] == ["input:1x3x8x8", "input:1x3x16x16"]
    assert m.run({"input": rand(1, 3, 16, 16)})["output"].shape == (1, 4, 1, 1)


# --opt-level and pass names -----------------------------------------------------------------------


def test_opt_level_takes_only_what_the_pipeline_has(tmp_path, capsys):
    from kiln.compiler.backends import BACKENDS
    from kiln.compiler.options import OPT_LEVELS

    assert OPT_LEVELS == tuple(range(max(s.opt_level for b in BACKENDS.values() for s in b.all_rows()) + 1))
    with pytest.raises(SystemExit) as e:
        main(["compile", "m.onnx", "-o", str(tmp_path / "m.kiln"), "--opt-level", "3"])
    assert e.value.code == 2 and "invalid choice: 3 (choose from 0, 1, 2)" in capsys.readouterr().err
    with pytest.raises(kiln.KilnError, match=r"use one of \[0, 1, 2\]"):
        kiln.compiler.CompileOptions.make(opt_level=3)


def test_pass_names_any_case_and_did_you_mean():
    from kiln.compiler import CompileOptions

    assert CompileOptions.make(disabled_passes=["fuseepilogue", "FUSEEPILOGUE"]).disabled_passes == ("FuseEpilogue",)
    with pytest.raises(kiln.KilnError, match="did you mean FuseEpilogue") as e:
        CompileOptions.make(disabled_passes=["FuseEpilog"])
    assert e.value.where == "--disable-pass"


# kiln inspect -------------------------------------------------------------------------------------


def test_inspect_says_checksums_and_signer(tmp_path, static_artifact, capsys):
    art = tmp_path / "m.kiln"
    art.write_bytes(static_artifact.read_bytes())
    assert main(["inspect", str(art)]) == 0
    out = capsys.readouterr().out
    assert "verified the sha256 of all" in out and "signed   no" in out
    assert main(["keygen", str(tmp_path / "k"), str(tmp_path / "k.pub")]) == 0
    kid = capsys.readouterr().out.split("key id ")[1].strip()
    assert main(["sign", str(art), "--key", str(tmp_path / "k")]) == 0
    assert main(["inspect", str(art)]) == 0
    assert f"signed   by key {kid}, not verified" in capsys.readouterr().out
    assert main(["inspect", str(art), "--trusted-key", str(tmp_path / "k.pub")]) == 0
    assert f"signed   by key {kid}, verified against --trusted-key" in capsys.readouterr().out
    assert main(["keygen", str(tmp_path / "o"), str(tmp_path / "o.pub")]) == 0
    assert main(["inspect", str(art), "--trusted-key", str(tmp_path / "o.pub")]) == 2
    assert "not among the trusted keys" in capsys.readouterr().err


def test_inspect_into_a_closed_pipe(static_artifact):
    """`kiln inspect X | head -1`: the reader is gone before kiln writes; no BrokenPipeError."""
    p = subprocess.Popen(
        [sys.executable, "-m", "kiln", "inspect", str(static_artifact)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    p.stdout.close()  # nobody reads: the first write fails with EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "BrokenPipe" not in err and "Exception ignored" not in err, err


# run-time hints -----------------------------------------------------------------------------------


def test_shape_hint_suggests_input_shape_only_for_symbolic_dims(static_artifact, small_artifact):
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(static_artifact).run({"input": rand(1, 3, 16, 16)})
    assert "--input-shape" not in e.value.fix and "declares this shape static" in e.value.fix
    with pytest.raises(kiln.KilnError) as e:  # small_artifact: batch N pinned with --input-shape
        kiln.load(small_artifact).run({"input": rand(2, 3, 8, 8)})
    assert "--input-shape input:2x3x8x8" in e.value.fix


def test_article_before_the_architecture(static_artifact, monkeypatch):
    from kiln.runtime.model import _a

    assert (_a("aarch64"), _a("x86_64"), _a("riscv64")) == ("an aarch64", "an x86_64", "a riscv64")
    monkeypatch.setattr("kiln.runtime.model.host_arch", lambda: "riscv64")
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(static_artifact)
    arch = kiln.runtime.artifact.read_artifact(static_artifact)[0]["arch"]
    assert f"run it on {_a(arch)} machine" in e.value.fix and " a a" not in e.value.fix


# item 4: one source for each default --------------------------------------------------------------


def test_flags_take_their_defaults_from_the_dataclasses():
    from kiln.cli import build_parser
    from kiln.cli.flags import given
    from kiln.compiler import CompileOptions
    from kiln.runtime.bench import BenchOptions
    from kiln.serve.options import ServeOptions

    a = build_parser().parse_args(["compile", "m.onnx", "-o", "m.kiln"])
    assert given(CompileOptions, a) == {}  # nothing restated: the dataclass fills every default in
    o = CompileOptions.make()
    for f in dataclasses.fields(CompileOptions):
        if f.name not in ("target", "tuning_db", "backend"):
            assert getattr(o, f.name) == f.default, f.name
    a = build_parser().parse_args(["bench", "m.kiln", "--repeat", "3"])
    assert BenchOptions(**given(BenchOptions, a)) == BenchOptions(repeat=3)
    a = build_parser().parse_args(["serve", "m.kiln", "--no-warmup", "--port", "0"])
    assert given(ServeOptions, a) == {"warmup": False, "port": 0}


def test_help_shows_the_dataclass_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at any space
    assert "(default: 2)" in out and "(default: NCHWc)" in out and "{0,1,2}" in out


def test_trusted_key_is_declared_once():
    import pathlib

    src = "".join(p.read_text() for p in pathlib.Path(kiln.__file__).parent.joinpath("cli").glob("*.py"))
    assert src.count('"--trusted-key"') == 1
