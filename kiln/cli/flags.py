"""Flags that several subcommands share, declared once here, and the argparse arguments of options
fields: every default, choice and help text comes from the options dataclass's `option()` field
(kiln/optfield.py), so the CLI restates none of them."""

from __future__ import annotations

import argparse
import dataclasses

from ..optfield import flag_name, flag_of

# the CompileOptions fields the pipeline flags set (compile, tune and inspect --passes take them)
PIPELINE_FIELDS = (
    "target",
    "input_shapes",
    "freeze_inputs",
    "opt_level",
    "disabled_passes",
    "layout",
    "precision",
)


def _shown(default) -> str:
    """' (default: X)' for a default worth printing (not None, empty or a bool)."""
    if default is dataclasses.MISSING or default is None or isinstance(default, bool) or default == ():
        return ""
    return f" (default: {default})".replace("%", "%%")


def _type_of(f: dataclasses.Field):
    """The value type of a flag without an explicit one: the default's, else str."""
    if f.default is not None and f.default is not dataclasses.MISSING and not isinstance(f.default, tuple):
        return type(f.default)
    return str


def add_options(p, cls, *names: str) -> None:
    """Add the flags of the fields `names` of the options dataclass `cls` to the parser (or group) p.
    A flag not given leaves its field out of the namespace (argparse.SUPPRESS), so the dataclass's
    own default applies: see `given`."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in names:
        f = fields[name]
        spec = flag_of(f)
        kw = {"dest": name, "default": argparse.SUPPRESS, "help": spec.help.replace("%", "%%")}
        if isinstance(f.default, bool):
            kw["action"] = "store_false" if f.default else "store_true"
        else:
            kw["help"] += _shown(f.default)
            kw["type"] = spec.type or _type_of(f)
            if spec.repeat:
                kw["action"] = "append"
            if spec.choices is not None:
                kw["choices"] = spec.choices
            if spec.metavar is not None:
                kw["metavar"] = spec.metavar
        p.add_argument(flag_name(f), **kw)


def given(cls, a: argparse.Namespace) -> dict:
    """The fields of `cls` that the command line set (flags added by `add_options`)."""
    return {f.name: getattr(a, f.name) for f in dataclasses.fields(cls) if flag_of(f) and hasattr(a, f.name)}


def pipeline_flags(p: argparse.ArgumentParser) -> None:
    """The flags that choose what is built: target, shapes, passes, layout, precision."""
    from ..compiler.options import CompileOptions

    add_options(p, CompileOptions, *PIPELINE_FIELDS)


def compile_options(a):
    """The CompileOptions of a subcommand's parsed flags (compile, tune, inspect --passes)."""
    from ..compiler.options import CompileOptions

    return CompileOptions.make(**given(CompileOptions, a))


def trusted_key(p: argparse.ArgumentParser) -> None:
    """--trusted-key: the signature check of every command that reads an artifact."""
    p.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PUBLIC.pem",
        help="refuse the artifact unless one of these keys signed it (repeatable)",
    )


def trusted_keys(a) -> tuple | None:
    """The --trusted-key paths, or None for "no signature required"."""
    return tuple(a.trusted_key) or None


def output_flags(p: argparse.ArgumentParser, plot_help: str) -> None:
    """--json and --plot of the measuring commands (bench, profile)."""
    p.add_argument("--json", default=None, metavar="OUT.json", help="write the full results")
    p.add_argument("--plot", default=None, metavar="OUT.png", help=plot_help + " (needs matplotlib: kiln[bench])")


def require(module: str, extra: str, flag: str) -> None:
    """Fail before anything runs when `flag` needs an optional package that is not installed, naming
    the extra that installs it."""
    import importlib.util

    from ..errors import OptionsError

    if importlib.util.find_spec(module) is None:
        raise OptionsError(
            f"{flag} needs {module}, which is not installed",
            where=flag,
            fix=f"pip install 'kiln[{extra}]' (or pip install {module})",
        )


def check_writable(path: str | None, flag: str) -> None:
    """Fail before anything runs when an output file of `flag` cannot be written (its folder is missing)."""
    from pathlib import Path

    from ..errors import OptionsError

    if path is not None and not Path(path).resolve().parent.is_dir():
        raise OptionsError(
            f"cannot write {path}: its folder does not exist", where=flag, fix="create the folder or give another path"
        )
