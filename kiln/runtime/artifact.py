"""The .kiln artifact: one zip holding manifest.json, the compiled library and the weights.
Standard library + numpy only: the runtime reads it without TVM's compiler. Every member's sha256
is in the manifest and is verified before any member is used."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from .._io import atomic_open
from ..errors import ArtifactError, IncompatibleArtifactError, KilnError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
MAX_MEMBER_BYTES = 8 << 30
MAX_MANIFEST_BYTES = 16 << 20
MAX_MEMBERS = 256
SIGNATURE = "signature.json"
BUCKET_POLICIES = ("pad", "error")  # inputs between shape buckets: zero-pad to the next bucket, or refuse
WEIGHT_ALIGN = 64


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> TensorSpec:
        return TensorSpec(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_weights(arrays: list[np.ndarray]) -> tuple[bytes, list[dict]]:
    """Concatenate arrays (each 64-byte aligned) into one blob; returns it and its index."""
    buf, index = io.BytesIO(), []
    for i, a in enumerate(arrays):
        a = np.ascontiguousarray(a).reshape(np.shape(a))  # keeps a 0-d weight 0-d
        pad = (-buf.tell()) % WEIGHT_ALIGN
        buf.write(b"\0" * pad)
        index.append(
            {"name": f"w{i}", "shape": list(a.shape), "dtype": str(a.dtype), "offset": buf.tell(), "nbytes": a.nbytes}
        )
        buf.write(a.tobytes())
    return buf.getvalue(), index


def np_dtype(name: str) -> np.dtype:
    """numpy dtype by name; bfloat16 (bf16 weights) comes from ml_dtypes, which TVM depends on."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def unpack_weights(blob: bytes, index: list[dict], where: str) -> list[np.ndarray]:
    out = []
    for w in index:
        dt = np_dtype(w["dtype"])
        count = int(np.prod(w["shape"], dtype=np.int64))
        if count * dt.itemsize != w["nbytes"] or w["offset"] + w["nbytes"] > len(blob):
            raise ArtifactError(
                f"weight {w['name']} does not fit the weights member", where=where, fix="recompile the model"
            )
        out.append(np.frombuffer(blob, dtype=dt, count=count, offset=w["offset"]).reshape(w["shape"]))
    return out


def write_artifact(path: str | os.PathLike, manifest: dict, members: dict[str, bytes]) -> None:
    """Write atomically: a reader never sees a half-written artifact."""
    manifest = dict(
        manifest,
        format_version=FORMAT_VERSION,
        members={n: {"sha256": sha256(b), "size": len(b)} for n, b in members.items()},
    )
    with atomic_open(path, "wb") as f, zipfile.ZipFile(f, "w") as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True), compress_type=zipfile.ZIP_DEFLATED)
        for name, data in members.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name.endswith(".so") else zipfile.ZIP_STORED)


def read_manifest(path: str | os.PathLike) -> dict:
    return read_artifact(path, members=())[0]


def read_artifact(path: str | os.PathLike, members=None, trusted_keys=None) -> tuple[dict, dict[str, bytes]]:
    """Open, check the layout (no paths that leave the folder, no links, size limits), verify the
    manifest's signature when trusted keys are given, check the format version, and verify every
    requested member (default: all the manifest lists) against its sha256. Nothing is extracted
    to disk here, and nothing is executed."""
    where = str(path)
    fix = "recompile the model with `kiln compile`, or copy the artifact again"
    if not Path(path).is_file():
        raise ArtifactError("no such artifact", where=where, fix="give the path of a .kiln file")
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if MANIFEST not in names:
                raise ArtifactError("not a Kiln artifact (no manifest.json inside)", where=where, fix=fix)
            _check_layout(z.infolist(), where, fix)
            manifest_bytes = z.read(MANIFEST)
            if trusted_keys is not None:
                from .signing import verify

                verify(manifest_bytes, z.read(SIGNATURE) if SIGNATURE in names else None, trusted_keys, where)
            manifest = json.loads(manifest_bytes)
            _check_manifest(manifest, where)
            unlisted = sorted(names - set(manifest["members"]) - {MANIFEST, SIGNATURE})
            if unlisted:
                raise ArtifactError(
                    f"artifact holds members its manifest does not list: {unlisted[:5]}", where=where, fix=fix
                )
            data = {}
            for name in manifest["members"] if members is None else members:
                if name not in manifest["members"] or name not in names:
                    raise ArtifactError(f"member {name!r} is missing", where=where, fix=fix)
                blob = z.read(name)
                if sha256(blob) != manifest["members"][name]["sha256"]:
                    raise ArtifactError(
                        f"checksum mismatch in member {name!r}: the artifact is corrupt or was modified",
                        where=where,
                        fix=fix,
                    )
                data[name] = blob
    except KilnError:
        raise
    except zipfile.BadZipFile as e:
        what = f"corrupt artifact ({e})" if "CRC" in str(e) else f"not a valid .kiln file (bad zip: {e})"
        raise ArtifactError(what, where=where, fix=fix) from None
    except Exception as e:  # zlib errors, bad CRC, JSON errors, truncated headers: all corruption
        raise ArtifactError(f"corrupt artifact ({type(e).__name__}: {e})", where=where, fix=fix) from None
    return manifest, data


