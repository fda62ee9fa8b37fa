"""Flags that several subcommands share, declared once here, and the compile options they make."""

from __future__ import annotations

import argparse


def pipeline_flags(p: argparse.ArgumentParser) -> None:
    """The flags that choose what is built: target, shapes, passes, layout, precision."""
    p.add_argument("--target", default=None, help="default: the host CPU, detected")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME:1x3x224x224")
    p.add_argument(
        "--freeze-input",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="repeatable: compile this input in as a constant (a scalar or small array, e.g. sr=16000, "
        "axes=[0,2]); Ifs and shapes that depend on it fold away",
    )
    p.add_argument(
        "--opt-level", type=int, default=2, help="0: lowering only, 1: + graph clean-up, 2: + fusion (default)"
    )
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME", help="repeatable")
    p.add_argument(
        "--layout",
        default="NCHWc",
        help="NCHWc (default: channels blocked by the vector width), NCHW, NHWC, or auto (measure all on this host)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        metavar="fp32|fp16|bf16",
        help="mixed precision with fp32 accumulation (kiln tune: tune the kernels of that build)",
    )


def trusted_key(p: argparse.ArgumentParser) -> None:
    """--trusted-key: the loaders' signature check (run, bench, profile, serve, unpack)."""
    p.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PUBLIC.pem",
        help="refuse the artifact unless one of these keys signed it (repeatable)",
    )


def threads(p: argparse.ArgumentParser, help: str = "default: physical cores") -> None:
    p.add_argument("--threads", type=int, default=None, help=help)


def trusted_keys(a) -> tuple | None:
    """The --trusted-key paths, or None for "no signature required"."""
    return tuple(a.trusted_key) or None


def compile_options(a):
    """The CompileOptions of a subcommand's parsed pipeline flags (compile, tune, inspect --passes)."""
    from ..compiler import CompileOptions

    return CompileOptions.make(
        target=a.target,
        input_shapes=a.input_shape,
        opt_level=a.opt_level,
        disabled_passes=tuple(a.disable_pass),
        layout=a.layout,
        tuning_db=getattr(a, "tuning_db", None),
        shape_buckets=getattr(a, "shape_buckets", None),
        bucket_policy=getattr(a, "bucket_policy", "pad"),
        max_memory=getattr(a, "max_memory", None),
        quantize=getattr(a, "quantize", None),
        calibration=getattr(a, "calibration", None),
        calib_method=getattr(a, "calib_method", "minmax"),
        calib_samples=getattr(a, "calib_samples", None),
        min_agreement=getattr(a, "min_agreement", None),
        keep_float=tuple(getattr(a, "keep_float", ()) or ()),
        precision=getattr(a, "precision", "fp32"),
        freeze_inputs=tuple(getattr(a, "freeze_input", ()) or ()),
    )
