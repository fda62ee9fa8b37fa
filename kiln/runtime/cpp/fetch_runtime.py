"""Fetch the TVM runtime of another architecture for cross-building kiln_run: download the
apache-tvm and apache-tvm-ffi wheels of the installed versions for that platform (pip, from the
package registry) and unpack just their runtime libraries and headers.
    python -m kiln.runtime.cpp.fetch_runtime aarch64 build/edge/aarch64
Used by `make edge-test`; never at run time."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from importlib.metadata import version
from pathlib import Path

PLATFORMS = {"aarch64": "manylinux_2_28_aarch64"}
KEEP = {
    "apache_tvm-": ("tvm/lib/libtvm_runtime.so", "tvm/include/"),
    "apache_tvm_ffi-": ("tvm_ffi/lib/libtvm_ffi.so", "tvm_ffi/include/"),
}


def fetch(arch: str, dest: Path) -> Path:
    if (dest / ".ready").exists():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                PLATFORMS[arch],
                "--python-version",
                f"{sys.version_info.major}.{sys.version_info.minor}",
                "-d",
                tmp,
                f"apache-tvm=={version('apache-tvm')}",
                f"apache-tvm-ffi=={version('apache-tvm-ffi')}",
            ],
            check=True,
        )
        for wheel in Path(tmp).glob("*.whl"):
            prefixes = next(
                v
                for k, v in KEEP.items()
                if wheel.name.startswith(k) and not (k == "apache_tvm-" and wheel.name.startswith("apache_tvm_ffi"))
            )
            with zipfile.ZipFile(wheel) as z:
                for n in z.namelist():
                    if n.startswith(prefixes):
                        z.extract(n, dest)
    (dest / ".ready").write_text(f"apache-tvm {version('apache-tvm')}, apache-tvm-ffi {version('apache-tvm-ffi')}\n")
    return dest


if __name__ == "__main__":
    print(fetch(sys.argv[1], Path(sys.argv[2])))
