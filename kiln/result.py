"""What kiln.compile returns. Its own module, free of TVM, because a compile that ran in another process
(kiln/_compile_elsewhere.py) is handed back pickled to one that cannot import TVM's compiler."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class CompileResult:
    path: Path
    manifest: dict
    report: dict

    @property
    def pass_seconds(self) -> dict:
        return self.report["pass_seconds"]
