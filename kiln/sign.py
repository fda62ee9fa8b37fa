"""`kiln keygen` and `kiln sign`: make an Ed25519 key pair, sign an artifact's manifest in place
(rewritten atomically). Verification lives in the runtime (kiln.runtime.signing)."""

from __future__ import annotations

import base64
import json
import os
import zipfile
from pathlib import Path

from ._io import atomic_open, atomic_write_bytes
from .errors import ArtifactError, OptionsError
from .runtime import artifact as art
from .runtime.signing import ALG, SIGNATURE, crypto, key_id


def keygen(private_path: str | os.PathLike, public_path: str | os.PathLike) -> str:
    """Write a new key pair (the private key readable by its owner only); returns the key id."""
    serialization, ed25519 = crypto()
    if Path(private_path).exists():
        raise OptionsError(
            "the private key file exists; refusing to overwrite a key",
            where=str(private_path),
            fix="choose another path, or delete the old key first if you really mean to",
        )
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    with atomic_open(private_path, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(pem)
    atomic_write_bytes(
        public_path,
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    )
    return key_id(key.public_key())


def load_private_key(path: str | os.PathLike):
    serialization, ed25519 = crypto()
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise OptionsError(
            f"cannot read the private key ({type(e).__name__}: {e})",
            where=str(path),
            fix="give the PRIVATE file written by `kiln keygen PRIVATE PUBLIC`",
        ) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise OptionsError(
            f"the key is {type(key).__name__}, not Ed25519", where=str(path), fix="make one with `kiln keygen`"
        )
    return key


def sign(artifact_path: str | os.PathLike, private_key_path: str | os.PathLike) -> str:
    """Sign the artifact's manifest (after verifying every member) and store the signature in it."""
    key = load_private_key(private_key_path)
    art.read_artifact(artifact_path)  # never sign a corrupt artifact
    where = str(artifact_path)
    with zipfile.ZipFile(artifact_path) as z:
        infos = [(i, z.read(i.filename)) for i in z.infolist() if i.filename != SIGNATURE]
    manifest = next((data for i, data in infos if i.filename == art.MANIFEST), None)
    if manifest is None:
        raise ArtifactError("not a Kiln artifact (no manifest.json inside)", where=where, fix="sign a .kiln file")
    kid = key_id(key.public_key())
    sig = {"alg": ALG, "key_id": kid, "signature": base64.b64encode(key.sign(manifest)).decode()}
    with atomic_open(artifact_path, "wb") as f, zipfile.ZipFile(f, "w") as out:
        for info, data in infos:
            out.writestr(info, data)
        out.writestr(SIGNATURE, json.dumps(sig), compress_type=zipfile.ZIP_STORED)
    return kid
