"""Load a .kiln artifact and run it. Checks, in order, before any model code is loaded: format
version and every member's checksum, the architecture, the CPU features, the TVM runtime version.
Then the library is loaded with TVM's runtime library only (TVM_USE_RUNTIME_LIB=1)."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import IncompatibleArtifactError, InputError, OptionsError
from . import artifact as art
from . import buckets as bk
from . import pool
from .hostinfo import enable_amx, host_arch, host_cpu_flags, missing_cpu_features, raise_thread_pool_cap
from .outputs import OutputViews
from .replica import apply_cpus, default_threads
from .structure import Structure

pool_lock = threading.Lock()
_pool_threads: int | None = None


def _import_tvm_runtime():
    set_here = "tvm" not in sys.modules and "TVM_USE_RUNTIME_LIB" not in os.environ
    if set_here:  # TVM reads it once, at import: not left for the processes this one starts
        os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    raise_thread_pool_cap()
    try:
        import tvm
    finally:
        if set_here:
            del os.environ["TVM_USE_RUNTIME_LIB"]
    from tvm.runtime.vm import VirtualMachine

    from .builtins import register

    register(tvm)  # NonZero/Unique's VM builtins live in tvm.relax, which the runtime never imports

    return tvm, VirtualMachine


ALIGNMENT = 64  # bytes: TVM's allocation alignment (kAllocAlignment), which its kernels may assume
COPY_BELOW = 16384  # bytes: an input this small is copied to its staged buffer without asking whether it is
# aligned (a.ctypes.data costs more than the copy) to take it over DLPack (timings in benchmarks/history.md)


def configure_threads(tvm, n: int) -> None:
    """Use n threads of TVM's pool (mode 1: all cores alike). More than the pool's cap
    (TVM_NUM_THREADS) is not possible once the pool exists; NumThreads reports what we got."""
    global _pool_threads
    if _pool_threads != n:
        mask = apply_cpus()
        tvm.get_global_func("runtime.config_threadpool")(1, n)
        os.sched_setaffinity(0, mask)  # TVM's pool widened the calling thread to every CPU: Kiln's pool inherits it
        pool.configure(n)  # Kiln's pool (pool.py), which the artifact's parallel loops run on
        _pool_threads = n


def load(
    path: str | os.PathLike,
    num_threads: int | None = None,
    warmup: bool = False,
    bucket_policy: str | None = None,
    trusted_keys=None,
    accelerator: str = "sim",
) -> Model:
    """Load an artifact. warmup=True runs every shape bucket once on zeros before returning, so the
    first real request is not slow. bucket_policy overrides the artifact's (pad | error).
    trusted_keys (Ed25519 public keys: PEM paths or bytes): refuse the artifact unless one of them
    signed it (`kiln sign`); checked before any of its code is loaded. accelerator: for artifacts
    with offloaded layers, "sim" (the simulated accelerator) or "reference" (the same integer
    arithmetic in numpy)."""
    return Model(
        path,
        num_threads=num_threads,
        warmup=warmup,
        bucket_policy=bucket_policy,
        trusted_keys=trusted_keys,
        accelerator=accelerator,
    )


def _check_options(num_threads, bucket_policy) -> None:
    if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
        raise OptionsError(
            f"num_threads must be a positive integer, got {num_threads!r}",
            where="num_threads",
            fix="e.g. num_threads=2",
        )
    if bucket_policy is not None and bucket_policy not in art.BUCKET_POLICIES:
        raise OptionsError(
            f"bucket policy {bucket_policy!r} is not valid",
            where="bucket_policy",
            fix=f"use one of {', '.join(art.BUCKET_POLICIES)}",
        )


def _check_trusted_keys(trusted_keys) -> None:
    if trusted_keys is not None and (isinstance(trusted_keys, (str, bytes, os.PathLike)) or not list(trusted_keys)):
        raise OptionsError(
            "trusted_keys must be a non-empty list of public keys",
            where="trusted_keys",
            fix="e.g. trusted_keys=['kiln.pub']",
        )


def _check_host(manifest: dict, where: str) -> None:
    """The artifact's architecture and CPU features (AMX only where Linux grants the tiles) are this host's."""
    if manifest["arch"] != host_arch():
        raise IncompatibleArtifactError(
            f"artifact is built for {manifest['arch']}, this host is {host_arch()}",
            where=where,
            fix=f"recompile for this host (kiln compile without --target), or run it on {_a(manifest['arch'])} machine",
        )
    if "amx-tile" in manifest["cpu_features"] and "amx_tile" in host_cpu_flags() and (why := enable_amx()):
        raise IncompatibleArtifactError(
            f"artifact uses AMX tiles and {why}",
            where=where,
            fix="run it on a newer kernel, or recompile with --target 'llvm -mcpu=... -mattr=-amx-tile'",
        )
    missing = missing_cpu_features(manifest["cpu_features"])
    if missing:
        raise IncompatibleArtifactError(
            f"artifact needs CPU features this host lacks: {', '.join(missing)} "
            f"(built for target {manifest['target']!r})",
            where=where,
            fix="recompile on this host, or with a --target whose -mcpu this host supports",
        )


class _Entry(NamedTuple):
    """A bucket's compiled function: its VM (kept alive beside the entry), the entry, the weights passed after the
    inputs, and the inputs only Kiln's C kernels read (the manifest's unaligned_inputs: taken at any address)."""

    vm: object
    fn: object
    weights: list
    unaligned: frozenset


class Model:
    """A loaded artifact. `run({name: array}) -> {output name: array}`. Calls are serialized by a
    lock (TVM's VM is not thread-safe). With shape buckets, `run` picks the bucket (see
    kiln.runtime.buckets); `inputs`/`outputs` are the first (smallest) bucket's."""

    def __init__(
        self,
        path: str | os.PathLike,
        num_threads: int | None = None,
        warmup: bool = False,
        bucket_policy: str | None = None,
        trusted_keys=None,
        accelerator: str = "sim",
    ):
        self.path = Path(path)
        where = str(path)
        _check_options(num_threads, bucket_policy)
        apply_cpus()  # the replica's CPU list (kiln/env.py), before any pool thread exists
        self.num_threads = num_threads or default_threads()
        _check_trusted_keys(trusted_keys)
        manifest, members = art.read_artifact(path, trusted_keys=None if trusted_keys is None else list(trusted_keys))
        self.manifest = manifest
        _check_host(manifest, where)
        tvm, VirtualMachine = _import_tvm_runtime()
        if _minor(tvm.__version__) != _minor(manifest["tvm_version"]):
            raise IncompatibleArtifactError(
                f"artifact was built with TVM {manifest['tvm_version']}, this runtime has TVM {tvm.__version__}",
                where=where,
                fix="recompile it with this Kiln installation",
            )
        self.bucket_policy = bucket_policy or manifest.get("bucket_policy", "pad")
        self._tvm = tvm
        self._take_unaligned = sys.modules["tvm_ffi"].from_dlpack  # loaded with tvm: DLPack with no alignment asked
        self._dev = _device(tvm, manifest, where)
        weights = [
            tvm.runtime.tensor(w, self._dev)
            for w in art.unpack_weights(members[art.WEIGHTS], manifest["weights"], where)
        ]
        self.accelerator = _register_accelerator(manifest, members, accelerator, where)  # before any VM exists
        self.buckets, self._fns = [], []
        self._load_buckets(manifest, members, weights, VirtualMachine)
        self.inputs, self.outputs = list(self.buckets[0].inputs), list(self.buckets[0].outputs)
        self._dtypes = [np.dtype(s.dtype) for s in self.inputs]
        ranges = manifest.get("index_ranges") or {}  # inputs that index a table (frontends/index_ranges.py)
        self._ranges = [(k, *ranges[s.name]) for k, s in enumerate(self.inputs) if s.name in ranges]
        co = manifest.get("compile_options", {})
        io = manifest.get("io_structure")
        self.structure = Structure(io, where) if io else None  # sequence/optional inputs and outputs
        self._pinned = frozenset(set(co.get("input_shapes", {})).union(*(b for b in co.get("shape_buckets", []))))
        self._exact: dict = {}  # the input shapes of each bucket -> its index (the first, as buckets.choose)
        for i, b in enumerate(self.buckets):
            self._exact.setdefault(tuple(tuple(s.shape) for s in b.inputs), i)
        self._on_cpu = self._dev.dlpack_device_type() == 1
        self._lock = threading.Lock()
        self._staging: dict = {}  # input index -> (aligned TVM tensor, numpy view of it): _argument
        self._views = OutputViews(self._on_cpu)  # which outputs leave as views of the VM's tensors, which as copies
        self.warmup_ms: list[float] = []
        if warmup:
            self.warm_up()

    def _load_buckets(self, manifest: dict, members: dict, weights: list, VirtualMachine) -> None:
        """Each bucket's library loaded (on Kiln's thread pool for CPU code), its VM entry and its weights."""
        tvm, where = self._tvm, str(self.path)
        pad_values = tuple(sorted((manifest.get("pad_values") or {}).items()))
        entry = manifest.get("entry", "main")
        with tempfile.TemporaryDirectory(prefix="kiln-load-") as tmp:
            for b in _bucket_entries(manifest, where):
                lib_path = Path(tmp) / b["library"]
                lib_path.write_bytes(members[b["library"]])
                lib = tvm.runtime.load_module(str(lib_path))  # dlopen'd: the file may go away after
                if self._dev.dlpack_device_type() == 1:  # CPU code: its parallel loops on Kiln's pool
                    pool.install(lib_path)
                self.buckets.append(
                    bk.Bucket(
                        b["name"],
                        tuple(map(art.TensorSpec.from_json, b["inputs"])),
                        tuple(map(art.TensorSpec.from_json, b["outputs"])),
                        pad_values,
                    )
                )
                vm = VirtualMachine(lib, self._dev)
                try:
                    fn = vm[entry]
                except Exception:  # a manifest edited to name a function the library lacks
                    raise art.ArtifactError(
                        f"the library has no entry function {entry!r}",
                        where=where,
                        fix="the manifest does not match the library; recompile the model",
                    ) from None
                unaligned = frozenset(b.get("unaligned_inputs", ()))
                self._fns.append(_Entry(vm, fn, [weights[i] for i in b["weights"]], unaligned))

    def warm_up(self) -> list[float]:
        """Run every bucket once on zeros; returns (and keeps) each run's milliseconds. Zeros a run-time check
        rejects (silero_vad's sample rate selects the If branch compiled) end that bucket's warm-up at the check,
        not the load: the kernels before it have run."""
        import time

        self.warmup_ms = []
        for i, b in enumerate(self.buckets):
            t = time.perf_counter()
            try:
                self._run_bucket(i, [np.zeros(s.shape, s.dtype) for s in b.inputs])
            except InputError:
                pass
            self.warmup_ms.append(round((time.perf_counter() - t) * 1e3, 3))
        return self.warmup_ms

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}:{'x'.join(map(str, s.shape))}:{s.dtype}" for s in self.inputs)
        return f"<kiln.Model {self.path.name} target={self.manifest['target']!r} inputs=[{ins}]>"

    def validate(self, feed: dict) -> list[np.ndarray]:
        if not isinstance(feed, dict):
            raise InputError(
                f"inputs must be a dict of name -> array, got {type(feed).__name__}",
                where=str(self.path),
                fix=f"e.g. run({{{self.inputs[0].name!r}: x}})" if self.inputs else "pass a dict",
            )
        names = [s.name for s in self.inputs]
        missing = [n for n in names if n not in feed]
        extra = [n for n in feed if n not in names]
        if missing or extra:
            what = "; ".join(
                p for p in (f"missing {missing}" if missing else "", f"unknown {extra}" if extra else "") if p
            )
            raise InputError(f"wrong input names: {what}", where=str(self.path), fix=f"the model's inputs are {names}")
        arrays = []
        for spec, dtype in zip(self.inputs, self._dtypes):
            x = feed[spec.name]
            x = x if isinstance(x, np.ndarray) else np.asarray(x)
            if x.dtype != dtype:
                raise InputError(
                    f"input {spec.name!r} has dtype {x.dtype}, the model expects {spec.dtype}",
                    where=str(self.path),
                    fix=f"cast it: x.astype({spec.dtype!r})",
                )
            if x.ndim != len(spec.shape):
                raise InputError(
                    f"input {spec.name!r} has rank {x.ndim} ({_fmt(x.shape)}), "
                    f"the model expects rank {len(spec.shape)} ({_fmt(spec.shape)})",
                    where=str(self.path),
                    fix=f"reshape it to {_fmt(spec.shape)}",
                )
            arrays.append(np.ascontiguousarray(x).reshape(x.shape))  # ascontiguousarray makes a 0-d array 1-d
        for k, lo, hi, node in self._ranges:
            self._check_range(self.inputs[k].name, arrays[k], lo, hi, node)
        return arrays

    def _check_range(self, name: str, a: np.ndarray, lo: int, hi: int, node: str) -> None:
        """An input that indexes a table (a token id into the embedding): every value in [lo, hi], as onnxruntime
        requires; the compiled Gather would clamp it and answer for another row."""
        if a.size == 0:
            return
        low, high = a.min(), a.max()
        if low < lo or high > hi:
            bad = low if low < lo else high
            raise InputError(
                f"input {name!r} holds {bad}, outside [{lo}, {hi}]: it indexes the {hi + 1} rows of Gather {node!r}",
                where=str(self.path),
                fix=f"keep its values within [{lo}, {hi}] (e.g. token ids within the vocabulary)",
            )

    def select(self, arrays: list[np.ndarray]) -> int:
        """The bucket that runs these (validated) inputs: one of exactly their shapes, else buckets.choose's."""
        exact = self._exact.get(tuple(a.shape for a in arrays))
        if exact is not None:
            return exact
        shapes = {s.name: a.shape for s, a in zip(self.inputs, arrays)}
        return bk.choose(self.buckets, shapes, self.bucket_policy, str(self.path), self._pinned)

    def run(self, feed: dict) -> dict[str, np.ndarray]:
        """Sequences (lists of arrays) and optionals (None when absent) in and out where the model has them."""
        if self.structure is None:
            return self.run_tensors(feed)
        return self.structure.unflatten(self.run_tensors(self.structure.flatten(feed)))

    def run_tensors(self, feed: dict) -> dict[str, np.ndarray]:
        """run() on the flat tensors of `inputs` and `outputs` (a sequence's elements as `xs[0]`, `xs[1]`, ...):
        what the servers batch and encode, whatever structure the model's inputs and outputs have."""
        arrays = self.validate(feed)
        i = self.select(arrays)
        arrays, padded = bk.pad(arrays, self.buckets[i])
        results = bk.crop(self._run_bucket(i, arrays), padded)
        return {spec.name: r for spec, r in zip(self.buckets[i].outputs, results)}

    def _argument(self, k: int, a: np.ndarray, unaligned: frozenset):
        """Input k as a TVM tensor. On the CPU: the array itself (DLPack, no copy) where it is aligned as TVM's
        own allocations are (64 bytes: the kernels may assume it) or only Kiln's C kernels read it (`unaligned`:
        the manifest's unaligned_inputs), else a copy into a buffer kept for input k (numpy's arrays are 16-byte
        aligned). A new tensor per input per run was a large share of a small model's run (silero VAD;
        benchmarks/history.md). Called under self._lock: one run at a time."""
        tvm = self._tvm
        if not self._on_cpu or a.dtype.kind not in "fiub":
            return tvm.runtime.tensor(a, self._dev)
        if a.flags.writeable:  # numpy exports no read-only array over DLPack (np.load's mmap, np.frombuffer): copied
            if k in unaligned:
                return self._take_unaligned(a, require_alignment=0, require_contiguous=True)
            if a.nbytes > COPY_BELOW and a.ctypes.data % ALIGNMENT == 0:  # a.ctypes costs more: small ones copy
                return tvm.runtime.from_dlpack(a)
        staged = self._staging.get(k)
        if staged is None or staged[1].shape != a.shape or staged[1].dtype != a.dtype:
            t = tvm.runtime.empty(a.shape, str(a.dtype), self._dev)
            staged = self._staging[k] = (t, np.from_dlpack(t))
        staged[1][...] = a
        return staged[0]

    def _run_bucket(self, i: int, arrays: list[np.ndarray]) -> list[np.ndarray]:
        tvm = self._tvm
        fn = self._fns[i]
        with self._lock, pool_lock:
            configure_threads(tvm, self.num_threads)
            try:
                args = [self._argument(k, a, fn.unaligned) for k, a in enumerate(arrays)]
                out = fn.fn(*args, *fn.weights)
                outs = [out] if hasattr(out, "numpy") else [out[j] for j in range(len(out))]  # not list(): slower
                return self._views.arrays(i, outs, args, [a.nbytes for a in arrays])
            except Exception as e:  # inputs matched the manifest: a Kiln bug, or a library edited after the build
                msg = str(e).strip().splitlines()
                checked = next((ln for ln in msg if INPUT_CHECK in ln), None)
                if checked is not None:  # a check the compiler put in (an If branch it could not compile)
                    raise InputError(
                        checked[checked.index(INPUT_CHECK) + len(INPUT_CHECK) :].strip(),
                        where=str(self.path),
                        fix="feed values the model accepts for the shapes it was compiled for (the message says "
                        "which), or compile it for these inputs (--input-shape)",
                    ) from None
                raise art.ArtifactError(
                    f"the compiled code of bucket {self.buckets[i].name!r} failed at run time: {type(e).__name__}: "
                    f"{msg[-1] if msg else ''}",
                    where=str(self.path),
                    fix="the inputs match the manifest, so this is a Kiln bug (or a library changed after the "
                    "build): recompile, and if it persists report it with the model and this input",
                ) from None


