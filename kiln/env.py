"""Every KILN_* environment variable Kiln's Python code reads, read here (docs/cli.md lists them all). A
knob read deep inside a module is a knob nobody finds; one module keeps them named, documented and few
(tests/test_env.py fails on a module reading one elsewhere). The C++ runner (kiln/runtime/cpp/kiln_run.cc)
reads KILN_THREAD_POOL itself. This module imports only the standard library: the runtime, which never
imports the compiler, reads its knobs here too."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TARGET = "KILN_TARGET"  # the target used when none is given (unset: the host CPU); CI stands in for another CPU
TUNING_LOGS = "KILN_TUNING_LOGS"  # another folder to look for shipped records in, or "none" (the test suite sets it)
NO_REPRODUCER = "KILN_NO_REPRODUCER"  # set (e.g. by the fuzzer) to skip the reproducer search of a failed compile
STRICT_RULES = "KILN_STRICT_RULES"  # "1" (the test suite): a default schedule rule's failure propagates
CACHE = "KILN_CACHE"  # where Kiln's C kernels are compiled to (default: a per-user folder under the temp dir)
CPUS = "KILN_CPUS"  # a replica's CPU list ("2-3", "0,4"): the runtime narrows its process to it (runtime/replica.py)
NUM_THREADS = "KILN_NUM_THREADS"  # the threads a model uses where the caller gives none (runtime/replica.py)
THREAD_POOL = "KILN_THREAD_POOL"  # "tvm": keep TVM's thread pool (kiln/runtime/pool.py; the C++ runner reads it too)

SHIPPED_TUNING_LOGS = Path(__file__).resolve().parents[1] / "tuning_logs"  # records Kiln ships, per target key


def default_target() -> str | None:
    """KILN_TARGET, or None where it is unset or blank."""
    return os.environ.get(TARGET, "").strip() or None


def shipped_tuning_logs() -> Path | None:
    """The folder of shipped tuning records: tuning_logs/, the folder KILN_TUNING_LOGS names, or None ("none")."""
    env = os.environ.get(TUNING_LOGS)
    if env is None:
        return SHIPPED_TUNING_LOGS
    return None if env.strip().lower() == "none" else Path(env)


def reproducer_disabled() -> bool:
    return bool(os.environ.get(NO_REPRODUCER))


def strict_rules() -> bool:
    return os.environ.get(STRICT_RULES) == "1"


def kernel_cache() -> Path:
    """The folder Kiln's C kernels are built in (not created here)."""
    return Path(os.environ.get(CACHE, Path(tempfile.gettempdir()) / f"kiln-kernels-{os.getuid()}"))


def replica_cpus() -> str | None:
    """KILN_CPUS as given, or None where it is unset or blank."""
    return os.environ.get(CPUS, "").strip() or None


def num_threads() -> str | None:
    """KILN_NUM_THREADS as given (checked by its reader), or None where it is unset."""
    return os.environ.get(NUM_THREADS)


def tvm_thread_pool() -> bool:
    """KILN_THREAD_POOL=tvm: artifacts keep TVM's thread pool instead of Kiln's (kiln/runtime/pool.py)."""
    return os.environ.get(THREAD_POOL, "kiln") == "tvm"
