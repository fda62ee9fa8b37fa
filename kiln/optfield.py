"""Options-dataclass fields that carry their command-line flag. A field declared with `option()` is the
one place its default, choices and help are written: `kiln.cli.flags` builds the argparse argument
from it, and the dataclass (or its `make()`) fills in the default. Kept free of TVM and argparse so
that every layer (compiler, runtime, serve, schedules) can declare its options with it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Flag:
    help: str
    name: str | None = None  # default: --field-name
    metavar: str | None = None
    choices: tuple | None = None
    type: Callable | None = None  # default: the type of the default (str when the default is None)
    repeat: bool = False  # repeatable: the values are collected into a list (argparse's append)


def option(default=dataclasses.MISSING, help: str = "", **flag) -> dataclasses.Field:
    """A dataclass field with `default` whose command-line flag is described by `Flag(help, **flag)`."""
    return dataclasses.field(default=default, metadata={"flag": Flag(help, **flag)})


def flag_of(f: dataclasses.Field) -> Flag | None:
    return f.metadata.get("flag")


def flag_name(f: dataclasses.Field) -> str:
    """The option string of a flagged field, e.g. `--opt-level` for `opt_level`."""
    return flag_of(f).name or "--" + f.name.replace("_", "-")


def defaults(cls) -> dict:
    """{field name: default} of every field of the dataclass `cls` that has one."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def with_defaults(cls, given: dict, skip: tuple[str, ...] = ()) -> dict:
    """`given` completed with the defaults of `cls`; a value given as None takes the default too, and a
    name that is not a field raises TypeError, as a call with an unknown keyword would."""
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(f"{cls.__name__} has no option(s) {unknown}")
    d = {k: v for k, v in defaults(cls).items() if k in names}
    return d | {k: v for k, v in given.items() if v is not None}
