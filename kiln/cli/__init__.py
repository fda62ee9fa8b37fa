"""The `kiln` command line, thin over the public API. Exit codes: 0 success, 2 user error (bad
model, input, artifact or option: one line on stderr), 1 internal error. --debug shows tracebacks.

Each module of this package with a `register(sub)` function adds its subcommands (ORDER places them
in --help); flags that several subcommands share are declared once in `flags`."""

from __future__ import annotations

import argparse
import sys
import traceback

from ..errors import KilnError

DEBUG_HELP = "show full tracebacks, TVM's C++ frames included (before or after the subcommand)"
BROKEN_PIPE = 141  # the exit status of a command killed by SIGPIPE (`kiln inspect X | head -1`)
# The commands that read only .kiln artifacts. Importing TVM imports PyTorch when it is installed (tvm_ffi
# tries `import torch` first, for a symbol conflict seen on Windows): a large share of `kiln run`'s start-up
# (benchmarks/history.md), for a library these commands never use. Their process hides it (kiln compile/tune/inspect
# read .pt2).
ARTIFACT_ONLY = frozenset({"run", "unpack", "bench", "profile", "serve"})


def _commands() -> list:
    """The modules of this package that declare subcommands (COMMANDS: name -> help, and a
    `register(sub)` that adds their parsers), in their ORDER: adding a subcommand is adding a module."""
    import importlib
    import pkgutil

    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted((m for m in mods if hasattr(m, "register")), key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser(cmd: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand. Given `cmd`, only the module of that one declares its flags (declaring them
    reads the options dataclasses, which may import TVM); the others are listed with their help
    (cmd="": all of them, for `kiln --help`)."""
    p = argparse.ArgumentParser(prog="kiln", description="Ahead-of-time deep-learning compiler on Apache TVM.")
    p.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = p.add_subparsers(dest="cmd", required=True)
    for m in _commands():
        names = getattr(m, "COMMANDS", None)
        if cmd is None or names is None or cmd in names:
            m.register(sub)
        else:
            for name, text in names.items():
                sub.add_parser(name, help=text.replace("%", "%%"))
    for sp in sub.choices.values():  # --debug after the subcommand too; SUPPRESS keeps the one before it
        if "--debug" not in sp._option_string_actions:
            sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return p


def _print_debug(e: BaseException) -> None:
    """The traceback of `e` and of every exception behind it, also those a `raise ... from None` hid:
    a KilnError that wraps TVM's error shows TVM's frames (tvm_ffi appends the C++ ones)."""
    seen, x = set(), e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        x.__suppress_context__ = False
        x = x.__cause__ or x.__context__
    traceback.print_exception(e)


def _stdout_gone() -> None:
    """The reader of our stdout went away: point stdout at /dev/null so the final flush is quiet."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (pytest's capture)
        pass


def _print_kiln_warnings(cmd: str) -> None:
    """Kiln's warnings (a pass skipped, a constant left unfolded) as one line each on stderr."""
    import warnings

    from ..errors import KilnWarning

    shown = warnings.showwarning
    if getattr(shown, "kiln", False):  # main() called again in one process
        return

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, KilnWarning):
            print(f"kiln {cmd}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    show.kiln = True
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    import time

    started = time.perf_counter()  # before parsing, which may import TVM: `kiln tune --budget` counts from here
    argv = list(sys.argv[1:] if argv is None else argv)
    words = [t for t in argv if not t.startswith("-")]
    cmd = words[0] if words else None  # the top-level options take no values
    name = f"kiln {cmd}" if cmd else "kiln"
    debug = "--debug" in (argv[: argv.index("--")] if "--" in argv else argv)
    try:
        args = build_parser(cmd or "").parse_args(argv)  # inside: a flag's type may raise an OptionsError
        args.argv, args.started = argv, started
        _print_kiln_warnings(args.cmd)
        code = args.fn(args)
        sys.stdout.flush()  # a closed pipe fails here, not at exit
        return code
    except BrokenPipeError:
        _stdout_gone()
        return BROKEN_PIPE
    except KilnError as e:
        if debug:
            _print_debug(e)
        code = getattr(e, "exit_code", 2)  # 1 for an InternalError: Kiln's bug, not the user's
        print(f"{name}: {'error' if code == 2 else 'internal error'}: {e}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in Kiln or TVM: say so, keep the trace behind --debug
        if debug:
            _print_debug(e)
        print(
            f"{name}: internal error: {type(e).__name__}: {e} (rerun with --debug and report it)",
            file=sys.stderr,
        )
        return 1


def entry() -> int:
    """The `kiln` executable and `python -m kiln`: main() in a process of its own, which for the
    artifact-only commands hides PyTorch before TVM is imported (ARTIFACT_ONLY). Not main() itself:
    a program calling main() in its process may use torch afterwards."""
    words = [t for t in sys.argv[1:] if not t.startswith("-")]
    if words and words[0] in ARTIFACT_ONLY:
        sys.modules.setdefault("torch", None)  # `import torch` raises ImportError, which tvm_ffi skips
    return main()
