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

A Target is its kind (`Kind`: llvm, cuda, vta-sim) and one frozen record of that kind's fields (`CPUSpec`,
`CUDASpec`, `VTASpec`). Only this module and kiln/compiler/backends/ look at the kind; everything else
reads what means the same for every kind (`arch`, `caps`, `tvm()`, `required_features()`, `str()`).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import shlex

from .accel import KINDS as ACCELERATORS  # noqa: F401 - the accelerator kinds (re-exported)
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


class Kind(enum.StrEnum):
    """A target kind: the string's first word (presets and `host` are llvm), which record describes the
    target and which backend compiles for it (kiln/compiler/backends: each names its `target_kind`)."""

    LLVM = "llvm"  # a CPU, through LLVM
    CUDA = "cuda"  # an NVIDIA GPU (host code generic for this host's arch)
    VTA_SIM = "vta-sim"  # the simulated VTA accelerator beside an LLVM host CPU


@dataclasses.dataclass(frozen=True)
class CPUSpec:
    """An LLVM CPU: the -mcpu/-mtriple/-mattr/-num-cores options (None/empty: LLVM's default, the host triple)."""

    mcpu: str | None = None
    mtriple: str | None = None
    mattr: tuple[str, ...] = ()
    num_cores: int | None = None

    def words(self) -> list[str]:
        """The options as the target string writes them, in its order."""
        out = [f"-{k}={v}" for k, v in (("mcpu", self.mcpu), ("mtriple", self.mtriple)) if v]
        if self.mattr:
            out.append("-mattr=" + ",".join(self.mattr))
        if self.num_cores:
            out.append(f"-num-cores={self.num_cores}")
        return out

    def to_dict(self) -> dict:
        """The dict TVM 0.27 builds an llvm Target from (strings raise there)."""
        d: dict = {"kind": "llvm"}
        if self.mcpu:
            d["mcpu"] = self.mcpu
        if self.mtriple:
            d["mtriple"] = self.mtriple
        if self.mattr:
            d["mattr"] = list(self.mattr)
        if self.num_cores:
            d["num-cores"] = self.num_cores
        return d


@dataclasses.dataclass(frozen=True)
class CUDASpec:
    """An NVIDIA GPU: its sm architecture, and the TVM target tag it was named by (-gpu=), if any."""

    arch: str = DEFAULT_CUDA_ARCH
    gpu: str | None = None  # a TVM target tag, e.g. nvidia/nvidia-a100

    def words(self) -> list[str]:
        return [f"-gpu={self.gpu}"] if self.gpu else [f"-arch={self.arch}"]

    def to_dict(self) -> dict:
        return {"kind": "cuda", "arch": self.arch, **({"tag": self.gpu} if self.gpu else {})}

    def tvm_base(self):
        """TVM's cuda Target, without its host: the tag's, or one for the arch with the limits every sm_50+ has."""
        import tvm

        if self.gpu:
            return tvm.target.Target(self.gpu)
        limits = {"max_shared_memory_per_block": 49152, "max_threads_per_block": 1024, "thread_warp_size": 32}
        return tvm.target.Target({"kind": "cuda", "arch": self.arch, **limits})


@dataclasses.dataclass(frozen=True)
class VTASpec:
    """The simulated VTA accelerator: its board (clock) and configuration (kiln.accel.vta.config), and the
    host CPU that runs everything it does not (LLVM options apply to the host)."""

    board: str
    config: str
    cpu: CPUSpec = CPUSpec()

    def words(self) -> list[str]:
        return [f"-board={self.board}", f"-config={self.config}", *self.cpu.words()]

    def to_dict(self) -> dict:
        return self.cpu.to_dict()  # TVM builds the host's code; the accelerator's programs are Kiln's own

    def vta_config(self):
        from .accel.vta.config import VTAConfig

        return VTAConfig.parse(self.config, self.board)


