"""Which CPUs and how many threads this process's models use, when several replicas share a host (Ray
actors, pods without CPU limits, `kiln serve` processes): `KILN_CPUS` (a CPU list, "2-3" or "0,4")
narrows the process's affinity mask before the thread pool starts, and the pool pins its workers
inside that mask only (pool.c: with every CPU allowed it pins nothing, so replicas never pin onto the
same cores); `KILN_NUM_THREADS` sets the threads a model uses when the caller gives none."""

from __future__ import annotations

import functools
import os

from .. import env
from ..errors import OptionsError
from .hostinfo import physical_cores

CPUS_ENV, THREADS_ENV = env.CPUS, env.NUM_THREADS


def parse_cpus(text: str) -> set[int]:
    """ "0-1,4" -> {0, 1, 4}."""
    cpus = set()
    try:
        for part in filter(None, text.replace(" ", "").split(",")):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        cpus = set()
    if not cpus or min(cpus) < 0:
        raise OptionsError(f"{CPUS_ENV}={text!r} is not a CPU list", where=CPUS_ENV, fix="e.g. KILN_CPUS=2-3 or 0,4")
    return cpus


@functools.cache
def apply_cpus() -> set[int]:
    """Narrow this process to KILN_CPUS (once, before any pool thread exists); -> the CPUs it may use
    (KILN_CPUS, or the mask it started with: what TVM's pool set-up widens is restored to it)."""
    text = env.replica_cpus()
    if text:
        cpus = parse_cpus(text)
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            allowed = sorted(os.sched_getaffinity(0))
            msg = f"{CPUS_ENV}={text!r}: {e.strerror}"
            raise OptionsError(msg, where=CPUS_ENV, fix=f"name CPUs of {allowed}") from None
        physical_cores.cache_clear()
    return os.sched_getaffinity(0)


def default_threads() -> int:
    """KILN_NUM_THREADS, else the physical cores of this process's CPUs."""
    apply_cpus()
    text = env.num_threads()
    if text is None:
        return physical_cores()
    if not text.isdigit() or int(text) < 1:
        raise OptionsError(f"{THREADS_ENV}={text!r} is not a positive integer", where=THREADS_ENV, fix="e.g. 2")
    return int(text)


def set_process_cpus(cpus) -> None:
    """Narrow every thread of this process to cpus (a replica told its CPUs after it started, e.g. a Ray
    actor, whose request threads already exist), and make that the mask the runtime restores."""
    cpus = set(cpus)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that exited meanwhile
            pass
    apply_cpus.cache_clear()
    physical_cores.cache_clear()
