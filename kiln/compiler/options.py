"""One frozen options object for the compile stage. Everything in it that changes the output goes
into the artifact's manifest (`to_json`)."""
from __future__ import annotations

import dataclasses

from ..errors import OptionsError
from ..frontends.shapes import parse_input_shapes
from ..target import Target

OPT_LEVELS = (0, 1, 2, 3)
LAYOUTS = ("NCHW", "NHWC", "NCHWc", "auto")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    target: Target
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    opt_level: int = 2
    disabled_passes: tuple[str, ...] = ()
    layout: str = "NCHWc"

    @staticmethod
    def make(target=None, input_shapes=None, opt_level: int = 2, disabled_passes=(), layout: str = "NCHWc") -> CompileOptions:
        if opt_level not in OPT_LEVELS:
            raise OptionsError(f"opt level {opt_level!r} is not valid", fix=f"use one of {list(OPT_LEVELS)}")
        if layout not in LAYOUTS:
            raise OptionsError(f"layout {layout!r} is not valid", fix=f"use one of {', '.join(LAYOUTS)}")
        shapes = parse_input_shapes(input_shapes)
        return CompileOptions(Target.parse(target), tuple(sorted(shapes.items())), int(opt_level),
                              tuple(dict.fromkeys(disabled_passes)), layout)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.input_shapes)

    def to_json(self) -> dict:
        return {"target": str(self.target), "input_shapes": {k: list(v) for k, v in self.input_shapes},
                "opt_level": self.opt_level, "disabled_passes": list(self.disabled_passes), "layout": self.layout}
