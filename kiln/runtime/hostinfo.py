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
    lscpu's "Model name" (arm64 kernels leave it out of cpuinfo), else platform.processor(). On x86 the
    family and model follow in brackets: a VM often shows only "AMD EPYC", which Zen 3 (family 25 model 1)
    and Zen 4 (family 25 model 17) hosts share."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), val.strip())
    except OSError:
        pass
    name = fields.get("model name") or _lscpu_model_name() or platform.processor() or "unknown CPU"
    if fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def _lscpu_model_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return ""


ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158  # linux/arch/x86 uapi


@functools.cache
def enable_amx() -> str | None:
    """Ask Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, once per process): until then
    the first tile instruction dies with SIGILL. Returns None when granted, else why not."""
    import ctypes
    import ctypes.util

    if host_arch() != "x86_64" or platform.system() != "Linux":
        return f"AMX tiles need Linux on x86-64, this is {platform.system()} on {host_arch()}"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
            return None
        return f"the kernel refused the AMX tile state ({os.strerror(ctypes.get_errno())}; Linux 5.16+ grants it)"
    except OSError as e:
        return f"could not ask the kernel for the AMX tile state: {e}"


AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})


def usable_cpu_flags() -> frozenset[str]:
    """host_cpu_flags less AMX where Linux will not grant the tile state; asks for it on the way
    (enable_amx), so that code that passed a check against these flags may use the tiles."""
    flags = host_cpu_flags()
    if "amx_tile" in flags and enable_amx() is not None:
        return flags - AMX_FLAGS
    return flags


def missing_cpu_features(required: list[str]) -> list[str]:
    """Features (LLVM names) the artifact needs that this host lacks (or, for AMX, may not use).
    Unknown host: assume none."""
    flags = usable_cpu_flags()
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
