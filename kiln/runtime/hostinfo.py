"""What this host is: architecture, CPU feature flags, physical cores. Standard library only, so
the runtime can check an artifact against the host before loading any native code."""

from __future__ import annotations

import functools
import os
import platform
import subprocess

# Artifacts name CPU features in LLVM's spelling; /proc/cpuinfo spells some differently.
LLVM_TO_CPUINFO = {
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512bitalg": "avx512_bitalg",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "avxvnni": "avx_vnni",
    "neon": "asimd",
    "dotprod": "asimddp",
    "i8mm": "i8mm",
    "fullfp16": "fphp",
}

ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def raise_thread_pool_cap() -> None:
    """TVM sizes its thread pool once, from TVM_NUM_THREADS, else from a guess that halves the
    CPU count for hyper-threads (1 thread on a 2-vCPU machine with no SMT), and no API raises it
    later; `runtime.config_threadpool` can only pick a count up to that cap. So the cap is set to
    every CPU this process may use before TVM starts its pool (a user's own setting wins)."""
    os.environ.setdefault("TVM_NUM_THREADS", str(available_cpus()))


def host_arch() -> str:
    m = platform.machine().lower()
    return ARCH_ALIASES.get(m, m)


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    """The host's feature flags as /proc/cpuinfo spells them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(val.split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def cpu_model_name() -> str:
    """The CPU's model name, for every measurement to name its CPU: /proc/cpuinfo's "model name", else
    lscpu's "Model name" (arm64 kernels leave it out of cpuinfo), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and val.strip():
                    return val.strip()
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown CPU"


def missing_cpu_features(required: list[str]) -> list[str]:
    """Features (LLVM names) the artifact needs that this host lacks. Unknown host: assume none."""
    flags = host_cpu_flags()
    if not flags:
        return []
    return [f for f in required if LLVM_TO_CPUINFO.get(f, f) not in flags]


@functools.cache
def physical_cores() -> int:
    """Physical cores available to this process (hyper-threads counted once)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        cpus = set(range(os.cpu_count() or 1))
    cores = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology/"
        try:
            with open(base + "physical_package_id") as a, open(base + "core_id") as b:
                cores.add((a.read().strip(), b.read().strip()))
        except OSError:
            cores.add(("?", str(c)))
    return max(1, len(cores))
