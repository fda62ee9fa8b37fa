"""Cross-compilation never runs the target's code on the host. Compile steps that execute code
(calibration, the int8 accuracy check, --layout auto, tuning) ask here first: whether this host
can run code built for the target, and if not, which host build stands in or which features the
host lacks (an OptionsError naming them, never a SIGILL)."""

from __future__ import annotations

import dataclasses

from ..errors import OptionsError
from ..runtime.hostinfo import host_arch, missing_cpu_features


def missing_on_host(target) -> list[str]:
    """What this host lacks to run CPU code built for `target` (empty: it can run it). A GPU target's host
    code is generic for this host's arch and requires no CPU feature."""
    if target.arch != host_arch():
        return [f"an {target.arch} CPU (this host is {host_arch()})"]
    return missing_cpu_features(target.required_features())


def host_options(options):
    """Options whose builds run here: the same, or the same graph built for this host's CPU (the
    float ranges calibration collects do not depend on the ISA; integer kernels agree exactly)."""
    if not missing_on_host(options.target):
        return options
    from ..target import Target

    host = Target.host()
    return dataclasses.replace(
        options,
        target=options.target.with_cpu(mcpu=host.mcpu, mtriple=None, mattr=host.mattr, num_cores=host.num_cores),
        tuning_db=None,
    )


def require_host_runs(target, what: str, where: str, fix: str) -> None:
    missing = missing_on_host(target)
    if missing:
        raise OptionsError(
            f"{what} runs the target's code, and this host lacks {', '.join(missing)}", where=where, fix=fix
        )
