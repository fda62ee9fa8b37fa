"""The optimization report as a table (`kiln inspect --passes`); the JSON form is the dict itself."""

from __future__ import annotations


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _hist(h: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in h.items()) or "-"


def format_report(r: dict) -> str:
    ratio = r["activation_bytes_naive"] / max(r["activation_bytes_planned"], 1)
    rows = [
        ("ops before", _hist(r["ops_before"])),
        ("ops after", _hist(r["ops_after"])),
        (
            "kernels",
            f"{r['kernels']} ({len(r['fused_groups'])} distinct fused groups, {r['epilogues_fused']} epilogues fused)",
        ),
        ("batchnorm folded", f"{r['batchnorm_folded']} / {r['batchnorm_total']}"),
        ("batchnorm as x*s+t", r.get("batchnorm_to_affine", 0)),
        ("constants folded", r["constants_folded"]),
        ("no-ops removed", r["noops_removed"]),
        ("clips canonicalized", r.get("clips_canonicalized", 0)),
        ("conv1d as conv2d", r.get("conv1d_as_conv2d", 0)),
        (
            "padding taps skipped",
            f"{r.get('conv_taps_dropped', 0)} convs cut, {r.get('conv_band_split', 0)} split into border bands",
        ),
        ("strided 1x1 convs on a subsampled input", r.get("strided_pointwise_subsampled", 0)),
        ("conv_transpose as conv", r.get("conv_transpose_as_conv", 0)),
        ("bilinear resize as matmul", r.get("resize_as_matmul", 0)),
        ("patch-embedding convs as matmul", r.get("patch_conv_as_matmul", 0)),
        (
            "layout",
            f"{r['layout']} ({r['layout_transforms']} layout transforms; "
            f"convs by layout: {_hist(r.get('conv_layouts', {}))})",
        ),
        (
            "winograd convs",
            f"{r.get('winograd_convs', 0)} (3x3 stride-1 convs as Winograd kernels; "
            "--disable-pass Winograd keeps them direct)",
        ),
        (
            "depthwise fused",
            f"{r.get('depthwise_fused', 0)} (depthwise + 1x1 conv pairs as one kernel; "
            "--disable-pass FuseDepthwisePointwise keeps two)",
        ),
        (
            "zero channels removed",
            f"{r.get('zero_channels_removed', 0)} ({r.get('zero_channel_flops_removed', 0) / 1e6:.1f} MFLOPs; "
            "constant channels of pruned models, per layer in the JSON report)",
        ),
        ("weights", _mb(r["weights_bytes"])),
        ("activations unfused", _mb(r["activation_bytes_unfused"])),
        ("activations naive", f"{_mb(r['activation_bytes_naive'])} (every kernel output, no reuse)"),
        (
            "activations planned",
            f"{_mb(r['activation_bytes_planned'])} in {r['buffers_planned']} buffers ({ratio:.1f}x less)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("fused groups:")
    lines += [f"  {g['calls']:>3} x {g['name']}" for g in r["fused_groups"][:15]]
    if len(r["fused_groups"]) > 15:
        lines.append(f"  ... {len(r['fused_groups']) - 15} more")
    lines.append("pass seconds:")
    lines += [f"  {k:<26} {v:8.3f}" for k, v in r["pass_seconds"].items()]
    return "\n".join(lines)


def format_quantization(q: dict) -> str:
    """What `kiln compile --quantize` prints: layers in int8 and float (with why), and the accuracy check."""
    acc = q["accuracy"]
    lines = [
        f"int8: {len(q['int8_layers'])} layers quantized "
        f"({q['calib_method']} calibration on {q['calib_samples']} samples); "
        f"{len(q['float_layers'])} kept float:"
    ]
    lines += [f"  {name}: {why}" for name, why in q["float_layers"].items()]
    if s := q.get("speed"):  # quantize/speed.py: the int8 kernel and the estimate against float32
        lines.append(
            f"int8 kernel {s['int8_kernel'] or 'none'}: predicted {s['predicted_ratio']}x float32's compute "
            f"(int8 {s['int8_gmac_equivalent']} vs float32 {s['float32_gmac']} GMAC-equivalents)"
            + (f"; {s['note']}" if s.get("note") else "")
        )
    held = "held-out" if acc["held_out"] else "calibration (no held-out samples)"
    return "\n".join(lines + format_accuracy_lines(acc, "the float model", f"{held} samples"))


def format_accuracy_lines(acc: dict, against: str, samples: str = "calibration samples") -> list[str]:
    """The accuracy report (quantize/accuracy.py) as lines: per output errors, cosine and top-1
    agreement, then the layers that moved most (kiln compile --quantize and kiln prune)."""
    lines = [f"accuracy vs {against} on {acc['samples']} {samples}:"]
    for name, o in acc["outputs"].items():
        top1 = f", top-1 agreement {o['top1_agreement']:.4f}" if "top1_agreement" in o else ""
        lines.append(
            f"  {name}: max abs error {o['max_abs_error']:.4g}, mean {o['mean_abs_error']:.4g}, "
            f"cosine {o['cosine']:.6f}{top1}"
        )
    lines.append(
        "  largest layer errors: "
        + (", ".join(f"{w['layer']} {w['relative_error']:.3g}" for w in acc["worst_layers"]) or "-")
    )
    return lines
