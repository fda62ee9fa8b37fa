"""`kiln inspect`: what a model or an artifact is, as a dict (the CLI prints it or dumps JSON), and what
a target's hardware can do (its Capabilities)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from .errors import KilnError


def inspect_path(path: str | os.PathLike, trusted_keys=None) -> dict:
    """An artifact, or a model of any format Kiln reads (detected by content: frontends/detect.py).
    trusted_keys: an artifact's signature must verify against one of them."""
    from .frontends.detect import detect_format
    from .frontends.preflight import inspect_onnx
    from .frontends.sources import describe

    p = Path(path)
    fmt = detect_format(p) if p.is_file() else "onnx"
    if fmt == "kiln" or (fmt == "onnx" and zipfile.is_zipfile(p)):
        return inspect_artifact(p, trusted_keys)
    return describe(p) if p.is_file() else inspect_onnx(p)


def inspect_artifact(path, trusted_keys=None) -> dict:
    """The manifest, after verifying every member's checksum (and, with trusted_keys, the signature),
    and who signed it: {"signed": bool, "key_id": str | None, "verified": bool}."""
    from .runtime.artifact import read_artifact
    from .runtime.hostinfo import missing_cpu_features

    manifest, _ = read_artifact(path, trusted_keys=list(trusted_keys) if trusted_keys else None)
    return {
        "kind": "artifact",
        "path": str(path),
        "manifest": manifest,
        "checksums_verified": len(manifest["members"]),
        "signature": {**_signer(path), "verified": bool(trusted_keys)},
        "runs_here": not missing_cpu_features(manifest["cpu_features"]),
    }


def _signer(path) -> dict:
    """Whether the artifact carries a signature, and the key id it names (read, not verified)."""
    import json

    from .runtime.signing import SIGNATURE

    with zipfile.ZipFile(path) as z:
        if SIGNATURE not in z.namelist():
            return {"signed": False, "key_id": None}
        try:
            return {"signed": True, "key_id": str(json.loads(z.read(SIGNATURE))["key_id"])}
        except (ValueError, KeyError, TypeError):
            return {"signed": True, "key_id": None}


def _signature_line(info: dict) -> str:
    sig = info["signature"]
    if not sig["signed"]:
        return "  signed   no (kiln sign MODEL.kiln --key PRIVATE signs it)"
    if sig["verified"]:
        return f"  signed   by key {sig['key_id']}, verified against --trusted-key"
    return f"  signed   by key {sig['key_id']}, not verified (give --trusted-key PUBLIC.pem to check it)"


def _precision_lines(manifest: dict) -> list[str]:
    """Per unit of the CPU: the kernels it runs and their share of the FLOPs; then each multiply-add layer of a
    reduced-precision build that stayed float32, and why (compiler/precision_units.py)."""
    info = (manifest.get("buckets") or [{}])[0].get("kernel_info") or {}
    from .compiler.precision_units import summary

    lines = [
        f"  compute  {p} on {u}: {n} kernel(s), {100 * share:.0f}% of the FLOPs" for p, u, n, share in summary(info)
    ]
    for name, v in info.items():
        if "why" in v:
            ops = ", ".join(v.get("ops", [])[:3]) or name
            lines.append(f"  wider    {ops}: {v['precision']} ({v['why']})")
    return lines


def format_text(info: dict) -> str:
    lines = [f"{info['kind']}: {info['path']}"]
    if info["kind"] == "artifact":
        m = info["manifest"]
        lines += [
            f"  format {m['format_version']}, kiln {m['kiln_version']}, TVM {m['tvm_version']}",
            f"  target   {m['target']} ({m['arch']})",
            f"  needs    {', '.join(m['cpu_features']) or '-'}"
            f"{'' if info['runs_here'] else '  (this host lacks some)'}",
        ]
        for kind in ("inputs", "outputs"):
            for t in m[kind]:
                lines.append(f"  {kind[:-1]:7}  {t['name']}: {'x'.join(map(str, t['shape']))} {t['dtype']}")
        if len(m.get("buckets", [])) > 1:
            lines.append(
                f"  buckets  {', '.join(b['name'] for b in m['buckets'])} (policy {m.get('bucket_policy', 'pad')})"
            )
        lines += _precision_lines(m)
        wbytes = sum(w["nbytes"] for w in m["weights"])
        lines.append(f"  weights  {len(m['weights'])} tensors, {wbytes / 1e6:.2f} MB")
        for name, meta in m["members"].items():
            lines.append(f"  member   {name}: {meta['size']} bytes sha256 {meta['sha256'][:16]}...")
        lines.append(f"  verified the sha256 of all {info['checksums_verified']} members against the manifest")
        lines.append(_signature_line(info))
        return "\n".join(lines)
    if "frontend" in info:
        lines.append(f"  frontend {info['frontend']}")
    lines.append(f"  producer {info['producer'] or '-'}; opsets {info['opsets']}; {info['nodes']} nodes")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            dims = "x".join("?" if d is None else str(d) for d in t["shape"]) if t["shape"] is not None else "?"
            lines.append(f"  {kind[:-1]:7}  {t['name']}: {dims} {t['dtype']}")
    lines.append("  ops      " + ", ".join(f"{k} {v}" for k, v in info["op_histogram"].items()))
    bad = info["unsupported_ops"]
    lines.append(
        "  unsupported: "
        + (
            "none"
            if not bad
            else "; ".join(f"{b['domain']}::{b['op_type']} x{b['count']} (first {b['first_node']!r})" for b in bad)
        )
    )
    return "\n".join(lines)


def target_capabilities(spec):
    """The capabilities of a --target string (kiln.capabilities); a bad string raises TargetError."""
    from .target import Target

    return Target.parse(spec).caps


def host_cpu_line(spec) -> str | None:
    """For the host target: which -mcpu Kiln named it and why, where that is not LLVM's own guess."""
    if spec is not None and str(spec).strip() not in ("", "host", "llvm"):
        return None
    from tvm.target import codegen

    from .capabilities import host_cpu_name
    from .runtime.hostinfo import host_cpu_flags

    guess = str(codegen.llvm_get_system_cpu())
    name, why = host_cpu_name(guess, host_cpu_flags())
    return f"  host cpu {name}: " + (why or "LLVM's name for this CPU (from its family and model numbers)")


def format_capabilities(caps, spec=None) -> str:
    """A target's capabilities as the few lines `kiln inspect --target` prints (and, for the host, how its
    CPU was named)."""
    line = host_cpu_line(spec)
    return caps.describe() + (f"\n{line}" if line else "")


__all__ = ["inspect_path", "format_text", "target_capabilities", "format_capabilities", "KilnError"]
