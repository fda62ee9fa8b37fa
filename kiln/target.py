"""Targets, parsed once at the boundary into a typed, frozen object.

Accepted forms (the error for a bad string lists them):
  host                               the CPU this process runs on, detected (the default)
  llvm                               same as host
  llvm -mcpu=NAME [-mtriple=T] [-mattr=+a,+b] [-num-cores=N]
  arm64 | aarch64                    preset: llvm -mtriple=aarch64-linux-gnu -mattr=+neon
  rpi4 | rpi5 | rk3588 | jetson-orin | graviton3   the same with the board's CPU (-mcpu)
  vta-sim [-board=NAME] [-config=NAME] the simulated VTA accelerator (int8 convolutions) with the
                                     host CPU for everything else (LLVM options apply to the host)
  cuda [-arch=sm_XX] [-gpu=NAME]     NVIDIA GPUs: an sm architecture, or a GPU by TVM's tag
                                     (a100, h100, nvidia/jetson-orin-nano, ...); host code generic x86-64/aarch64

Checked here, not deep in the build (LLVM alone would print a line per codegen call and fall back to a
generic CPU, or drop a feature): an -mcpu LLVM does not know for the triple, an -mattr entry without a
leading + or -, naming a feature LLVM does not know or both enabling and disabling one, a triple LLVM has
no backend for, and a cuda -arch outside CUDA_ARCHS. Each is a TargetError that lists the valid values.
What the target's hardware can do is `Target.caps` (kiln.capabilities).
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex

from .accel import KINDS as ACCELERATORS  # the accelerator kinds (re-exported)
from .env import default_target
from .errors import TargetError

ACCEPTED_FORMS = (
    "host",
    "llvm",
    "llvm -mcpu=NAME [-mtriple=TRIPLE] [-mattr=+f1,+f2] [-num-cores=N]",
    "arm64",
    "aarch64",
    "rpi4",
    "rpi5",
    "rk3588",
    "jetson-orin",
    "graviton3",
    "vta-sim [-board=pynq|ultra96|zcu104|de10nano|sim] [-config=1x16_i8w8a32_15_15_18_17]",
    "cuda [-arch=sm_80|sm_86|sm_89|sm_90] [-gpu=a100|h100|...]",
)
GPU_OPTIONS = ("arch", "gpu")
DEFAULT_CUDA_ARCH = "sm_80"
# -arch values accepted for cuda: the sm targets of CUDA 12/13's nvcc (TVM 0.27 has no list of its own;
# its GPU tags, -gpu=, carry their arch and are not checked against this). "a": arch-specific features.
CUDA_ARCHS = (
    "sm_50",
    "sm_52",
    "sm_53",
    "sm_60",
    "sm_61",
    "sm_62",
    "sm_70",
    "sm_72",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_87",
    "sm_89",
    "sm_90",
    "sm_90a",
    "sm_100",
    "sm_100a",
    "sm_101",
    "sm_101a",
    "sm_103",
    "sm_103a",
    "sm_110",
    "sm_110a",
    "sm_120",
    "sm_120a",
    "sm_121",
    "sm_121a",
)
ACCEL_OPTIONS = ("board", "config")
_A64 = {"mtriple": "aarch64-linux-gnu", "mattr": ("+neon",)}
PRESETS = {
    "arm64": _A64,
    "aarch64": _A64,
    # boards and server CPUs (LLVM -mcpu names)
    "rpi4": {**_A64, "mcpu": "cortex-a72"},
    "rpi5": {**_A64, "mcpu": "cortex-a76"},
    "rk3588": {**_A64, "mcpu": "cortex-a76"},
    "jetson-orin": {**_A64, "mcpu": "cortex-a78"},
    "graviton3": {**_A64, "mcpu": "neoverse-v1"},
}
LLVM_OPTIONS = ("mcpu", "mtriple", "mattr", "num-cores")

from .capabilities import ISA_FEATURES  # noqa: E402,F401 - re-exported: the features an artifact may depend on


@dataclasses.dataclass(frozen=True)
class Target:
    kind: str = "llvm"
    mcpu: str | None = None
    mtriple: str | None = None
    mattr: tuple[str, ...] = ()
    num_cores: int | None = None
    accel: str | None = None  # "vta-sim": offload to the simulated accelerator
    board: str | None = None
    accel_config: str | None = None
    gpu_arch: str | None = None  # cuda: sm_XX
    gpu: str | None = None  # cuda: a TVM target tag, e.g. nvidia/nvidia-a100

    @staticmethod
    def parse(spec: str | Target | None = None) -> Target:
        if isinstance(spec, Target):
            return spec
        if spec is None:
            spec = default_target()  # KILN_TARGET: this environment's default (e.g. CI standing in for another CPU)
        if spec is None or spec.strip() in ("", "host", "llvm"):
            return Target.host()
        try:
            words = shlex.split(spec)
        except ValueError as e:
            raise _bad(spec, str(e)) from None
        head, rest = words[0], words[1:]
        allowed = LLVM_OPTIONS
        if head in PRESETS:
            fields = dict(PRESETS[head])
        elif head == "llvm":
            fields = {}
        elif head in ACCELERATORS:
            fields, allowed = {"accel": head}, LLVM_OPTIONS + ACCEL_OPTIONS
        elif head == "cuda":
            return _cuda(spec, rest)
        else:
            raise _bad(spec, f"unknown target kind {head!r}")
        for w in rest:
            key, eq, val = w.lstrip("-").partition("=")
            if not w.startswith("-") or not eq or key not in allowed or not val:
                raise _bad(spec, f"bad option {w!r} (options: {', '.join('-' + o + '=' for o in allowed)})")
            if key in ACCEL_OPTIONS:
                fields["board" if key == "board" else "accel_config"] = val
            elif key == "mattr":
                fields["mattr"] = tuple(a for a in val.split(",") if a)
            elif key == "num-cores":
                if not val.isdigit() or int(val) < 1:
                    raise _bad(spec, f"-num-cores must be a positive integer, got {val!r}")
                fields["num_cores"] = int(val)
            else:
                fields[key] = val
        if "mcpu" not in fields and "mtriple" not in fields:
            host = Target.host()
            fields.setdefault("mcpu", host.mcpu)
            if fields.get("accel"):
                fields.setdefault("num_cores", host.num_cores)
        if fields.get("accel"):
            from .accel.vta.config import DEFAULT, VTAConfig

            fields.setdefault("board", "sim")
            fields.setdefault("accel_config", DEFAULT)
            VTAConfig.parse(
                fields["accel_config"], fields["board"]
            )  # a bad board or config fails here, listing the valid ones
        _check_llvm(spec, fields)
        return Target(**fields)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def vta_config(self):
        from .accel.vta.config import VTAConfig

        return VTAConfig.parse(self.accel_config, self.board) if self.accel else None

    @staticmethod
    def host() -> Target:
        from tvm.target import codegen  # compiler-side only

        from .capabilities import host_cpu_name, host_mattr
        from .runtime.hostinfo import host_cpu_flags, physical_cores

        mcpu, _ = host_cpu_name(str(codegen.llvm_get_system_cpu()), host_cpu_flags())
        return Target(mcpu=mcpu, mattr=host_mattr(mcpu, _host_triple()), num_cores=physical_cores())

    @property
    def arch(self) -> str:
        triple = self.mtriple or _host_triple()
        return triple.split("-")[0].replace("arm64", "aarch64")

    def to_dict(self) -> dict:
        """The dict TVM 0.27 builds a Target from (strings raise there)."""
        d: dict = {"kind": self.kind}
        if self.is_gpu:
            return {**d, "arch": self.gpu_arch, **({"tag": self.gpu} if self.gpu else {})}
        if self.mcpu:
            d["mcpu"] = self.mcpu
        if self.mtriple:
            d["mtriple"] = self.mtriple
        if self.mattr:
            d["mattr"] = list(self.mattr)
        if self.num_cores:
            d["num-cores"] = self.num_cores
        return d

    def tvm(self):
        import tvm

        if self.is_gpu:
            try:
                base = (
                    tvm.target.Target(self.gpu)
                    if self.gpu
                    else tvm.target.Target(
                        {
                            "kind": "cuda",
                            "arch": self.gpu_arch,
                            "max_shared_memory_per_block": 49152,
                            "max_threads_per_block": 1024,
                            "thread_warp_size": 32,
                        }
                    )
                )
                return tvm.target.Target(
                    base, host={"kind": "llvm"}
                )  # generic host code: runs on any x86-64 GPU server
            except Exception as e:
                raise _bad(str(self), str(e).splitlines()[-1]) from None
        try:
            return tvm.target.Target(self.to_dict())
        except Exception as e:  # TVM's own validation of option values
            raise _bad(str(self), str(e).splitlines()[-1]) from None

    @property
    def caps(self):
        """What the hardware can do (kiln.capabilities): Capabilities, or GpuCapabilities for cuda. Cached."""
        from .capabilities import capabilities, gpu_capabilities

        return gpu_capabilities(self) if self.is_gpu else capabilities(self)

    def required_features(self) -> list[str]:
        """ISA features (LLVM names) that code generated for this target may use."""
        if self.is_gpu:
            return []  # generic host code
        return list(self.caps.isa_features)

    def __str__(self) -> str:
        if self.is_gpu:
            return f"cuda -gpu={self.gpu}" if self.gpu else f"cuda -arch={self.gpu_arch}"
        parts = [self.accel, f"-board={self.board}", f"-config={self.accel_config}"] if self.accel else [self.kind]
        for k, v in (("mcpu", self.mcpu), ("mtriple", self.mtriple)):
            if v:
                parts.append(f"-{k}={v}")
        if self.mattr:
            parts.append("-mattr=" + ",".join(self.mattr))
        if self.num_cores:
            parts.append(f"-num-cores={self.num_cores}")
        return " ".join(parts)


def _cuda(spec: str, rest: list[str]) -> Target:
    fields = {}
    for w in rest:
        key, eq, val = w.lstrip("-").partition("=")
        if not w.startswith("-") or not eq or key not in GPU_OPTIONS or not val:
            raise _bad(spec, f"bad option {w!r} (options: {', '.join('-' + o + '=' for o in GPU_OPTIONS)})")
        fields[key] = val
    if "gpu" in fields:
        import tvm

        tags = tvm.target.list_tags()
        name = fields["gpu"]
        found = next(
            (t for t in (name, f"nvidia/{name}", f"nvidia/nvidia-{name}", f"nvidia/geforce-{name}") if t in tags), None
        )
        if found is None:
            raise _bad(
                spec, f"unknown GPU {name!r} (TVM's tags, e.g. a100, h100, geforce-rtx-4090, nvidia/jetson-orin-nano)"
            )
        return Target(kind="cuda", gpu=found, gpu_arch=str(tvm.target.Target(found).attrs["arch"]))
    arch = fields.get("arch", DEFAULT_CUDA_ARCH)
    if not (arch.startswith("sm_") and arch[3:].rstrip("a").isdigit()):
        raise _bad(spec, f"-arch must look like sm_80, got {arch!r}", fix="use one of: " + ", ".join(CUDA_ARCHS))
    if arch not in CUDA_ARCHS:
        raise _bad(
            spec,
            f"unknown CUDA arch {arch!r}{_did_you_mean(arch, CUDA_ARCHS)}",
            fix="use one of: " + ", ".join(CUDA_ARCHS),
        )
    return Target(kind="cuda", gpu_arch=arch)


def _check_llvm(spec: str, fields: dict) -> None:
    """Refuse an -mcpu or -mattr LLVM does not know for the triple, here rather than deep in the build
    (LLVM itself only prints a line per codegen call and falls back to a generic CPU or drops the feature)."""
    from . import capabilities as caps

    triple = fields.get("mtriple") or _host_triple()
    backends = caps.llvm_backends()
    if not caps.llvm_has_backend(triple):  # LLVM would crash on it
        raise _bad(
            spec,
            f"LLVM {_llvm_version()} has no backend for -mtriple={triple}",
            fix="use a triple such as x86_64-linux-gnu or aarch64-linux-gnu (LLVM's backends: "
            + ", ".join(backends)
            + ")",
        )
    cpu = fields.get("mcpu")
    if cpu and not caps.llvm_is_cpu(cpu, triple):
        cpus = caps.llvm_cpus(triple)
        raise _bad(
            spec,
            f"LLVM {_llvm_version()} does not know -mcpu={cpu} for {triple}{_did_you_mean(cpu, cpus)}",
            fix=f"use one of the {len(cpus)} CPUs LLVM knows for {triple}: " + ", ".join(cpus),
        )
    seen: dict[str, str] = {}
    for a in fields.get("mattr", ()):
        sign, name = a[:1], a[1:]
        if sign not in "+-" or not name:
            hint = f"+{a}" if caps.llvm_is_feature(a, triple) else "+FEATURE"
            raise _bad(
                spec,
                f"-mattr entry {a!r} needs a leading + (enable) or - (disable)",
                fix=f"write -mattr={hint} (entries comma-separated, e.g. -mattr=+avx2,+fma)",
            )
        if not caps.llvm_is_feature(name, triple):
            known = sorted(caps.llvm_features_of_cpus(triple))
            raise _bad(
                spec,
                f"LLVM {_llvm_version()} does not know the feature {name!r} for {triple}{_did_you_mean(name, known)}",
                fix=f"use LLVM's feature names for {triple}: " + ", ".join(known),
            )
        if seen.get(name, sign) != sign:
            raise _bad(spec, f"-mattr both enables and disables {name!r}", fix=f"keep one of +{name} and -{name}")
        seen[name] = sign


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=5, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def _llvm_version() -> int:
    from tvm.target import codegen

    return int(codegen.llvm_version_major())


def _host_triple() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_triple())


def _bad(spec: str, why: str, fix: str | None = None) -> TargetError:
    """The one error of a bad target string; `fix` defaults to the accepted forms."""
    return TargetError(
        f"cannot parse target {spec!r}: {why}", where="--target", fix=fix or "use one of: " + " | ".join(ACCEPTED_FORMS)
    )