def _check_layout(infos, where: str, fix: str) -> None:
    """Zip-slip, links, absurd sizes: refused before anything is read."""
    if len(infos) > MAX_MEMBERS:
        raise ArtifactError(f"artifact has {len(infos)} members (at most {MAX_MEMBERS})", where=where, fix=fix)
    seen = set()
    for info in infos:
        name = info.filename
        mode = (info.external_attr >> 16) & 0o170000
        if (
            name.startswith(("/", "\\"))
            or ".." in Path(name).parts
            or "\\" in name
            or ":" in name
            or "/" in name.rstrip("/")
        ):
            raise ArtifactError(
                f"unsafe member path {name!r} (only plain file names are allowed)", where=where, fix=fix
            )
        if mode == 0o120000 or info.is_dir():
            raise ArtifactError(
                f"member {name!r} is a {'symlink' if mode == 0o120000 else 'folder'}; artifacts hold plain files only",
                where=where,
                fix=fix,
            )
        limit = MAX_MANIFEST_BYTES if name == MANIFEST else MAX_MEMBER_BYTES
        if info.file_size > limit or info.file_size < 0:
            raise ArtifactError(f"member {name!r} is {info.file_size} bytes (at most {limit})", where=where, fix=fix)
        if name in seen:
            raise ArtifactError(f"member {name!r} appears twice", where=where, fix=fix)
        seen.add(name)


def _check_manifest(m: dict, where: str) -> None:
    """The manifest's schema, checked field by field: everything the loader reads has the right type
    and range, so a damaged or hostile manifest ends here, in an ArtifactError."""
    if not isinstance(m, dict):
        raise ArtifactError("manifest.json is not an object", where=where, fix="recompile the model")
    version = m.get("format_version")
    if version != FORMAT_VERSION:
        raise IncompatibleArtifactError(
            f"artifact format version {version!r}, this Kiln reads version {FORMAT_VERSION}",
            where=where,
            fix="recompile the model with this Kiln version",
        )
    for key in ("members", "inputs", "outputs", "target", "arch", "cpu_features", "weights", "tvm_version"):
        if key not in m:
            raise ArtifactError(f"manifest.json lacks {key!r}", where=where, fix="recompile the model")
    problems = _schema_problems(m)
    if problems:
        raise ArtifactError(
            f"manifest.json is malformed: {'; '.join(problems[:3])}", where=where, fix="recompile the model"
        )


def _is_int(v, lo=0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < 2**62


def _is_dtype(v) -> bool:
    try:
        return isinstance(v, str) and (v == "bfloat16" or np.dtype(v).kind in "biuf")
    except TypeError:
        return False


def _tensor_problems(key: str, specs, weight: bool = False) -> list[str]:
    if not isinstance(specs, list) or not specs and key.endswith("outputs"):
        return [f"{key} is not a {'non-empty ' if key.endswith('outputs') else ''}list"]  # a model may take no inputs
    lo = -1 if key.endswith("outputs") else 0  # -1: an output dimension that depends on the data
    for i, t in enumerate(specs):
        if (
            not isinstance(t, dict)
            or not isinstance(t.get("name"), str)
            or not _is_dtype(t.get("dtype"))
            or not isinstance(t.get("shape"), list)
            or not all(_is_int(d, lo) for d in t["shape"])
            or len(t["shape"]) > 16
        ):
            return [f"{key}[{i}] is not a tensor spec (name, shape, numeric dtype)"]
        if weight and not (_is_int(t.get("offset")) and _is_int(t.get("nbytes"))):
            return [f"{key}[{i}] has no valid offset/nbytes"]
    return []


def _schema_problems(m: dict) -> list[str]:
    out = []
    if not isinstance(m["members"], dict) or not all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and _is_int(v.get("size"))
        for v in m["members"].values()
    ):
        out.append("members is not a map of name -> {sha256, size}")
    for key in ("target", "arch", "tvm_version"):
        if not isinstance(m[key], str):
            out.append(f"{key} is not a string")
    if not isinstance(m["cpu_features"], list) or not all(isinstance(f, str) for f in m["cpu_features"]):
        out.append("cpu_features is not a list of strings")
    out += (
        _tensor_problems("inputs", m["inputs"])
        + _tensor_problems("outputs", m["outputs"])
        + _tensor_problems("weights", m["weights"], True)
    )
    if not isinstance(m.get("entry", "main"), str):
        out.append("entry is not a function name (string)")
    if m.get("bucket_policy", "pad") not in BUCKET_POLICIES:
        out.append(f"bucket_policy is not {' or '.join(BUCKET_POLICIES)}")
    buckets = m.get("buckets", [])
    if not isinstance(buckets, list):
        out.append("buckets is not a list")
        buckets = []
    for i, b in enumerate(buckets):
        if (
            not isinstance(b, dict)
            or not isinstance(b.get("name"), str)
            or not isinstance(b.get("library"), str)
            or not isinstance(b.get("weights"), list)
            or not all(_is_int(w) and w < len(m["weights"]) for w in b["weights"])
        ):
            out.append(f"buckets[{i}] is malformed")
            continue
        out += _tensor_problems(f"buckets[{i}].inputs", b.get("inputs")) + _tensor_problems(
            f"buckets[{i}].outputs", b.get("outputs")
        )
        unaligned = b.get("unaligned_inputs", [])  # absent in artifacts built before it
        n_inputs = len(b["inputs"]) if isinstance(b.get("inputs"), list) else 0
        if not isinstance(unaligned, list) or not all(_is_int(k) and k < n_inputs for k in unaligned):
            out.append(f"buckets[{i}].unaligned_inputs is not a list of input indices")
    return out
