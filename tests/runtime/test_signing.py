"""Signed artifacts (Ed25519 over the manifest): signed -> accepted, unsigned -> refused,
tampered -> refused, each with its reason; and the zip layout checks (zip-slip, links, sizes)."""

import json
import os
import shutil
import stat
import zipfile

import pytest
from helpers import rand
from tests_runtime_helpers import rewrite_manifest

import kiln
from kiln.cli import main
from kiln.runtime import artifact as art
from kiln.sign import keygen, sign


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    keygen(d / "a.key", d / "a.pub")
    keygen(d / "b.key", d / "b.pub")
    return d


@pytest.fixture
def signed(tmp_path, small_artifact, keys):
    p = tmp_path / "signed.kiln"
    shutil.copy(small_artifact, p)
    sign(p, keys / "a.key")
    return p


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(keys):
    assert stat.S_IMODE(os.stat(keys / "a.key").st_mode) == 0o600
    assert b"PUBLIC KEY" in (keys / "a.pub").read_bytes()
    with pytest.raises(kiln.OptionsError, match="refusing to overwrite"):
        keygen(keys / "a.key", keys / "other.pub")


def test_signed_artifact_is_accepted_and_runs(signed, keys, small_input, small_artifact):
    m = kiln.load(signed, trusted_keys=[keys / "a.pub", keys / "b.pub"])
    ref = kiln.load(small_artifact).run(small_input)["output"]
    assert (m.run(small_input)["output"] == ref).all()
    kiln.load(signed)  # without trusted keys a signed artifact loads as any other


def test_unsigned_artifact_is_refused_when_keys_are_given(small_artifact, keys):
    with pytest.raises(kiln.ArtifactError, match="not signed"):
        kiln.load(small_artifact, trusted_keys=[keys / "a.pub"])


def test_artifact_signed_by_another_key_is_refused(signed, keys):
    with pytest.raises(kiln.ArtifactError, match="not among the trusted keys"):
        kiln.load(signed, trusted_keys=[keys / "b.pub"])


def test_tampered_manifest_is_refused(signed, keys, tmp_path):
    bad = tmp_path / "bad.kiln"
    rewrite_manifest(signed, bad, created_unix=0)  # any change to the manifest, signature kept
    with pytest.raises(kiln.ArtifactError, match="modified after signing"):
        kiln.load(bad, trusted_keys=[keys / "a.pub"])


def test_tampered_member_is_refused(signed, keys, tmp_path):
    bad = tmp_path / "bad.kiln"
    with zipfile.ZipFile(signed) as z, zipfile.ZipFile(bad, "w") as out:
        for n in z.namelist():
            data = z.read(n)
            out.writestr(n, data[:-1] + bytes([data[-1] ^ 1]) if n == art.WEIGHTS else data)
    with pytest.raises(kiln.ArtifactError, match="checksum mismatch in member 'weights.bin'"):
        kiln.load(bad, trusted_keys=[keys / "a.pub"])


def test_bad_keys_are_clear_errors(signed, keys, tmp_path):
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(kiln.OptionsError, match="cannot read the public key"):
        kiln.load(signed, trusted_keys=[tmp_path / "junk.pub"])
    with pytest.raises(kiln.OptionsError, match="non-empty list"):
        kiln.load(signed, trusted_keys=[])
    with pytest.raises(kiln.OptionsError, match="cannot read the private key"):
        sign(signed, keys / "a.pub")


def test_cli_keygen_sign_and_trusted_run(tmp_path, small_artifact, capsys):
    import numpy as np

    assert main(["keygen", str(tmp_path / "k"), str(tmp_path / "k.pub")]) == 0
    assert main(["keygen", str(tmp_path / "other"), str(tmp_path / "other.pub")]) == 0
    model = tmp_path / "m.kiln"
    shutil.copy(small_artifact, model)
    np.savez(tmp_path / "in.npz", input=rand(1, 3, 8, 8))
    run = ["run", str(model), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]
    assert main(run + ["--trusted-key", str(tmp_path / "k.pub")]) == 2
    assert "not signed" in capsys.readouterr().err
    assert main(["sign", str(model), "--key", str(tmp_path / "k")]) == 0
    assert main(run + ["--trusted-key", str(tmp_path / "k.pub")]) == 0
    assert main(run + ["--trusted-key", str(tmp_path / "other.pub")]) == 2
    assert "not among the trusted keys" in capsys.readouterr().err


def _with_member(src, dst, info: zipfile.ZipInfo, data: bytes = b"x"):
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for n in z.namelist():
            out.writestr(n, z.read(n))
        out.writestr(info, data)


def _symlink(name):
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize(
    "info, msg",
    [
        (zipfile.ZipInfo("../evil.so"), "unsafe member path"),
        (zipfile.ZipInfo("/etc/evil"), "unsafe member path"),
        (zipfile.ZipInfo("sub/../../evil"), "unsafe member path"),
        (zipfile.ZipInfo("..\\evil"), "unsafe member path"),
        (_symlink("link.so"), "symlink"),
        (zipfile.ZipInfo("folder/"), "folder"),
        (zipfile.ZipInfo("extra.bin"), "does not list"),
    ],
)
def test_unsafe_members_are_refused_before_anything_is_read(tmp_path, small_artifact, info, msg):
    bad = tmp_path / "bad.kiln"
    _with_member(small_artifact, bad, info)
    with pytest.raises(kiln.ArtifactError, match=msg):
        kiln.load(bad)


def test_manifest_naming_a_library_outside_the_artifact_is_refused(tmp_path, small_artifact):
    bad = tmp_path / "bad.kiln"
    man = art.read_manifest(small_artifact)
    buckets = [dict(b, library="../../model.so") for b in man["buckets"]]
    rewrite_manifest(small_artifact, bad, buckets=buckets)
    with pytest.raises(kiln.ArtifactError, match="malformed bucket entry"):
        kiln.load(bad)


def test_oversized_manifest_is_refused(tmp_path, small_artifact, monkeypatch):
    monkeypatch.setattr(art, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(kiln.ArtifactError, match=r"member 'manifest.json' is \d+ bytes \(at most 100\)"):
        kiln.load(small_artifact)


def test_signature_json_is_not_a_listed_member_but_allowed(signed):
    with zipfile.ZipFile(signed) as z:
        assert art.SIGNATURE in z.namelist()
        sig = json.loads(z.read(art.SIGNATURE))
    assert sig["alg"] == "ed25519" and len(sig["key_id"]) == 16