SPECS = {Kind.LLVM: CPUSpec, Kind.CUDA: CUDASpec, Kind.VTA_SIM: VTASpec}  # each kind's record
_NO_CPU = CPUSpec()


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed target: its kind and that kind's record (SPECS). Made by `parse` or `host`; `str()` gives
    back the string `parse` reads (manifests record it). Code outside this module and the backends reads
    the properties below, which mean the same for every kind, and does not branch on `kind`."""

    kind: Kind = Kind.LLVM
    spec: CPUSpec | CUDASpec | VTASpec = _NO_CPU

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        if type(self.spec) is not SPECS[self.kind]:
            raise TypeError(f"a {self.kind} target's record is a {SPECS[self.kind].__name__}, not {self.spec!r}")

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
        if head in PRESETS or head == "llvm":
            cpu = _cpu(spec, PRESETS.get(head, {}), _options(spec, rest, LLVM_OPTIONS))
            _check_llvm(spec, cpu)
            return Target(Kind.LLVM, cpu)
        if head == Kind.VTA_SIM:
            return Target(Kind.VTA_SIM, _vta(spec, _options(spec, rest, LLVM_OPTIONS + ACCEL_OPTIONS)))
        if head == "cuda":
            return Target(Kind.CUDA, _cuda(spec, _options(spec, rest, GPU_OPTIONS)))
        raise _bad(spec, f"unknown target kind {head!r}")

    @staticmethod
    def host() -> Target:
        from tvm.target import codegen  # compiler-side only

        from .capabilities import host_cpu_name, host_mattr
        from .runtime.hostinfo import host_cpu_flags, physical_cores

        mcpu, _ = host_cpu_name(str(codegen.llvm_get_system_cpu()), host_cpu_flags())
        return Target(Kind.LLVM, CPUSpec(mcpu=mcpu, mattr=host_mattr(mcpu, _host_triple()), num_cores=physical_cores()))

    @property
    def cpu(self) -> CPUSpec | None:
        """The LLVM CPU the target's CPU code is built for: all of an llvm target, a vta-sim target's
        host; None for cuda (its host code is generic)."""
        if self.kind is Kind.VTA_SIM:
            return self.spec.cpu
        return self.spec if self.kind is Kind.LLVM else None

    def with_cpu(self, **changes) -> Target:
        """The same target with fields of its CPU record replaced (mcpu=, mtriple=, mattr=, num_cores=)."""
        if self.kind is Kind.CUDA:
            raise ValueError(f"{self}: a cuda target's host code is generic, it has no CPU options")
        cpu = dataclasses.replace(self.cpu, **changes)
        return Target(self.kind, cpu if self.kind is Kind.LLVM else dataclasses.replace(self.spec, cpu=cpu))

    @property
    def mcpu(self) -> str | None:
        return (self.cpu or _NO_CPU).mcpu

    @property
    def mtriple(self) -> str | None:
        return (self.cpu or _NO_CPU).mtriple

    @property
    def mattr(self) -> tuple[str, ...]:
        return (self.cpu or _NO_CPU).mattr

    @property
    def num_cores(self) -> int | None:
        return (self.cpu or _NO_CPU).num_cores

    @property
    def gpu_arch(self) -> str | None:
        """cuda: the sm architecture (sm_XX); None for other kinds."""
        return self.spec.arch if self.kind is Kind.CUDA else None

    @property
    def gpu(self) -> str | None:
        """cuda: the TVM target tag of a GPU named with -gpu=; None otherwise."""
        return self.spec.gpu if self.kind is Kind.CUDA else None

    def vta_config(self):
        """vta-sim: the accelerator's VTAConfig; None for other kinds."""
        return self.spec.vta_config() if self.kind is Kind.VTA_SIM else None

    @property
    def arch(self) -> str:
        triple = self.mtriple or _host_triple()
        return triple.split("-")[0].replace("arm64", "aarch64")

    def to_dict(self) -> dict:
        """The dict TVM 0.27 builds a Target from (strings raise there)."""
        return self.spec.to_dict()

    def tvm(self):
        import tvm

        try:
            if self.kind is Kind.CUDA:
                # generic host code: runs on any x86-64 GPU server
                return tvm.target.Target(self.spec.tvm_base(), host={"kind": "llvm"})
            return tvm.target.Target(self.to_dict())
        except Exception as e:  # TVM's own validation of option values
            raise _bad(str(self), str(e).splitlines()[-1]) from None

    @property
    def caps(self):
        """What the hardware can do (kiln.capabilities): Capabilities, or GpuCapabilities for cuda. Cached."""
        from .capabilities import capabilities, gpu_capabilities

        return gpu_capabilities(self) if self.kind is Kind.CUDA else capabilities(self)

    def required_features(self) -> list[str]:
        """ISA features (LLVM names) that code generated for this target may use."""
        if self.kind is Kind.CUDA:
            return []  # generic host code
        return list(self.caps.isa_features)

    def __str__(self) -> str:
        return " ".join([self.kind.value, *self.spec.words()])


