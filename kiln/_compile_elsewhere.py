"""kiln.compile in a process that loaded TVM's runtime library only. kiln.load imports TVM without its
compiler (TVM_USE_RUNTIME_LIB: the runtime never loads the compiler), and TVM cannot add the compiler
library to a process afterwards: importing tvm.relax there fails ("Global Function ... is already
registered", or an ImportError from tvm.tirx). So `kiln.load(a); kiln.compile(m, b)` compiles in a fresh
process (a `python -c`, so a script without a `__main__` guard is not run again there), which takes the
same arguments pickled and gives back the same result or error; its warnings and progress are printed by
that process (stderr)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import CompileError, OptionsError

CHILD = "from kiln._compile_elsewhere import child_main; child_main()"


def runtime_only_tvm() -> bool:
    """TVM is imported here without its compiler library."""
    base = sys.modules.get("tvm.base")
    return base is not None and bool(getattr(base, "_RUNTIME_ONLY", False)) and "tvm.relax" not in sys.modules


def child_main() -> None:
    """In the fresh process: arguments from the file named by argv[1], the result or the error written
    (pickled) to argv[2]."""
    from .compiler import compile_model

    args = Path(sys.argv[1])
    model, output, kwargs = pickle.loads(args.read_bytes())
    try:
        out = ("ok", compile_model(model, output, **kwargs))
    except BaseException as e:  # every error goes back to the caller, as it would have been raised there
        out = ("error", e if _light(type(e)) else _as_compile_error(e, output))
    Path(sys.argv[2]).write_bytes(pickle.dumps(out))


def _as_compile_error(e: BaseException, output) -> CompileError:
    fix = "compile in a process that has not called kiln.load first to see the full error, and please report it"
    return CompileError(f"{type(e).__name__}: {e}", where=str(output), fix=fix)


def _light(cls) -> bool:
    """An error class the caller can unpickle without importing TVM: Kiln's own or Python's."""
    return cls.__module__ in ("builtins", "kiln.errors")


def compile_in_child(model, output, example_inputs, dynamic_shapes, kwargs):
    with tempfile.TemporaryDirectory(prefix="kiln-compile-") as tmp:
        if example_inputs is not None or dynamic_shapes is not None or _is_torch_program(model):
            model = _saved_program(model, example_inputs, dynamic_shapes, Path(tmp))
        args, result = Path(tmp) / "args.pickle", Path(tmp) / "result.pickle"
        try:
            args.write_bytes(pickle.dumps((model, output, kwargs)))
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise OptionsError(
                f"kiln.compile after kiln.load runs in a fresh process, and its arguments cannot be sent there ({e})",
                where=str(output),
                fix="call kiln.compile before kiln.load in this process, or pass the model as a file path",
            ) from None
        env = {k: v for k, v in os.environ.items() if k != "TVM_USE_RUNTIME_LIB"}
        proc = subprocess.run([sys.executable, "-c", CHILD, str(args), str(result)], env=env, check=False)
        if not result.exists():
            raise CompileError(
                f"the compile process ended without a result (exit status {proc.returncode})",
                where=str(output),
                fix="compile in a process that has not called kiln.load first, and please report this",
            )
        status, value = pickle.loads(result.read_bytes())
        if status == "error":
            raise value
        return value


def _is_torch_program(model) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.export.ExportedProgram)


def _saved_program(model, example_inputs, dynamic_shapes, tmp: Path) -> str:
    """A torch.nn.Module or ExportedProgram as a .pt2 file the child reads (tensors do not cross)."""
    import torch

    if not isinstance(model, torch.export.ExportedProgram):
        from .frontends.pytorch import export_module

        model = export_module(model, example_inputs, dynamic_shapes)
    path = tmp / "model.pt2"
    torch.export.save(model, path)
    return str(path)
