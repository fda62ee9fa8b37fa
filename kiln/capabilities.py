"""What a target's hardware can do, as data: computed once from LLVM's feature set for the target.

Schedules, layout passes and the runtime's host check key on these fields instead of testing LLVM
feature strings themselves; this module is the one place that reads those strings. `capabilities(t)`
(also `Target.caps`) is cached per frozen Target. CPU targets get a `Capabilities`; CUDA targets a
`GpuCapabilities` (their host code is generic x86-64/aarch64, so the CPU fields would say nothing).

Precedences (the first the target has wins; each names one kernel family a registry can key on):
  int8_dot   amx-int8 > avx512-vnni > avx-vnni > i8mm > dotprod > None   (a dot-product instruction)
  int8_path  int8_dot if any, else avx512-pmaddubsw > avx2-pmaddubsw > sse-pmaddubsw > neon-smlal > generic
             (the widening multiply-add sequence an int8 kernel falls back to)
  bf16       amx-bf16 > avx512-bf16 > arm-bf16 > None                    (bf16 arithmetic, not just storage)
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import os
from collections.abc import Iterable

# ISA features an artifact may depend on, in LLVM spelling; the manifest records the subset
# that the target enables, and the runtime refuses a host that lacks one of them.
ISA_FEATURES = (
    "sse4.1",
    "sse4.2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512cd",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512vnni",
    "avx512bf16",
    "avx512fp16",
    "avx512vbmi",
    "avxvnni",
    "amx-tile",
    "amx-int8",
    "amx-bf16",
    "neon",
    "dotprod",
    "i8mm",
    "fullfp16",
)

# element widths for lanes(); the short spellings are Kiln's --precision names
DTYPE_BITS = {
    "float64": 64,
    "float32": 32,
    "int32": 32,
    "uint32": 32,
    "float16": 16,
    "fp16": 16,
    "bfloat16": 16,
    "bf16": 16,
    "int16": 16,
    "uint16": 16,
    "int8": 8,
    "uint8": 8,
}


class ISA(enum.StrEnum):
    """The widest vector family. A StrEnum: its values are the strings manifests and reports carry."""

    AVX512 = "avx512"
    AVX2 = "avx2"
    AVX = "avx"
    SSE = "sse"
    NEON = "neon"
    GENERIC = "generic"  # no SIMD


class Int8Path(enum.StrEnum):
    """An int8 kernel family: a dot-product instruction (the first five), or a widening multiply-add."""

    AMX_INT8 = "amx-int8"
    AVX512_VNNI = "avx512-vnni"
    AVX_VNNI = "avx-vnni"
    I8MM = "i8mm"
    DOTPROD = "dotprod"
    AVX512_PMADDUBSW = "avx512-pmaddubsw"
    AVX2_PMADDUBSW = "avx2-pmaddubsw"
    SSE_PMADDUBSW = "sse-pmaddubsw"
    NEON_SMLAL = "neon-smlal"
    GENERIC = "generic"


class BF16(enum.StrEnum):
    """A bf16 arithmetic instruction family."""

    AMX = "amx-bf16"
    AVX512 = "avx512-bf16"
    ARM = "arm-bf16"


_INT8_DOT = (
    ("amx-int8", Int8Path.AMX_INT8),
    ("avx512vnni", Int8Path.AVX512_VNNI),
    ("avxvnni", Int8Path.AVX_VNNI),
    ("i8mm", Int8Path.I8MM),
    ("dotprod", Int8Path.DOTPROD),
)
_INT8_FALLBACK = (
    ("avx512bw", Int8Path.AVX512_PMADDUBSW),
    ("avx2", Int8Path.AVX2_PMADDUBSW),
    ("ssse3", Int8Path.SSE_PMADDUBSW),
    ("neon", Int8Path.NEON_SMLAL),
)
_BF16 = (("amx-bf16", BF16.AMX), ("avx512bf16", BF16.AVX512), ("bf16", BF16.ARM))


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """A CPU target's vector unit and special instructions (see the module docstring for precedences)."""

    target: str  # the target string these were computed for
    arch: str  # "x86_64", "aarch64", or the triple's first word
    cpu: str  # LLVM -mcpu, "generic" when none was given
    isa: ISA  # widest vector family
    vector_bits: int  # width of one vector register (0: generic); NEON even where SVE is wider
    vector_registers: int  # architectural vector registers: 32 zmm, 16 ymm/xmm, 32 NEON q
    f32_block: int  # float32 channel block of NCHWc layouts (convert_layout.vector_block): 16, 8 or 4
    fma: bool  # fused multiply-add on vectors (x86 FMA3 / AVX-512, NEON fmla)
    fma_bits: int  # width of one vector FMA (0 without)
    int8_dot: Int8Path | None  # dot-product instruction for uint8/int8 x int8 -> int32
    int8_path: Int8Path  # the int8 kernel family that applies: int8_dot, or the multiply-add fallback
    bf16: BF16 | None  # bf16 arithmetic instruction
    native_fp16: bool  # fp16 arithmetic in vectors (AVX512-FP16, ARMv8.2 fullfp16), not just conversion
    amx: bool  # Intel AMX tiles
    sve: bool  # Arm SVE (Kiln's kernels use NEON; recorded for schedules that want it)
    isa_features: tuple[str, ...]  # the ISA features (ISA_FEATURES) code for this target may use
    llvm_features: frozenset[str] = dataclasses.field(repr=False)  # everything LLVM enables

    @property
    def has_vnni512(self) -> bool:
        """AVX-512 VNNI (vpdpbusd on zmm): the int8 kernels (schedules/rules/int8.py) need it; AMX CPUs have it too."""
        return "avx512vnni" in self.llvm_features

    @property
    def has_vdpbf16ps(self) -> bool:
        """AVX512-BF16's vdpbf16ps, the instruction Kiln's bf16 conv kernel is written in (AMX CPUs have it too)."""
        return "avx512bf16" in self.llvm_features

    def has(self, feature: str) -> bool:
        """Whether LLVM enables `feature` (LLVM spelling) for this target; prefer the named fields."""
        return feature in self.llvm_features

    def lanes(self, dtype: str) -> int:
        """Elements of `dtype` in one vector register (storage width; see native_fp16/bf16 for arithmetic)."""
        if dtype not in DTYPE_BITS:
            raise ValueError(f"lanes(): unknown dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
        return max(1, self.vector_bits // DTYPE_BITS[dtype])

    def missing_on(self, host: Capabilities | Iterable[str]) -> list[str]:
        """What a host lacks to run code built for this target: its isa_features the host does not have,
        preceded by "arch:<arch>" when the host is another architecture. `host` is the host's Capabilities,
        or its feature names in LLVM spelling or as /proc/cpuinfo flags (either spelling counts)."""
        from .runtime.hostinfo import LLVM_TO_CPUINFO

        if isinstance(host, Capabilities):
            if host.arch != self.arch:
                return [f"arch:{self.arch}", *self.isa_features]
            have = host.llvm_features
        else:
            have = frozenset(host)
        return [f for f in self.isa_features if f not in have and LLVM_TO_CPUINFO.get(f, f) not in have]

    def to_json(self) -> dict:
        """The fields as a JSON-ready dict (llvm_features left out: long, and LLVM-version dependent)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "llvm_features"}
        d["isa_features"] = list(self.isa_features)
        d["lanes"] = {dt: self.lanes(dt) for dt in ("float32", "float16", "bfloat16", "int16", "int8")}
        d["has_vnni512"] = self.has_vnni512
        return d

    def describe(self) -> str:
        """A few human lines (kiln inspect --target)."""
        lanes = ", ".join(f"{dt} {self.lanes(dt)}" for dt in ("float32", "float16", "bfloat16", "int16", "int8"))
        return "\n".join(
            [
                f"target: {self.target}",
                f"  cpu      {self.cpu} ({self.arch}); isa {self.isa}, "
                f"{self.vector_bits}-bit vectors x {self.vector_registers}" + (", SVE" if self.sve else ""),
                f"  lanes    {lanes}; NCHWc block {self.f32_block}",
                f"  fma      {f'{self.fma_bits}-bit' if self.fma else 'no'}",
                f"  int8     {self.int8_dot or 'no dot-product instruction'}; kernels {self.int8_path}",
                f"  bf16     {self.bf16 or 'no'}; native fp16 {'yes' if self.native_fp16 else 'no'}; "
                f"AMX {'yes' if self.amx else 'no'}",
                f"  needs    {', '.join(self.isa_features) or '-'}",
            ]
        )


@dataclasses.dataclass(frozen=True)
class GpuCapabilities:
    """A CUDA target's compute capability and what its sm generation offers (from NVIDIA's tables)."""

    target: str
    arch: str  # "cuda"
    sm: str  # e.g. "sm_80", "sm_90a"
    compute_capability: int  # 80 for sm_80 / sm_90a -> 90
    warp_size: int
    tensor_cores: bool  # mma.sync fp16 (sm_70+)
    int8_dot: str | None  # "imma" (int8 tensor cores, sm_72+), "dp4a" (sm_61+), None
    bf16: str | None  # "mma-bf16" (sm_80+)
    native_fp16: bool  # half arithmetic (sm_53+)
    fp8: bool  # fp8 tensor cores (sm_89+)

    def missing_on(self, host) -> list[str]:
        """GPU artifacts' host code is generic: nothing CPU-specific is needed."""
        return []

    def to_json(self) -> dict:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """A few human lines (kiln inspect --target)."""
        yes = lambda b: "yes" if b else "no"
        cc = self.compute_capability
        return "\n".join(
            [
                f"target: {self.target}",
                f"  gpu      {self.sm} (compute capability {cc // 10}.{cc % 10}), warp {self.warp_size}",
                f"  tensor cores {yes(self.tensor_cores)}; int8 {self.int8_dot or 'no'}; bf16 {self.bf16 or 'no'}; "
                f"native fp16 {yes(self.native_fp16)}; fp8 {yes(self.fp8)}",
            ]
        )


@functools.cache
def capabilities(target: Target) -> Capabilities:  # noqa: F821 - kiln.target.Target (imports this module)
    """The capabilities of a parsed (frozen) CPU Target, computed once per target (Target.caps asks
    gpu_capabilities for a GPU)."""
    from tvm.target import codegen

    feats = frozenset(str(f) for f in codegen.llvm_get_cpu_features(target.tvm()))
    return from_features(feats, arch=target.arch, cpu=target.mcpu or "generic", target=str(target))


def from_features(feats: frozenset[str], *, arch: str, cpu: str = "generic", target: str = "") -> Capabilities:
    """Capabilities from an LLVM feature set (the rules, separate from asking LLVM, to test them alone)."""
    has = feats.__contains__
    x86, arm = arch == "x86_64", arch == "aarch64"
    if x86 and has("avx512f"):
        isa, bits, regs, block = ISA.AVX512, 512, 32, 16
    elif x86 and (has("avx2") or has("avx")):
        isa, bits, regs, block = (ISA.AVX2 if has("avx2") else ISA.AVX), 256, 16, 8
    elif x86 and has("sse2"):
        isa, bits, regs, block = ISA.SSE, 128, 16, 4
    elif arm and has("neon"):
        isa, bits, regs, block = ISA.NEON, 128, 32, 4
    else:
        isa, bits, regs, block = ISA.GENERIC, 0, 0, 4  # block 4 as convert_layout.vector_block
    fma = (x86 and has("fma") and bits >= 256) or (arm and isa is ISA.NEON)
    int8_dot = next((name for f, name in _INT8_DOT if has(f)), None)
    int8_path = int8_dot or next((name for f, name in _INT8_FALLBACK if has(f)), Int8Path.GENERIC)
    bf16 = next((name for f, name in _BF16 if has(f) and (f != "bf16" or arm)), None)
    return Capabilities(
        target=target,
        arch=arch,
        cpu=cpu,
        isa=isa,
        vector_bits=bits,
        vector_registers=regs,
        f32_block=block,
        fma=bool(fma),
        fma_bits=bits if fma else 0,
        int8_dot=int8_dot,
        int8_path=int8_path,
        bf16=bf16,
        native_fp16=has("avx512fp16") or (arm and has("fullfp16")),
        amx=has("amx-tile"),
        sve=arm and has("sve"),
        isa_features=tuple(f for f in ISA_FEATURES if has(f)),
        llvm_features=feats,
    )


@functools.cache
def gpu_capabilities(target: Target) -> GpuCapabilities:  # noqa: F821
    """The capabilities of a parsed (frozen) cuda Target, from its sm architecture."""
    sm = target.gpu_arch or "sm_80"
    cc = int("".join(c for c in sm[3:] if c.isdigit()) or 0)
    return GpuCapabilities(
        target=str(target),
        arch="cuda",
        sm=sm,
        compute_capability=cc,
        warp_size=32,
        tensor_cores=cc >= 70,
        int8_dot="imma" if cc >= 72 else "dp4a" if cc >= 61 else None,
        bf16="mma-bf16" if cc >= 80 else None,
        native_fp16=cc >= 53,
        fp8=cc >= 89,
    )


# -- what LLVM knows for a triple (target.py validates -mcpu and -mattr against these) --------------------


def _triple_target(triple: str):
    import tvm

    return tvm.target.Target({"kind": "llvm", "mtriple": triple})


_ARCH_ALIASES = {"arm64": "aarch64", "amd64": "x86_64", "i486": "i386", "i586": "i386", "i686": "i386"}


AMX_CPU = "sapphirerapids"  # the first CPU with AMX: any host with AMX is this or later


def host_cpu_name(llvm_name: str, flags: frozenset[str]) -> tuple[str, str | None]:
    """(the -mcpu for this host, why it differs from LLVM's guess, else None). LLVM names the host from its
    family and model numbers, which hypervisors report loosely: an Emerald Rapids under KVM reads as model 167,
    `rocketlake`, whose scheduling model and features are a client core's. A CPU with AMX is a Sapphire Rapids
    or later, so such a host is named `sapphirerapids` (host_mattr then adds what else it has)."""
    import tvm
    from tvm.target import codegen

    if "amx_tile" not in flags:
        return llvm_name, None
    features = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": llvm_name}))}
    if "amx-tile" in features:
        return llvm_name, None
    return AMX_CPU, f"LLVM read the model number as {llvm_name!r}, but the CPU has AMX: Sapphire Rapids or later"


@functools.cache
def host_mattr(mcpu: str, triple: str) -> tuple[str, ...]:
    """-mattr entries that make `mcpu` (LLVM's name for this host's CPU, guessed from its family and
    model numbers) agree with what the host's /proc/cpuinfo reports, over ISA_FEATURES. Hypervisors
    report models loosely: an Emerald Rapids under KVM reads as `rocketlake`, whose LLVM features
    lack AMX, AVX512-BF16, AVX512-FP16 and AVX-VNNI that the host has; a host may also mask a feature
    its model has, and code using it would die with SIGILL; AMX counts only where Linux grants the
    tile state. Unknown host flags: none."""
    import tvm
    from tvm.target import codegen

    from .runtime.hostinfo import LLVM_TO_CPUINFO, usable_cpu_flags

    flags = usable_cpu_flags()
    if not flags:
        return ()
    base = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))}
    out = []
    for f in ISA_FEATURES:
        on_host = LLVM_TO_CPUINFO.get(f, f) in flags
        if on_host and f not in base and llvm_is_feature(f, triple):
            out.append(f"+{f}")
        elif not on_host and f in base:
            out.append(f"-{f}")
    return tuple(out)


