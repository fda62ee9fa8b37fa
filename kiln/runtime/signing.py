"""Ed25519 signatures over an artifact's manifest (the `cryptography` package; nothing hand-rolled).

The manifest holds the sha256 of every other member, so a signature over the manifest's exact
bytes covers the whole artifact. `kiln sign` adds a `signature.json` member:
    {"alg": "ed25519", "key_id": <sha256 of the raw public key, 16 hex>, "signature": <base64>}
With trusted keys given, the loader refuses an artifact that is unsigned, signed by another key,
or whose manifest changed after signing, before any code is loaded."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from ..errors import ArtifactError, OptionsError

SIGNATURE = "signature.json"
ALG = "ed25519"


def crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise OptionsError(
            "signatures need the 'cryptography' package, which is not installed",
            where="artifact signatures",
            fix="pip install cryptography",
        ) from None
    return serialization, ed25519


def key_id(public_key) -> str:
    serialization, _ = crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_public_key(key):
    """A path to a PEM public key, PEM bytes, or a key object."""
    serialization, ed25519 = crypto()
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    where = str(key) if isinstance(key, (str, os.PathLike)) else "<key bytes>"
    try:
        data = Path(key).read_bytes() if isinstance(key, (str, os.PathLike)) else bytes(key)
        k = serialization.load_pem_public_key(data)
    except (OSError, ValueError, TypeError) as e:
        raise OptionsError(
            f"cannot read the public key ({type(e).__name__}: {e})",
            where=where,
            fix="give the PUBLIC file written by `kiln keygen PRIVATE PUBLIC`",
        ) from None
    if not isinstance(k, ed25519.Ed25519PublicKey):
        raise OptionsError(
            f"the key is {type(k).__name__}, not Ed25519", where=where, fix="make one with `kiln keygen`"
        )
    return k


def verify(manifest_bytes: bytes, signature_member: bytes | None, trusted_keys, where: str) -> str:
    """Raise ArtifactError unless the manifest is signed by one of the trusted keys; return its key id."""
    from cryptography.exceptions import InvalidSignature

    keys = {key_id(k): k for k in (load_public_key(k) for k in trusted_keys)}
    fix = (
        "sign it with `kiln sign MODEL.kiln --key PRIVATE` using a key whose public half you trust, "
        "or copy the artifact again"
    )
    if signature_member is None:
        raise ArtifactError("artifact is not signed, and trusted keys were given", where=where, fix=fix)
    try:
        sig = json.loads(signature_member)
        if sig.get("alg") != ALG:
            raise ArtifactError(f"signature algorithm {sig.get('alg')!r} is not {ALG}", where=where, fix=fix)
        kid, raw = str(sig["key_id"]), base64.b64decode(sig["signature"], validate=True)
    except ArtifactError:
        raise
    except Exception as e:
        raise ArtifactError(f"signature.json is malformed ({type(e).__name__})", where=where, fix=fix) from None
    if kid not in keys:
        raise ArtifactError(
            f"artifact is signed by key {kid}, which is not among the trusted keys {sorted(keys)}", where=where, fix=fix
        )
    try:
        keys[kid].verify(raw, manifest_bytes)
    except InvalidSignature:
        raise ArtifactError(
            f"signature of key {kid} does not match the manifest: the artifact was modified after signing",
            where=where,
            fix=fix,
        ) from None
    return kid
