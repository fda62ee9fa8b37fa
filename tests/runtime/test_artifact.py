"""Artifact integrity: the runtime refuses anything it cannot trust, before loading code."""

import shutil
import zipfile

import numpy as np
import pytest
from tests_runtime_helpers import rewrite_manifest, rewrite_manifest_features

import kiln
from kiln.runtime import artifact as art
from kiln.runtime.hostinfo import host_arch


def _member_data_offset(path, name) -> tuple[int, int]:
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + n + m, info.compress_size


def test_manifest_contents(small_artifact):
    m = art.read_manifest(small_artifact)
    assert m["format_version"] == art.FORMAT_VERSION and m["kiln_version"] == kiln.__version__
    assert m["target"].startswith("llvm -mcpu=") and m["arch"] == host_arch()
    assert "avx2" in m["cpu_features"] or m["arch"] != "x86_64"  # every x86-64 host Kiln targets has AVX2
    assert m["inputs"] == [{"name": "input", "shape": [1, 3, 8, 8], "dtype": "float32"}]
    assert m["outputs"] == [{"name": "output", "shape": [1, 4, 8, 8], "dtype": "float32"}]
    assert m["compile_options"]["input_shapes"] == {"input": [1, 3, 8, 8]}
    assert set(m["members"]) == {art.LIBRARY, art.WEIGHTS}
    with zipfile.ZipFile(small_artifact) as z:
        for name, meta in m["members"].items():
            assert art.sha256(z.read(name)) == meta["sha256"]
    # the weights ship as their own member: the conv weight (4x3x3x3) is in it
    assert [4, 3, 3, 3] in [w["shape"] for w in m["weights"]]


@pytest.mark.parametrize("member", [art.LIBRARY, art.WEIGHTS, art.MANIFEST])
def test_one_flipped_byte_is_refused(tmp_path, small_artifact, member):
    bad = tmp_path / "bad.kiln"
    shutil.copy(small_artifact, bad)
    off, size = _member_data_offset(bad, member)
    data = bytearray(bad.read_bytes())
    data[off + size // 2] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(kiln.ArtifactError, match="corrupt|checksum") as e:
        kiln.load(bad)
    assert str(bad) in str(e.value) and "recompile" in str(e.value)


def test_not_a_zip(tmp_path):
    p = tmp_path / "x.kiln"
    p.write_bytes(b"ELF this is not a zip" * 10)
    with pytest.raises(kiln.ArtifactError, match="not a valid .kiln file"):
        kiln.load(p)
    z = tmp_path / "other.kiln"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("hello.txt", "hi")
    with pytest.raises(kiln.ArtifactError, match="no manifest.json"):
        kiln.load(z)


def test_missing_cpu_feature_is_refused(tmp_path, small_artifact):
    p = tmp_path / "f.kiln"
    lacking = rewrite_manifest_features(small_artifact, p)
    with pytest.raises(kiln.IncompatibleArtifactError, match=f"CPU features this host lacks: {lacking}") as e:
        kiln.load(p)
    assert "recompile on this host" in str(e.value)


def test_wrong_arch_and_format_version(tmp_path, small_artifact):
    p = tmp_path / "a.kiln"
    rewrite_manifest(small_artifact, p, arch="riscv64")
    with pytest.raises(kiln.IncompatibleArtifactError, match="built for riscv64"):
        kiln.load(p)
    rewrite_manifest(small_artifact, p, format_version=99)
    with pytest.raises(kiln.IncompatibleArtifactError, match="format version 99"):
        kiln.load(p)


def test_write_is_atomic(tmp_path, small_artifact, monkeypatch):
    """A failure while writing leaves the previous artifact intact and no temp file behind."""
    dst = tmp_path / "keep.kiln"
    shutil.copy(small_artifact, dst)
    before = dst.read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", boom)
    with pytest.raises(RuntimeError):
        art.write_artifact(dst, {"x": 1}, {"a": b"1"})
    assert dst.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.kiln"]


def test_weights_roundtrip():
    arrs = [np.arange(7, dtype=np.float32), np.ones((2, 3), np.int8), np.zeros((0,), np.float64)]
    blob, index = art.pack_weights(arrs)
    assert all(w["offset"] % art.WEIGHT_ALIGN == 0 for w in index)
    for a, b in zip(arrs, art.unpack_weights(blob, index, "t")):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


@pytest.mark.parametrize("entry,msg", [(5, "entry is not a function name"), ("nope", "no entry function 'nope'")])
def test_bad_entry_is_refused(tmp_path, small_artifact, entry, msg):
    """Found by the fuzzer: an edited entry name crashed the loader with TVM's ValueError."""
    p = tmp_path / "e.kiln"
    rewrite_manifest(small_artifact, p, entry=entry)
    with pytest.raises(kiln.ArtifactError, match=msg):
        kiln.load(p)


@pytest.mark.parametrize("unaligned", [[1], [-1], "0", [True]])
def test_bad_unaligned_inputs_are_refused(tmp_path, small_artifact, unaligned):
    """A bucket's unaligned_inputs (inputs the runtime takes in place at any address) must name its inputs: an
    edited index would hand an unaligned array to a kernel that assumes alignment."""
    p = tmp_path / "u.kiln"
    man = art.read_manifest(small_artifact)
    rewrite_manifest(small_artifact, p, buckets=[dict(b, unaligned_inputs=unaligned) for b in man["buckets"]])
    with pytest.raises(kiln.ArtifactError, match=r"buckets\[0\].unaligned_inputs is not a list of input indices"):
        kiln.load(p)