@functools.cache
def llvm_backends() -> tuple[str, ...]:
    """The architectures (triple first words) this LLVM build has a backend for."""
    from tvm.target import codegen

    return tuple(str(t) for t in codegen.llvm_get_targets())


def llvm_has_backend(triple: str) -> bool:
    """Whether LLVM can generate code for `triple` (an arch word it has a backend for, or a sub-architecture
    of one such as armv7a); a triple it has none for crashes TVM's LLVM codegen."""
    arch = triple.split("-")[0]
    arch = _ARCH_ALIASES.get(arch, arch)
    return bool(arch) and any(arch == b or arch.startswith(b) for b in llvm_backends())


@functools.cache
def llvm_cpus(triple: str) -> tuple[str, ...]:
    """The -mcpu names LLVM knows for `triple`."""
    from tvm.target import codegen

    return tuple(sorted(str(c) for c in codegen.llvm_get_cpu_archlist(_triple_target(triple))))


def llvm_is_cpu(cpu: str, triple: str) -> bool:
    """Whether LLVM knows -mcpu=`cpu` for `triple` (asks without building a target: nothing is printed)."""
    from tvm.target import codegen

    return bool(codegen.llvm_is_valid_cpu(cpu, triple))


@functools.cache
def llvm_features_of_cpus(triple: str) -> frozenset[str]:
    """Every feature some CPU of `triple` enables, plus Kiln's ISA_FEATURES: the common names, for the
    fast path of llvm_is_feature and for "did you mean" suggestions."""
    import tvm
    from tvm.target import codegen

    feats = set(ISA_FEATURES)
    for cpu in llvm_cpus(triple):
        feats.update(
            str(f)
            for f in codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mtriple": triple, "mcpu": cpu}))
        )
    return frozenset(feats)


@functools.cache
def llvm_is_feature(feature: str, triple: str) -> bool:
    """Whether LLVM knows -mattr feature `feature` (no +/-) for `triple`. Features no CPU enables (rtm,
    retpoline, soft-float, ...) are checked by enabling them and seeing LLVM report them enabled; LLVM's
    "not a recognized feature" line is kept off stderr."""
    if feature in llvm_features_of_cpus(triple):
        return True
    import tvm
    from tvm.target import codegen

    with _quiet_stderr():
        t = tvm.target.Target({"kind": "llvm", "mtriple": triple, "mattr": [f"+{feature}"]})
        return feature in {str(f) for f in codegen.llvm_get_cpu_features(t)}


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (LLVM writes there directly, past Python's sys.stderr)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)
