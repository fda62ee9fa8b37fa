"""The declared report (kiln/counters.py, compiler/report_keys.py): every key a pass writes into its
stats is declared in its module, every key the printer reads is declared by someone, and a compile's
passes emit nothing undeclared."""

import ast
import inspect

from helpers import make_model, rand
from onnx import helper

from kiln.compiler import optimize as optimize_mod
from kiln.compiler import report, report_keys
from kiln.compiler.build import analyze_model
from kiln.counters import Counter, declared

TYPES = (int, float, list, dict, str)


def _stats_keys(module) -> set[str]:
    """String keys the module's code writes or reads on `self.stats` / `stats` (subscripts, get,
    setdefault, and the dict literal assigned to self.stats)."""
    keys = set()
    for n in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
            target, key = n.value, n.slice.value
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "setdefault"):
            if not (n.args and isinstance(n.args[0], ast.Constant)):
                continue
            target, key = n.func.value, n.args[0].value
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict):
            if any(isinstance(t, ast.Attribute) and t.attr == "stats" for t in n.targets):
                keys |= {k.value for k in n.value.keys}
            continue
        else:
            continue
        if (isinstance(target, ast.Attribute) and target.attr == "stats") or (
            isinstance(target, ast.Name) and target.id == "stats"
        ):
            keys.add(key)
    return keys


def test_every_pass_declares_what_it_counts():
    problems = []
    for m in report_keys._pass_modules():
        undeclared = _stats_keys(m) - set(report_keys.module_counters(m))
        problems += [f"{m.__name__} writes {k!r} without declaring it (a Counter in its COUNTERS)" for k in undeclared]
    assert not problems, "\n".join(problems)


def test_declarations_are_complete_and_agree():
    by_name: dict[str, Counter] = {}
    for m in report_keys._pass_modules():
        for c in report_keys.module_counters(m).values():
            assert c.type in TYPES and c.meaning, c
            assert by_name.setdefault(c.name, c) == c, f"{c.name} declared twice, differently"
    assert not set(by_name) & {c.name for c in report_keys.REPORT}


def test_the_printer_reads_only_declared_keys():
    tree = ast.parse(inspect.getsource(report.format_report))
    read = {
        n.slice.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Subscript)
        and isinstance(n.value, ast.Name)
        and n.value.id == "r"
        and isinstance(n.slice, ast.Constant)
    }
    read |= {
        n.args[0].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "get"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "r"
    }
    assert len(read) > 20  # the walk found the printer's reads
    assert not read - set(report_keys.declared_keys())


def test_a_compile_emits_only_declared_keys(monkeypatch):
    emitted = []
    real = optimize_mod._run_row

    def run_row(spec, p, mod, rep, where):
        out = real(spec, p, mod, rep, where)
        emitted.append((spec.name, set(getattr(p, "stats", {})), set(declared(p))))
        return out

    monkeypatch.setattr(optimize_mod, "_run_row", run_row)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]
    inits = {"w": rand(16, 3, 3, 3), "s": rand(16), "b": rand(16), "m": rand(16), "v": abs(rand(16)) + 1}
    r = analyze_model(make_model(nodes, {"x": rand(1, 3, 8, 8)}, ["y"], inits))
    assert [(n, e - d) for n, e, d in emitted if e - d] == []
    assert any(e for _, e, _ in emitted)  # the passes did count something
    assert not set(r) - set(report_keys.declared_keys())
