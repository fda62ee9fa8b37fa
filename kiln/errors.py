"""Kiln's typed errors. Every error a user can cause is a KilnError: it says what went wrong,
where (file, node, input) and what to do about it. The CLI turns them into exit code 2."""

from __future__ import annotations

import contextlib


class KilnError(Exception):
    """Base of every error a user can cause. `where` and `fix` are folded into the message."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what, self.where, self.fix = what, where, fix
        msg = what if where is None else f"{where}: {what}"
        if fix:
            msg += f" -> {fix}"
        super().__init__(msg)

    def __reduce__(self):  # pickled as it is (a compile in another process raises it here); not re-made from args
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(cls, args, state):
    err = Exception.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class KilnWarning(UserWarning):
    """Something Kiln did differently than asked or expected, that the user should know (a pass
    skipped, a constant left unfolded); the CLI prints these as one line each."""


class ModelLoadError(KilnError):
    """The model file cannot be read or is not valid ONNX."""


class MissingExtraError(KilnError):
    """Reading this model needs an optional extra that is not installed (torch for .pt2, tflite for
    .tflite); the fix names the pip command. The runtime never needs one."""


class UnsupportedModelError(KilnError):
    """The model uses ops (or constructs) that Kiln cannot compile; lists every one of them."""

    def __init__(self, what: str, *, ops: list[dict] | None = None, where: str | None = None, fix: str | None = None):
        self.ops = ops or []
        super().__init__(what, where=where, fix=fix)


class ShapeError(KilnError):
    """Input shapes are missing, symbolic, or do not match the model's declaration."""


class TargetError(KilnError):
    """A target string could not be parsed or is not supported."""


class OptionsError(KilnError):
    """A compile, run or CLI option is invalid."""


class ArtifactError(KilnError):
    """A .kiln artifact is unreadable, corrupt, or tampered with."""


class IncompatibleArtifactError(ArtifactError):
    """A valid artifact built for another format version, architecture or CPU."""


class InputError(KilnError):
    """Inputs given at run time do not match the artifact's signature."""


class ResourceError(KilnError):
    """A model needs more memory than allowed (--max-memory, or the host's RAM for one tensor), or a
    process a run needs (kiln tune's build worker) does not start."""


class AccuracyError(KilnError):
    """A quantized model missed --min-agreement against its float original."""


class AcceleratorError(KilnError):
    """The accelerator (simulator) rejected an instruction stream: bad address, deadlock, ..."""


class CompileError(KilnError):
    """TVM failed while compiling a model Kiln accepted; carries TVM's message."""


class PassError(CompileError):
    """One row of the pipeline (or TVM's build after it) raised: `stage` names it, `cause` is the
    original exception. Compile retries without the optional passes before anyone sees it."""

    def __init__(self, stage: str, cause: BaseException, *, where: str | None = None, fix: str | None = None):
        self.stage, self.cause = stage, cause
        msg = str(cause).strip().splitlines()
        self.detail = f"{type(cause).__name__}: {msg[-1] if msg else ''}"
        super().__init__(f"{stage} failed: {self.detail}", where=where, fix=fix)


class InternalError(KilnError):
    """A Kiln (or TVM) bug on a model ONNX's checker and shape inference accept: names the stage and
    the node, and points at a reproducer. The CLI exits 1 for it, not 2: the user did nothing wrong."""

    exit_code = 1

    def __init__(
        self,
        what: str,
        *,
        stage: str,
        node: str | None = None,
        reproducer: str | None = None,
        where: str | None = None,
        fix: str | None = None,
    ):
        self.stage, self.node, self.reproducer = stage, node, reproducer
        super().__init__(what, where=where, fix=fix)


@contextlib.contextmanager
def pass_errors(stage: str, where: str):
    """Any non-Kiln exception raised inside the block becomes a PassError naming the stage: what
    the compile's fallback and error attribution (compiler/fallback.py) act on."""
    try:
        yield
    except KilnError:
        raise
    except Exception as e:
        raise PassError(stage, e, where=where, fix="rerun with --debug for the full trace") from e


@contextlib.contextmanager
def tvm_errors(stage: str, where: str, fix: str = "rerun with --debug for the full trace"):
    """Turn any non-Kiln exception raised by TVM inside the block into a CompileError that names
    the stage and keeps TVM's last message line."""
    try:
        yield
    except KilnError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise CompileError(
            f"{stage} failed: {type(e).__name__}: {msg[-1] if msg else ''}", where=where, fix=fix
        ) from None
