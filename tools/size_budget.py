"""The size budget `make lint` enforces on kiln/: no function over MAX_FUNCTION lines, no file over
MAX_FILE lines. Today's offenders are listed in tools/size_budget_allow.txt; the list may only shrink:
a listed entry that now fits the budget, or that no longer exists, fails too (remove it).

  python tools/size_budget.py           check (exit 1 naming each offender)
  python tools/size_budget.py --list    print today's offenders in the allow-list's format
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_FUNCTION = 80
MAX_FILE = 500
REPO = Path(__file__).resolve().parent.parent
ALLOW = Path(__file__).with_name("size_budget_allow.txt")


def offenders(root: Path = REPO / "kiln") -> dict[str, int]:
    """{"path" or "path::qualified.function": lines} of every file and function over the budget."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        text = path.read_text()
        if text.count("\n") > MAX_FILE:
            out[rel] = text.count("\n")
        for name, lines in _functions(ast.parse(text, rel)):
            if lines > MAX_FUNCTION:
                out[f"{rel}::{name}"] = lines
    return out


def _functions(tree, prefix: str = ""):
    """(qualified name, lines from `def` to its last line) of every function, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def allowed(path: Path = ALLOW) -> set[str]:
    """The allow-list's entries: one per line, `#` comments and blank lines skipped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def problems(found: dict[str, int], allow: set[str]) -> list[str]:
    over = [f"{k}: {v} lines (budget: {MAX_FUNCTION if '::' in k else MAX_FILE})" for k, v in found.items()]
    new = [p for p, k in zip(over, found) if k not in allow]
    stale = [f"{k}: within the budget now (or gone): remove it from {ALLOW.name}" for k in sorted(allow - set(found))]
    return new + stale


def main(argv: list[str]) -> int:
    found = offenders()
    if "--list" in argv:
        print("\n".join(sorted(found)))
        return 0
    bad = problems(found, allowed())
    for line in bad:
        print(line, file=sys.stderr)
    if bad:
        print(
            f"size budget: split what is over it (functions <= {MAX_FUNCTION}, files <= {MAX_FILE} lines)",
            file=sys.stderr,
        )
        return 1
    print(f"size budget: ok ({len(found)} allowed offenders in {ALLOW.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
