"""The VM builtins a Relax artifact may call that TVM implements in Python inside `tvm.relax` (the
compiler package): `relax.run.nonzero` (ONNX NonZero), `relax.run.unique` (Unique),
`relax.run.shape_to_tensor` (a shape read back as data) and `relax.run.assert_op` (the run-time checks the
frontends add: an If branch dropped for the pinned shapes, shapes fed as data). The runtime never imports the
compiler, so without these an artifact holding such an op fails to load ("Cannot find ffi::Function
relax.run.nonzero") while it ran in the process that compiled it. Same semantics as TVM's own
(tvm/relax/op/set.py, base.py), on numpy; registered only where TVM's are absent.

The contrib kernels TopK, sort and argsort call (`tvm.contrib.sort.*`) are C++ in
libtvm_runtime_extra, which `import tvm` loads only when the compiler is loaded too: loaded here
(it depends on libtvm_runtime alone)."""

from __future__ import annotations

import numpy as np

NAMES = ("relax.run.nonzero", "relax.run.unique", "relax.run.shape_to_tensor", "relax.run.assert_op")


def _numpy(x) -> np.ndarray:
    """A tensor's values: a view over DLPack where numpy takes it (0.4 us), else a copy (Tensor.numpy(): 7 us for
    a scalar, a tenth of a small model's run where a run-time check calls assert_op; benchmarks/history.md)."""
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return x.numpy()


def _nonzero(tvm, x):
    return tvm.runtime.tensor(np.stack(np.atleast_1d(_numpy(x)).nonzero(), axis=0))


def _unique(tvm, x, sorted_, return_index, return_inverse, return_counts, axis=None):
    a = _numpy(x)
    axis = None if axis is None else int(axis)
    res = np.unique(
        a,
        return_index=bool(return_index),
        return_inverse=bool(return_inverse),
        return_counts=bool(return_counts),
        axis=axis,
    )
    res = list(res) if isinstance(res, tuple) else [res]
    if not sorted_:
        # first-occurrence order, as ONNX Unique(sorted=0) and TVM's builtin give it
        _, first = np.unique(a, return_index=True, axis=axis)
        order = np.argsort(first)
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        res[0] = np.take(res[0], order, axis=0 if axis is None else axis)
        k = 1
        if return_index:
            res[k] = res[k][order]
            k += 1
        if return_inverse:
            res[k] = rank[res[k].reshape(-1)]
            k += 1
        if return_counts:
            res[k] = res[k][order]
    out = [tvm.runtime.tensor(np.asarray(r)) for r in res]
    return out[0] if len(out) == 1 else tuple(out)


def _shape_to_tensor(tvm, shape):
    return tvm.runtime.tensor(np.asarray([int(v) for v in shape], dtype="int64"))


def _render(tvm, v) -> str:
    if isinstance(v, tvm.runtime.Tensor):
        return str(v)
    if isinstance(v, (list, tuple)) or type(v).__name__ == "Array":
        return "(" + ", ".join(_render(tvm, e) for e in v) + ")"
    return str(v)


def _assert_op(tvm, condition, format_str, *format_args):
    """TVM's relax_assert_op: raise AssertionError with the formatted message when the bool scalar is false
    (Kiln's model.py reports a message holding INPUT_CHECK as an input error)."""
    if not isinstance(format_str, str):
        raise ValueError(f"The format string argument to assert must be a string, given {type(format_str)})")
    if isinstance(condition, tvm.runtime.Tensor):
        a = _numpy(condition)
        if a.dtype != np.bool_ or a.ndim:
            raise ValueError(f"The condition must be a bool scalar, given a {a.dtype} {a.shape} tensor")
        condition = bool(a)
    if not condition:
        rendered = [_render(tvm, a) for a in format_args]
        message = format_str.format(*rendered) if format_str else ", ".join(rendered)
        raise AssertionError(message or "Assertion Failed")


def _load_runtime_extra(tvm) -> None:
    if tvm.get_global_func("tvm.contrib.sort.topk", allow_missing=True) is not None:
        return
    from pathlib import Path

    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_extra"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_extra", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL"
        )
    except (OSError, RuntimeError):  # a runtime-only install without it: TopK models then fail by name
        pass


def register(tvm) -> None:
    """Register the builtins TVM's compiler package would have registered, if it has not."""
    _load_runtime_extra(tvm)
    impls = {
        "relax.run.nonzero": _nonzero,
        "relax.run.unique": _unique,
        "relax.run.shape_to_tensor": _shape_to_tensor,
        "relax.run.assert_op": _assert_op,
    }
    for name in NAMES:
        if tvm.get_global_func(name, allow_missing=True) is None:
            fn = impls[name]
            tvm.register_global_func(name, lambda *a, _fn=fn: _fn(tvm, *a))
