"""`kiln prune`: structured channel pruning of an ONNX model into a smaller ONNX model (kiln/prune)."""

from __future__ import annotations

import json

ORDER = 15
COMMANDS = {"prune": "remove a fraction of each conv's output channels: ONNX in, smaller ONNX out (same I/O names)"}


def _summary(r: dict) -> str:
    changed = [l for l in r["layers"] if l["channels"][0] != l["channels"][1]]
    lines = [
        f"{'zeroed' if r['zero_only'] else 'removed'} {r['classes_removed']} channel groups ({r['criterion']}, ratio "
        f"{r['ratio']}) in {len(changed)} of {len(r['layers'])} layers: FLOPs {r['flops_before'] / 1e9:.3f} G -> "
        f"{r['flops_after'] / 1e9:.3f} G, parameters {r['parameters_before']:,} -> {r['parameters_after']:,}"
    ]
    if r["criterion_fallback"]:
        lines.append(f"  no BatchNormalization after {len(r['criterion_fallback'])} layer(s): ranked by l1 there")
    acc = r["accuracy"]
    if acc:
        from ..compiler.report import format_accuracy_lines

        lines += format_accuracy_lines(acc, "the original model")
    return "\n".join(lines)


def _prune(a) -> int:
    from .._io import atomic_write_bytes, atomic_write_text
    from ..prune import prune_model

    model, report = prune_model(
        a.model,
        a.ratio,
        criterion=a.criterion,
        calibration=a.calibration,
        min_agreement=a.min_agreement,
        keep=tuple(a.keep),
        zero_only=a.zero_only,
        multiple=a.multiple,
    )
    atomic_write_bytes(a.output, model.SerializeToString())
    if a.report:
        atomic_write_text(a.report, json.dumps(report, indent=2))
    print(_summary(report))
    print(f"wrote {a.output}")
    return 0


def register(sub) -> None:
    from ..prune import CRITERIA

    p = sub.add_parser("prune", help=COMMANDS["prune"])
    p.add_argument("model", metavar="MODEL.onnx")
    p.add_argument("-o", "--output", required=True, metavar="PRUNED.onnx")
    p.add_argument("--ratio", type=float, required=True, help="fraction of each layer's channels to remove, in (0, 1)")
    p.add_argument("--criterion", default="l1", choices=CRITERIA, help="how channels are ranked (default l1)")
    p.add_argument(
        "--calibration", default=None, metavar="DATA", help="an .npz (or folder of them) for the accuracy report"
    )
    p.add_argument(
        "--min-agreement",
        type=float,
        default=None,
        metavar="X",
        help="fail, writing nothing, when top-1 agreement (else output cosine) with the original is below X",
    )
    p.add_argument(
        "--multiple",
        type=int,
        default=8,
        metavar="N",
        help="keep channel counts that N divides multiples of N (blocked layouts; default 8, 16 for AVX-512, 1: exact)",
    )
    p.add_argument("--keep", action="append", default=[], metavar="LAYER", help="leave this layer's channels whole")
    p.add_argument("--zero-only", action="store_true", help="zero the channels but keep every shape (as PyTorch does)")
    p.add_argument("--report", default=None, metavar="REPORT.json", help="write the pruning report")
    p.set_defaults(fn=_prune)
