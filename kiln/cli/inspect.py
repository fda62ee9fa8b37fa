"""`kiln inspect`: describe a model (.onnx, .pt2, .tflite), a .kiln artifact, a target's capabilities, or the passes."""

from __future__ import annotations

import json

from ..errors import OptionsError
from .flags import compile_options, pipeline_flags, trusted_key, trusted_keys

ORDER = 60
COMMANDS = {"inspect": "describe a model (.onnx/.pt2/.tflite) or a .kiln artifact, and/or a --target's capabilities"}


def _inspect(a) -> int:
    from ..describe import format_capabilities, format_text, inspect_path, target_capabilities

    target = getattr(a, "target", None)
    if a.model is None:  # `kiln inspect --target T`: what the target's hardware can do
        if target is None or a.passes:
            raise OptionsError(
                "give a model, or --target alone to see a target's capabilities",
                where="kiln inspect",
                fix='kiln inspect MODEL [--passes] or kiln inspect --target "llvm -mcpu=haswell"',
            )
        caps = target_capabilities(target)
        print(json.dumps(caps.to_json(), indent=2) if a.json else format_capabilities(caps, target))
        return 0
    if a.passes:
        from ..compiler.build import analyze_model
        from ..compiler.report import format_report

        report = analyze_model(a.model, compile_options(a))
        print(json.dumps(report, indent=2) if a.json else format_report(report))
        return 0
    info = inspect_path(a.model, trusted_keys(a))
    caps = target_capabilities(target) if target is not None else None
    if a.json:
        print(json.dumps({**info, "capabilities": caps.to_json()} if caps else info, indent=2))
    else:
        print(format_text(info) + ("\n" + format_capabilities(caps) if caps else ""))
    return 0


def register(sub) -> None:
    i = sub.add_parser("inspect", help=COMMANDS["inspect"])
    i.add_argument("model", nargs="?", default=None, help="optional with --target: then only the target is described")
    i.add_argument("--json", action="store_true")
    i.add_argument(
        "--passes", action="store_true", help="run the pipeline (no build) and print the optimization report"
    )
    pipeline_flags(i)
    trusted_key(i)
    i.set_defaults(fn=_inspect)
