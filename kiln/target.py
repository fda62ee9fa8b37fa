"""Targets, parsed once at the boundary into a typed, frozen object.

Accepted forms (the error for a bad string lists them):
  host                               the CPU this process runs on, detected (the default)
  llvm                               same as host
  llvm -mcpu=NAME [-mtriple=T] [-mattr=+a,+b] [-num-cores=N]
  arm64 | aarch64                    preset: llvm -mtriple=aarch64-linux-gnu -mattr=+neon
  vta-sim [-board=NAME] [-config=NAME] the simulated VTA accelerator (int8 convolutions) with the
                                     host CPU for everything else (LLVM options apply to the host)
"""
from __future__ import annotations

import dataclasses
import shlex

from .errors import TargetError

ACCEPTED_FORMS = ("host", "llvm", "llvm -mcpu=NAME [-mtriple=TRIPLE] [-mattr=+f1,+f2] [-num-cores=N]",
                  "arm64", "aarch64", "vta-sim [-board=pynq|ultra96|zcu104|de10nano|sim] [-config=1x16_i8w8a32_15_15_18_17]")
ACCELERATORS = ("vta-sim",)
ACCEL_OPTIONS = ("board", "config")
PRESETS = {
    "arm64": {"mtriple": "aarch64-linux-gnu", "mattr": ("+neon",)},
    "aarch64": {"mtriple": "aarch64-linux-gnu", "mattr": ("+neon",)},
}
LLVM_OPTIONS = ("mcpu", "mtriple", "mattr", "num-cores")

# ISA features an artifact may depend on, in LLVM spelling; the manifest records the subset
# that the target enables, and the runtime refuses a host that lacks one of them.
ISA_FEATURES = (
    "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512cd", "avx512bw", "avx512dq",
    "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "avx512vbmi", "avxvnni", "amx-tile",
    "amx-int8", "amx-bf16", "neon", "dotprod", "i8mm", "fullfp16",
)


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

    @staticmethod
    def parse(spec: str | Target | None = None) -> Target:
        if isinstance(spec, Target):
            return spec
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
            VTAConfig.parse(fields["accel_config"], fields["board"])  # a bad board or config fails here, listing the valid ones
        return Target(**fields)

    def vta_config(self):
        from .accel.vta.config import VTAConfig
        return VTAConfig.parse(self.accel_config, self.board) if self.accel else None

    @staticmethod
    def host() -> Target:
        from tvm.target import codegen  # compiler-side only

        from .runtime.hostinfo import physical_cores
        return Target(mcpu=codegen.llvm_get_system_cpu(), num_cores=physical_cores())

    @property
    def arch(self) -> str:
        triple = self.mtriple or _host_triple()
        return triple.split("-")[0].replace("arm64", "aarch64")

    def to_dict(self) -> dict:
        """The dict TVM 0.27 builds a Target from (strings raise there)."""
        d: dict = {"kind": self.kind}
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
        try:
            return tvm.target.Target(self.to_dict())
        except Exception as e:  # TVM's own validation of option values
            raise _bad(str(self), str(e).splitlines()[-1]) from None

    def required_features(self) -> list[str]:
        """ISA features (LLVM names) that code generated for this target may use."""
        from tvm.target import codegen
        enabled = set(codegen.llvm_get_cpu_features(self.tvm()))
        return [f for f in ISA_FEATURES if f in enabled]

    def __str__(self) -> str:
        parts = [self.accel, f"-board={self.board}", f"-config={self.accel_config}"] if self.accel else [self.kind]
        for k, v in (("mcpu", self.mcpu), ("mtriple", self.mtriple)):
            if v:
                parts.append(f"-{k}={v}")
        if self.mattr:
            parts.append("-mattr=" + ",".join(self.mattr))
        if self.num_cores:
            parts.append(f"-num-cores={self.num_cores}")
        return " ".join(parts)


def _host_triple() -> str:
    from tvm.target import codegen
    return str(codegen.llvm_get_system_triple())


def _bad(spec: str, why: str) -> TargetError:
    return TargetError(f"cannot parse target {spec!r}: {why}", where="--target",
                       fix="use one of: " + " | ".join(ACCEPTED_FORMS))
