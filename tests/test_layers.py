"""The layers of kiln/ as a test: every import statement of every module (imports inside functions
included, relative imports resolved) is an edge; the test fails on an import cycle among kiln's
modules, on an edge the layering forbids, and on a private name (`_x`) imported from another module.
Each failure names the importing module's file and line."""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "kiln"

# (importer prefix, imported prefix, prefixes excepted, why): a module matching the first may not
# import one matching the second. A prefix matches the module itself and everything below it.
FORBIDDEN = (
    ("kiln.frontends", "kiln.compiler", (), "frontends read models; the compiler builds on them, not the reverse"),
    ("kiln.compiler.passes", "kiln.compiler.build", (), "passes do not import the build driver"),
    ("kiln.compiler.passes", "kiln.compiler.flows", (), "passes do not import the build flows"),
    ("kiln.compiler.passes", "kiln.compiler.tune", (), "passes do not import the tuning driver"),
    ("kiln.schedules", "kiln.compiler", ("kiln.compiler.ir",), "schedules use only the compiler's IR helpers"),
    ("kiln.runtime", "kiln.compiler", (), "the runtime never imports the compiler (a deployment has none)"),
    ("kiln.runtime", "kiln.frontends", (), "the runtime never imports the frontends"),
    ("kiln.runtime", "kiln.schedules", (), "the runtime never imports the schedules"),
    ("kiln.accel", "kiln.compiler", (), "an accelerator is a device model; the compiler's backends build for it"),
    ("kiln.accel", "kiln.schedules", (), "an accelerator is a device model; the compiler's backends build for it"),
    ("kiln.schedules.rules", "kiln.schedules.tuning", (), "the default rules need no tuner; kiln tune builds on them"),
)
# Only these import kiln.compiler.backends (the driver, the options that resolve the target's backend once, the
# tuning driver, and the backends themselves): every other module gets its backend handed down (options.backend).
BACKEND_IMPORTERS = ("kiln.compiler.build", "kiln.compiler.options", "kiln.compiler.tune", "kiln.compiler.backends")
# (importer, imported) -> why: single edges a FORBIDDEN row refuses, allowed by name
ALLOWED: dict[tuple[str, str], str] = {
    ("kiln.schedules.rules.apply", "kiln.schedules.tuning.database"): "ApplyTuningDatabase reads the tuning "
    "database (imported inside the pass, only when a compile has records)",
}


@dataclasses.dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    at: str  # file:line of the import statement
    names: tuple[str, ...]  # the name a `from X import a` takes (empty for `import X`)


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _owner(name: str, mods: dict) -> str | None:
    """The kiln module a dotted name lives in: the longest prefix that is a module."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def edges(root: Path = ROOT) -> list[Edge]:
    """Every import of one of the package's modules by another (an ancestor package excepted: `from
    .. import __version__` reads the package, it does not depend on what the package imports)."""
    mods = modules(root)
    out = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(base + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:  # `from pkg import submodule` imports the submodule
                    full = f"{base}.{a.name}"
                    targets.append((full, ()) if full in mods else (base, (a.name,)))
            for name, names in targets:
                dst = _owner(name, mods) if name.split(".")[0] == root.name else None
                if dst and dst != mod and not mod.startswith(dst + "."):
                    out.append(Edge(mod, dst, f"{path.relative_to(root.parent)}:{node.lineno}", names))
    return out


def _matches(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def cycles(all_edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set] = {}
    for e in all_edges:
        graph.setdefault(e.src, set()).add(e.dst)
        graph.setdefault(e.dst, set())
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    all_edges = edges()
    problems = []
    for comp in cycles(all_edges):
        inside = [e for e in all_edges if e.src in comp and e.dst in comp]
        problems.append(
            f"cycle: {' <-> '.join(comp)}\n" + "\n".join(f"  {e.at}: {e.src} imports {e.dst}" for e in inside)
        )
    assert not problems, "import cycles among kiln's modules:\n" + "\n".join(problems)


def test_no_forbidden_edges():
    problems = [
        f"{e.at}: {e.src} imports {e.dst} ({why})"
        for e in edges()
        for src, dst, excepted, why in FORBIDDEN
        if _matches(e.src, src)
        and _matches(e.dst, dst)
        and not any(_matches(e.dst, x) for x in excepted)
        and (e.src, e.dst) not in ALLOWED
    ]
    assert not problems, "imports the layering forbids:\n" + "\n".join(problems)


def test_only_the_driver_tune_and_backends_import_backends():
    problems = [
        f"{e.at}: {e.src} imports {e.dst} (the backend is handed down: use options.backend)"
        for e in edges()
        if _matches(e.dst, "kiln.compiler.backends") and not any(_matches(e.src, m) for m in BACKEND_IMPORTERS)
    ]
    assert not problems, "imports of the backends outside the driver:\n" + "\n".join(problems)


def test_no_private_names_across_modules():
    problems = [
        f"{e.at}: {e.src} imports {n} from {e.dst} (make it public, or move it where it is used)"
        for e in edges()
        for n in e.names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert not problems, "private names imported across modules:\n" + "\n".join(problems)


def test_allowed_edges_exist():
    """Every allowed exception still names an edge of the tree (a stale one is removed)."""
    present = {(e.src, e.dst) for e in edges()}
    assert not set(ALLOWED) - present, f"stale ALLOWED entries: {sorted(set(ALLOWED) - present)}"


def test_the_walk_resolves_relative_and_lazy_imports(tmp_path):
    """The walk itself: relative imports resolved against the package, imports inside functions
    found, `from pkg import submodule` an edge to the submodule, ancestors skipped; cycles found."""
    pkg = tmp_path / "kiln"
    (pkg / "a").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a/__init__.py": "from .. import b\n",
        "a/x.py": "def f():\n    from ..b import _hidden, shown\n",
        "a/y.py": "from . import x\nimport kiln.b\nimport os\n",
        "b.py": "from .a.y import thing\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    found = {(e.src, e.dst, e.at, e.names) for e in edges(pkg)}
    assert found == {
        ("kiln.a", "kiln.b", "kiln/a/__init__.py:1", ()),
        ("kiln.a.x", "kiln.b", "kiln/a/x.py:2", ("_hidden",)),
        ("kiln.a.x", "kiln.b", "kiln/a/x.py:2", ("shown",)),
        ("kiln.a.y", "kiln.a.x", "kiln/a/y.py:1", ()),
        ("kiln.a.y", "kiln.b", "kiln/a/y.py:2", ()),
        ("kiln.b", "kiln.a.y", "kiln/b.py:1", ("thing",)),
    }
    assert cycles(edges(pkg)) == [["kiln.a.x", "kiln.a.y", "kiln.b"]]
