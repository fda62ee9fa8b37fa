#!/usr/bin/env bash
# Build kiln_run against the TVM runtime of an apache-tvm wheel.
#   build.sh OUT [CXX] [TVM_PKG_DIR] [TVM_FFI_PKG_DIR]
# defaults: g++ and the wheels installed in the Python that runs Kiln. For aarch64:
#   build.sh out/kiln_run aarch64-linux-gnu-g++ <unpacked aarch64 tvm/> <unpacked aarch64 tvm_ffi/>
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$1"; cxx="${2:-g++}"
py="${PYTHON:-python3}"
tvm="${3:-$("$py" -c 'import os, tvm; print(os.path.dirname(tvm.__file__))')}"
ffi="${4:-$("$py" -c 'import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))')}"
mkdir -p "$(dirname "$out")"
"$cxx" -std=c++17 -O2 "$here/kiln_run.cc" -I"$tvm/include" -I"$ffi/include" \
  -L"$tvm/lib" -L"$ffi/lib" -ltvm_runtime -ltvm_ffi -Wl,-rpath,"$tvm/lib:$ffi/lib" -o "$out.tmp"
mv "$out.tmp" "$out"
echo "built $out"
