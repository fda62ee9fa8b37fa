"""One home for knobs: every KILN_* environment variable is read in kiln/env.py (the C++ runner reads
KILN_THREAD_POOL too) and listed in docs/cli.md."""

import ast
import re
from pathlib import Path

from kiln import env

ROOT = Path(__file__).resolve().parent.parent


def _declared() -> set[str]:
    return {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and v.startswith("KILN_")}


def test_every_variable_is_listed_in_the_docs():
    docs = (ROOT / "docs" / "cli.md").read_text()
    assert not {v for v in _declared() if f"`{v}`" not in docs}


def _is_environ(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def _environment_keys(tree) -> list[tuple[int, ast.expr]]:
    """(line, key) of every read of one variable: os.environ.get(k) / [k] / setdefault(k) / pop(k), `k in
    os.environ`, os.getenv(k)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and n.args and isinstance(n.func, ast.Attribute):
            if (n.func.attr in ("get", "setdefault", "pop") and _is_environ(n.func.value)) or n.func.attr == "getenv":
                out.append((n.lineno, n.args[0]))
        elif isinstance(n, ast.Subscript) and _is_environ(n.value):
            out.append((n.lineno, n.slice))
        elif isinstance(n, ast.Compare) and any(_is_environ(c) for c in n.comparators):
            out.append((n.lineno, n.left))
    return out


def test_no_module_reads_a_kiln_variable_but_env():
    """Outside kiln/env.py a module reads the environment only by a literal name that is not Kiln's (TVM's
    TVM_NUM_THREADS, ...): a KILN_* literal, or a name held in a variable, is a knob outside its home."""
    offenders = []
    for p in sorted((ROOT / "kiln").rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        if rel == "kiln/env.py":
            continue
        for line, key in _environment_keys(ast.parse(p.read_text())):
            literal = isinstance(key, ast.Constant) and isinstance(key.value, str)
            if not literal or key.value.startswith("KILN_"):
                offenders.append(f"{rel}:{line}: {ast.unparse(key)}")
    assert not offenders, "read KILN_* variables in kiln/env.py:\n" + "\n".join(offenders)
    assert {"KILN_THREAD_POOL", "KILN_NUM_THREADS", "KILN_CPUS"} <= _declared()


def test_the_check_finds_reads_by_a_name_held_in_a_variable():
    tree = ast.parse(
        "import os\nX = 'KILN_A'\nos.environ.get(X)\nos.getenv('TVM_B')\nif 'KILN_C' in os.environ: pass\n"
    )
    assert [ast.unparse(k) for _, k in _environment_keys(tree)] == ["X", "'TVM_B'", "'KILN_C'"]


def test_no_kiln_variable_outside_env_is_named_in_a_read():
    """The literal-name scan of the old check, kept: a KILN_ name in a module that touches the environment."""
    reads = re.compile(r"os\.environ|getenv")
    offenders = []
    for p in sorted((ROOT / "kiln").rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        text = p.read_text()
        if rel == "kiln/env.py" or not reads.search(text):
            continue
        offenders += [f"{rel}: {n}" for n in sorted(set(re.findall(r"KILN_[A-Z_]+", text)))]
    assert not offenders, "read KILN_* variables in kiln/env.py:\n" + "\n".join(offenders)
