"""Helpers shared by runtime and CLI tests: artifacts edited the way an attacker or a bad copy would."""

import json
import zipfile

from kiln.runtime import artifact as art
from kiln.runtime.hostinfo import LLVM_TO_CPUINFO, host_cpu_flags
from kiln.target import ISA_FEATURES


def lacking_feature() -> str:
    flags = host_cpu_flags()
    return next((f for f in ISA_FEATURES if LLVM_TO_CPUINFO.get(f, f) not in flags), "kiln-test-isa")


def rewrite_manifest(src, dst, **changes) -> None:
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    man = json.loads(members[art.MANIFEST])
    man.update(changes)
    members[art.MANIFEST] = json.dumps(man).encode()
    with zipfile.ZipFile(dst, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)


def rewrite_manifest_features(src, dst) -> str:
    feat = lacking_feature()
    rewrite_manifest(src, dst, cpu_features=art.read_manifest(src)["cpu_features"] + [feat])
    return feat
