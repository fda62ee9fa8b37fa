"""The `kiln` command line, thin over the public API. Exit codes: 0 success, 2 user error (bad
model, input, artifact or option: one line on stderr), 1 internal error. --debug shows tracebacks.

Each module of this package with a `register(sub)` function adds its subcommands (ORDER places them
in --help); flags that several subcommands share are declared once in `flags`."""

from __future__ import annotations

import argparse
import sys
import traceback

from ..errors import KilnError


def _commands() -> list:
    """The modules of this package that declare subcommands (a `register(sub)` function), in their ORDER:
    adding a subcommand is adding a module."""
    import importlib
    import pkgutil

    mods = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return sorted((m for m in mods if hasattr(m, "register")), key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kiln", description="Ahead-of-time deep-learning compiler on Apache TVM.")
    p.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = p.add_subparsers(dest="cmd", required=True)
    for m in _commands():
        m.register(sub)
    return p


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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    _print_kiln_warnings(args.cmd)
    try:
        return args.fn(args)
    except KilnError as e:
        if args.debug:
            traceback.print_exc()
        code = getattr(e, "exit_code", 2)  # 1 for an InternalError: Kiln's bug, not the user's
        print(f"kiln {args.cmd}: {'error' if code == 2 else 'internal error'}: {e}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print(f"kiln {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in Kiln or TVM: say so, keep the trace behind --debug
        if args.debug:
            traceback.print_exc()
        print(
            f"kiln {args.cmd}: internal error: {type(e).__name__}: {e} (rerun with --debug and report it)",
            file=sys.stderr,
        )
        return 1
