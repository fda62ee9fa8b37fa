"""The compile pipeline as data: ordered rows of (name, factory, opt level, required) that a backend
(kiln/compiler/backends/) lists per stage. `--disable-pass NAME` drops every row of that name;
`--opt-level N` drops rows above N. Adding a pass is adding a row to the backends that run it.

  level 0  what the build needs: legalization to TIR
  level 1  graph clean-up: constants, no-ops, BatchNorm folding, dead code, TVM's fusion
  level 2  epilogue fusion and layout conversion (the default)

This module holds only what every backend's rows share (the row type, the stages, selecting rows by
level and name); it knows no target kind.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence

from ..errors import OptionsError


class Stage(enum.Enum):
    """Where a row runs: Kiln's graph passes, TVM's lowering to TIR and fusion, then kernel schedules."""

    GRAPH = "graph"
    LOWER = "lower"
    SCHEDULE = "schedule"


STAGES = tuple(Stage)


@dataclasses.dataclass(frozen=True)
class PassSpec:
    name: str
    make: Callable  # (options) -> tvm pass, or None where the row does nothing for these options
    opt_level: int
    required: bool = False
    graph: bool = True  # Kiln's graph passes (before lowering); ops_after is measured after them


def pass_names(rows: Sequence[PassSpec]) -> list[str]:
    """The rows' names, each once, in order."""
    return list(dict.fromkeys(s.name for s in rows))


def resolve_pass_names(rows: Sequence[PassSpec], given) -> tuple[str, ...]:
    """The pipeline's names for `given` pass names, matched case-insensitively (each once, in order);
    an unknown name fails with the closest known ones."""
    import difflib

    names = pass_names(rows)
    by_lower = {n.lower(): n for n in names}
    unknown = [g for g in given if str(g).lower() not in by_lower]
    if unknown:
        close = {g: difflib.get_close_matches(str(g).lower(), by_lower, n=3, cutoff=0.6) for g in unknown}
        hints = "; ".join(f"{g!r}: did you mean {' or '.join(by_lower[c] for c in m)}?" for g, m in close.items() if m)
        raise OptionsError(
            f"unknown pass name(s) {unknown}" + (f" ({hints})" if hints else ""),
            where="--disable-pass",
            fix=f"passes are: {', '.join(names)}",
        )
    return tuple(dict.fromkeys(by_lower[str(g).lower()] for g in given))


def select_rows(rows: Sequence[PassSpec], opt_level: int, disabled: tuple[str, ...] = ()) -> list[PassSpec]:
    """The rows a compile at `opt_level` runs with `disabled` dropped; a required row cannot be dropped."""
    names = pass_names(rows)
    disabled = resolve_pass_names(rows, disabled)
    needed = {s.name for s in rows if s.required}
    required = sorted(set(disabled) & needed)
    if required:
        raise OptionsError(
            f"pass(es) {required} cannot be disabled: the build needs them",
            where="--disable-pass",
            fix=f"optional passes are: {', '.join(n for n in names if n not in needed)}",
        )
    return [s for s in rows if s.name not in disabled and s.opt_level <= opt_level]