# the prefix of a run-time check's message that the compiler emitted on purpose (frontends/tvm_assert.py):
# the inputs, not Kiln, are outside what was compiled
INPUT_CHECK = "kiln input check:"
DEVICES = ("cpu", "cuda")


def _device(tvm, manifest: dict, where: str):
    kind = manifest.get("device", "cpu")
    if kind not in DEVICES:
        raise art.ArtifactError(
            f"unknown device {kind!r} in the manifest",
            where=where,
            fix=f"devices are {', '.join(DEVICES)}; recompile the model",
        )
    dev = tvm.cpu() if kind == "cpu" else tvm.cuda(0)
    if kind == "cuda" and not dev.exist:
        raise IncompatibleArtifactError(
            f"artifact is built for a CUDA GPU ({manifest.get('target')}); this host has none",
            where=where,
            fix="run it on a host with an NVIDIA GPU and driver, or recompile without --target cuda",
        )
    return dev


def _register_accelerator(manifest: dict, members: dict, backend: str, where: str):
    """For an artifact with offloaded layers: register their packed functions with the runtime of the
    manifest's accelerator kind (kiln.accel.runtime_for); returns the layer runners (their simulator
    stats), or None."""
    acc = manifest.get("accelerator")
    if not acc:
        return None
    from ..accel import runtime_for

    vta_rt = runtime_for(acc.get("kind") if isinstance(acc, dict) else None)
    if vta_rt is not None and backend not in vta_rt.BACKENDS:
        raise OptionsError(
            f"accelerator backend {backend!r} is not valid",
            where="accelerator",
            fix=f"use one of {', '.join(vta_rt.BACKENDS)}",
        )
    if vta_rt is None or any(m not in members for m in vta_rt.MEMBERS):
        raise art.ArtifactError(
            f"the manifest names accelerator {acc!r} but its programs are missing or unknown",
            where=where,
            fix="recompile the model",
        )
    try:
        _, runners = vta_rt.register({m: members[m] for m in vta_rt.MEMBERS}, backend)
    except Exception as e:  # malformed programs: a bad stream, config or array
        raise art.ArtifactError(
            f"the accelerator programs are malformed: {type(e).__name__}: {e}", where=where, fix="recompile the model"
        ) from None
    return runners


def _bucket_entries(manifest: dict, where: str) -> list[dict]:
    """The manifest's buckets; an artifact without them has one (its top-level inputs, library, weights)."""
    entries = manifest.get("buckets") or [
        {
            "name": "default",
            "inputs": manifest["inputs"],
            "outputs": manifest["outputs"],
            "library": art.LIBRARY,
            "weights": list(range(len(manifest["weights"]))),
        }
    ]
    for b in entries:  # types were checked with the manifest; here: the library is one of the members
        if b["library"] not in manifest["members"] or b["library"] in (art.MANIFEST, art.WEIGHTS, art.SIGNATURE):
            raise art.ArtifactError(
                f"manifest.json has a malformed bucket entry (library {b['library']!r})",
                where=where,
                fix="recompile the model",
            )
    return entries


def _minor(version: str) -> str:
    return ".".join(str(version).split(".")[:2])


def _fmt(shape) -> str:
    return "x".join(map(str, shape)) or "scalar"


def _a(word: str) -> str:
    """`word` with its indefinite article: "an aarch64", "an x86_64", "a riscv64"."""
    return f"{'an' if word[:1].lower() in 'aeiox' else 'a'} {word}"