def _options(spec: str, rest: list[str], allowed: tuple[str, ...]) -> dict[str, str]:
    """The -key=value words after the kind, {key: value} (the last of a repeated key wins); a word that
    is not one of `allowed`, or a -num-cores that is not a positive integer, is a TargetError."""
    out = {}
    for w in rest:
        key, eq, val = w.lstrip("-").partition("=")
        if not w.startswith("-") or not eq or key not in allowed or not val:
            raise _bad(spec, f"bad option {w!r} (options: {', '.join('-' + o + '=' for o in allowed)})")
        if key == "num-cores" and (not val.isdigit() or int(val) < 1):
            raise _bad(spec, f"-num-cores must be a positive integer, got {val!r}")
        out[key] = val
    return out


def _cpu(spec: str, preset: dict, opts: dict[str, str], host_cores: bool = False) -> CPUSpec:
    """The LLVM CPU of a preset (or none) and the string's options; with neither -mcpu nor -mtriple, this
    host's -mcpu (and, host_cores, its physical cores). Not yet checked against LLVM (_check_llvm)."""
    fields = dict(preset)
    for key, val in opts.items():
        if key == "mattr":
            fields["mattr"] = tuple(a for a in val.split(",") if a)
        elif key == "num-cores":
            fields["num_cores"] = int(val)
        elif key in ("mcpu", "mtriple"):
            fields[key] = val
    if "mcpu" not in fields and "mtriple" not in fields:
        host = Target.host()
        fields.setdefault("mcpu", host.mcpu)
        if host_cores:
            fields.setdefault("num_cores", host.num_cores)
    return CPUSpec(**fields)


def _vta(spec: str, opts: dict[str, str]) -> VTASpec:
    """vta-sim: the board (default sim) and configuration (default the accelerator's), checked here (a bad
    one lists the valid ones), and the host CPU (this host's cores unless the string names a CPU)."""
    from .accel.vta.config import DEFAULT, VTAConfig

    cpu = _cpu(spec, {}, opts, host_cores=True)
    board, config = opts.get("board", "sim"), opts.get("config", DEFAULT)
    VTAConfig.parse(config, board)  # a bad board or config fails here, listing the valid ones
    _check_llvm(spec, cpu)
    return VTASpec(board, config, cpu)


def _cuda(spec: str, fields: dict[str, str]) -> CUDASpec:
    """cuda: a GPU named by TVM's tag (-gpu=, its arch from the tag), else -arch= (checked against CUDA_ARCHS)."""
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
        return CUDASpec(arch=str(tvm.target.Target(found).attrs["arch"]), gpu=found)
    arch = fields.get("arch", DEFAULT_CUDA_ARCH)
    if not (arch.startswith("sm_") and arch[3:].rstrip("a").isdigit()):
        raise _bad(spec, f"-arch must look like sm_80, got {arch!r}", fix="use one of: " + ", ".join(CUDA_ARCHS))
    if arch not in CUDA_ARCHS:
        raise _bad(
            spec,
            f"unknown CUDA arch {arch!r}{_did_you_mean(arch, CUDA_ARCHS)}",
            fix="use one of: " + ", ".join(CUDA_ARCHS),
        )
    return CUDASpec(arch=arch)


def _check_llvm(spec: str, cpu: CPUSpec) -> None:
    """Refuse an -mcpu or -mattr LLVM does not know for the triple, here rather than deep in the build
    (LLVM itself only prints a line per codegen call and falls back to a generic CPU or drops the feature)."""
    from . import capabilities as caps

    triple = cpu.mtriple or _host_triple()
    backends = caps.llvm_backends()
    if not caps.llvm_has_backend(triple):  # LLVM would crash on it
        raise _bad(
            spec,
            f"LLVM {_llvm_version()} has no backend for -mtriple={triple}",
            fix="use a triple such as x86_64-linux-gnu or aarch64-linux-gnu (LLVM's backends: "
            + ", ".join(backends)
            + ")",
        )
    if cpu.mcpu and not caps.llvm_is_cpu(cpu.mcpu, triple):
        cpus = caps.llvm_cpus(triple)
        raise _bad(
            spec,
            f"LLVM {_llvm_version()} does not know -mcpu={cpu.mcpu} for {triple}{_did_you_mean(cpu.mcpu, cpus)}",
            fix=f"use one of the {len(cpus)} CPUs LLVM knows for {triple}: " + ", ".join(cpus),
        )
    seen: dict[str, str] = {}
    for a in cpu.mattr:
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
