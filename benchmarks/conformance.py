"""The ONNX backend node test cases (the conformance suite the `onnx` package ships) through Kiln,
with onnxruntime beside it. Each case's model is compiled by `kiln.compile`, loaded with `kiln.load`
and run on the case's inputs; its outputs are compared with the case's expected outputs with the
tolerance onnx's own backend runner uses (the case's rtol/atol: 1e-3/1e-7 unless the case says).
onnxruntime decides which cases count: a case it does not pass (opset too new, a bug of its own) is
reported but not held against Kiln.

Kiln's outcome per case: pass, mismatch (wrong values, shape or dtype), unsupported (a KilnError
other than CompileError and InternalError: what Kiln answers with exit code 2 for a model it cannot
compile), internal (CompileError, InternalError or any other exception: a bug), crash (the worker
process died or hung past the per-case timeout). Every case runs in a worker subprocess
(fuzz/executor.py's protocol), which is restarted when it dies, so nothing a case does can stop the run.

Inputs the model leaves open (a sequence's length and element shapes, an optional's presence, a symbolic
tensor dim) are pinned to the case's feeds with input_shapes=, as a user pins them with --input-shape.

Cases whose models take a shape-determining value (Reshape's shape, Slice's starts, TopK's k, ...)
as a graph input are also compiled with that input frozen to the case's value
(`kiln.compile(..., freeze_inputs=...)`, the CLI's --freeze-input): the "pass with freeze" column.

    .venv/bin/python -m benchmarks.conformance [--sample N --seed S] [--ops A,B] [--out benchmarks/conformance.md]
        [--json] [--timeout 60]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz.executor import Executor  # noqa: E402
from kiln.frontends.constant_inputs import CONSTANT_INPUTS  # noqa: E402
from kiln.runtime.hostinfo import cpu_model_name  # noqa: E402

EXCLUDED_DOMAINS = ("ai.onnx.preview.training",)
# (op type, input index) of node inputs whose value decides an output shape (or an attribute TVM needs
# as a constant): a graph input feeding one of these is frozen for the "pass with freeze" column. Kiln's
# own table (what `kiln compile` refuses from a graph input) plus the ops Kiln takes unfrozen or decomposes;
# for Pad and CenterCropPad only the shape-deciding inputs (Kiln also wants Pad's value, CenterCropPad's axes)
SHAPE_INPUTS = {
    **CONSTANT_INPUTS,
    "Pad": (1, 3),
    "CenterCropPad": (1,),
    "Slice": (1, 2, 3, 4),
    "Unsqueeze": (1,),
    "Trilu": (1,),
    "CumProd": (1,),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "Loop": (0, 1),
    # shape-deciding inputs Kiln now takes at run time (tvm_dynamic_shapes.py, tvm_reduce.py, tvm_resize.py, tvm_pad.py,
    # tvm_affine_grid.py, tvm_col2im.py, Range): frozen in that column too
    "Reshape": (1,),
    "Expand": (1,),
    "Split": (1,),
    "Resize": (1, 2, 3),
    "TopK": (1,),
    "ConstantOfShape": (0,),
    "Squeeze": (1,),
    "Tile": (1,),
    "Range": (0, 1, 2),
    "Upsample": (1,),
    "AffineGrid": (1,),
    "Col2Im": (1, 2),
    **{op: (1,) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1")},
    **{op: (1,) for op in ("ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
OUTCOMES = ("pass", "mismatch", "unsupported", "internal", "crash")


# ---------------------------------------------------------------------------------------------- cases


def all_cases() -> dict:
    """name -> onnx TestCase, in onnx's order, without the training-domain cases."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    return {c.name: c for c in cases if not any(o.domain in EXCLUDED_DOMAINS for o in c.model.opset_import)}


def case_op(case, names: dict) -> str:
    """The op a case tests: its model's first non-Constant node; an `_expanded` case (the op's
    function body written out) counts for the op of its plain sibling."""
    base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
    if base != case.name and base in names:
        return case_op(names[base], names)
    nodes = [n for n in case.model.graph.node if n.op_type != "Constant"] or list(case.model.graph.node)
    if not nodes:
        return "(none)"
    n = nodes[0]
    return n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"


def feeds(case) -> dict:
    inits = {t.name for t in case.model.graph.initializer}
    names = [i.name for i in case.model.graph.input if i.name not in inits]
    return dict(zip(names, case.data_sets[0][0]))


def pinned_shapes(case) -> dict:
    """The shapes to pin (input_shapes=, as `--input-shape` would) for the case's inputs the model leaves
    open: a sequence's element shapes, an optional's value (None when absent), a tensor's symbolic dims."""
    import numpy as np

    fed, out = feeds(case), {}
    for vi in case.model.graph.input:
        if vi.name not in fed:
            continue
        v, kind = fed[vi.name], vi.type.WhichOneof("value")
        dims = vi.type.tensor_type.shape.dim if kind == "tensor_type" else ()
        if isinstance(v, list):
            out[vi.name] = [tuple(np.shape(e)) for e in v] if v else "[]"
        elif v is None or kind != "tensor_type" or any(not d.HasField("dim_value") for d in dims):
            out[vi.name] = None if v is None else tuple(np.shape(v))
    return out


def shape_inputs(case) -> dict:
    """The graph inputs of the case that feed a shape-determining node input, with their values."""
    fed = feeds(case)
    out = {}
    for node in case.model.graph.node:
        for i in SHAPE_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in fed:
                out[node.input[i]] = fed[node.input[i]]
    return out


def compare(expected, got, rtol: float, atol: float) -> str | None:
    """None when `got` matches `expected` as onnx's backend runner decides (dtype, shape, allclose;
    sequences element-wise); else what differs."""
    import numpy as np

    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"sequence of {len(expected)} expected, got {type(got).__name__}"
        for k, (e, g) in enumerate(zip(expected, got)):
            d = compare(e, g, rtol, atol)
            if d:
                return f"[{k}] {d}"
        return None
    if expected is None:
        return None if got is None else "None expected"
    e, g = np.asarray(expected), np.asarray(got)
    if e.dtype != g.dtype:
        return f"dtype {g.dtype}, expected {e.dtype}"
    if e.shape != g.shape:
        return f"shape {g.shape}, expected {e.shape}"
    if e.dtype == object or e.dtype.kind in "US":
        return None if np.array_equal(e, g) else "values differ"
    try:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    except AssertionError:
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        return (
            f"values differ: max abs err {float(diff.max()):.3g} ({int((diff > atol + rtol * np.abs(e)).sum())}"
            f"/{e.size} elements)"
        )
    return None


def compare_all(case, outs: list, names: list[str]) -> str | None:
    expected = case.data_sets[0][1]
    if len(outs) != len(expected):
        return f"{len(outs)} outputs, expected {len(expected)}"
    for name, e, g in zip(names, expected, outs):
        d = compare(e, g, case.rtol, case.atol)
        if d:
            return f"output {name!r}: {d}"
    return None


# ---------------------------------------------------------------------------------------------- worker


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:300]


def run_ort(case) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds(case))
    except Exception as e:
        return {"outcome": "fail", "type": type(e).__name__, "detail": _first_line(e)}
    d = compare_all(case, outs, [o.name for o in case.model.graph.output])
    return {"outcome": "fail", "type": "mismatch", "detail": d} if d else {"outcome": "pass"}


def run_kiln(case, tmp: Path, freeze: bool = False) -> dict:
    """Compile, load and run one case; the outcome (see the module docstring)."""
    import kiln
    from kiln import errors

    internal = tuple(getattr(errors, n) for n in ("CompileError", "InternalError") if hasattr(errors, n))
    fed = feeds(case)
    pinned = pinned_shapes(case)
    kwargs = {"input_shapes": pinned} if pinned else {}
    if freeze:
        frozen = shape_inputs(case)
        kwargs["freeze_inputs"] = frozen
    stage = "compile"
    try:
        out = tmp / "m.kiln"
        for _ in range(3):  # Kiln's refusal names the graph inputs to freeze (an _expanded case feeds them elsewhere)
            try:
                frozen_now = kwargs.get("freeze_inputs", {})
                if pinned:  # a frozen input is a constant, not pinned
                    kwargs["input_shapes"] = {k: v for k, v in pinned.items() if k not in frozen_now}
                kiln.compile(case.model, out, **kwargs)
                break
            except kiln.UnsupportedModelError as e:
                more = {
                    s: fed[s]
                    for op in e.ops
                    for s in op.get("sources", ())
                    if s in fed and s not in kwargs.get("freeze_inputs", {})
                }
                if not freeze or not more:
                    raise
                kwargs["freeze_inputs"] = {**kwargs["freeze_inputs"], **more}
        fed = {k: v for k, v in fed.items() if k not in kwargs.get("freeze_inputs", {})}
        stage = "run"
        m = kiln.load(out)
        res = m.run(fed)
        names = [o.name for o in case.model.graph.output]
        outs = [res.get(n) for n in names] if all(n in res for n in names) else list(res.values())
        d = compare_all(case, outs, names)
    except internal as e:  # a KilnError that says Kiln (or TVM under it) has a bug
        return {"outcome": "internal", "type": type(e).__name__, "stage": stage, "detail": _first_line(e)}
    except kiln.KilnError as e:
        sources = sorted({s for op in getattr(e, "ops", ()) for s in op.get("sources", ())})
        return {
            "outcome": "unsupported",
            "type": type(e).__name__,
            "stage": stage,
            "detail": _first_line(e),
            **({"freeze_sources": sources} if sources else {}),
        }
    except TypeError as e:
        if freeze and "freeze_inputs" in str(e):
            return {"outcome": "n/a", "detail": "kiln.compile has no freeze_inputs= yet"}
        return {"outcome": "internal", "type": "TypeError", "stage": stage, "detail": _first_line(e)}
    except BaseException as e:
        return {"outcome": "internal", "type": type(e).__name__, "stage": stage, "detail": _first_line(e)}
    return {"outcome": "mismatch", "type": "mismatch", "detail": d} if d else {"outcome": "pass"}


def worker_main() -> int:
    """The worker: frames (kind, case name) in on stdin, one JSON line per case out (fuzz/worker.py's
    protocol). kind: ort | kiln | freeze."""
    import resource
    import struct
    import warnings

    from fuzz.worker import MEMORY_LIMIT, _read_exact

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    warnings.simplefilter("ignore")
    stdout = os.fdopen(os.dup(1), "w")  # the protocol channel; anything else printing goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    cases = all_cases()
    import kiln  # noqa: F401 - before the first case, so its import time is not a case's

    stdin = sys.stdin.buffer
    with tempfile.TemporaryDirectory(prefix="kiln-conf-") as d:
        while True:
            try:
                (n,) = struct.unpack("<I", _read_exact(stdin, 4))
                kind = _read_exact(stdin, n).decode()
                (n,) = struct.unpack("<I", _read_exact(stdin, 4))
                name = _read_exact(stdin, n).decode()
            except EOFError:
                return 0
            print(f"== {kind} {name}", file=sys.stderr, flush=True)
            tmp = Path(tempfile.mkdtemp(dir=d))
            t = time.perf_counter()
            case = cases[name]
            result = run_ort(case) if kind == "ort" else run_kiln(case, tmp, freeze=kind == "freeze")
            result["seconds"] = round(time.perf_counter() - t, 2)
            stdout.write(json.dumps(result) + "\n")
            stdout.flush()
            shutil.rmtree(tmp, ignore_errors=True)


class CaseExecutor(Executor):
    """fuzz's Executor on the conformance worker; the worker's stderr goes to a log whose last lines
    say why a crashed worker died."""

    def __init__(self, timeout_s: float = 60.0, log: Path | None = None):
        super().__init__(timeout_s)
        self.log = log or Path(tempfile.gettempdir()) / f"kiln-conformance-worker-{os.getpid()}.log"

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("KILN_TUNING_LOGS", "none")  # default schedules: what the suite tests is the result
        env.setdefault("TVM_NUM_THREADS", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        self._log_f = open(self.log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.conformance", "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_f,
            cwd=ROOT,
            env=env,
        )

    def _tail(self) -> str:
        try:
            lines = [x for x in self.log.read_text(errors="replace").splitlines() if x.strip()]
        except OSError:
            return ""
        keep = [x for x in lines[-30:] if not x.startswith("== ")]
        for x in reversed(keep):  # the most telling line: TVM's or the C runtime's message
            if re.search(r"error|abort|fault|check failed|terminate", x, re.I):
                return x.strip()[:300]
        return keep[-1].strip()[:300] if keep else ""

    def case(self, kind: str, name: str) -> dict:
        r = self.run(kind, name.encode())
        if r["outcome"] in ("crash", "hang"):
            r = {
                "outcome": "crash",
                "type": "timeout" if r["outcome"] == "hang" else "died",
                "detail": r["detail"] + (f": {t}" if (t := self._tail()) else ""),
            }
        return r


# ---------------------------------------------------------------------------------------------- the run


def select(
    cases: dict, ops: list[str] | None, sample: int | None, seed: int, names: list[str] | None = None
) -> list[str]:
    """Case names to run: those of `ops` (op types, as case_op names them) or `names`, then a fixed
    random sample of n of them (sorted back into onnx's order)."""
    chosen = list(cases)
    if names:
        chosen = [n for n in chosen if n in set(names)]
    if ops:
        want = {o.lower() for o in ops}
        chosen = [n for n in chosen if case_op(cases[n], cases).lower() in want]
    if sample and sample < len(chosen):
        keep = set(random.Random(seed).sample(chosen, sample))
        chosen = [n for n in chosen if n in keep]
    return chosen


def spread(cases: dict, n: int) -> list[str]:
    """A fixed sample of n cases spanning the ops: n ops evenly spaced in sorted order (all of them
    when n is larger), the first case of each in onnx's order, then second cases while n allows."""
    by_op: dict[str, list[str]] = collections.defaultdict(list)
    for name, c in cases.items():
        by_op[case_op(c, cases)].append(name)
    ops = sorted(by_op)
    if n < len(ops):
        ops = [ops[i * len(ops) // n] for i in range(n)]
    chosen: list[str] = []
    for k in range(max((len(by_op[o]) for o in ops), default=0)):
        chosen += [by_op[o][k] for o in ops if k < len(by_op[o])][: n - len(chosen)]
    keep = set(chosen)
    return [name for name in cases if name in keep]


def run_cases(names: list[str], cases: dict, timeout_s: float = 60.0, progress=None, freeze: bool = True) -> list[dict]:
    """Run each case (onnxruntime, Kiln, and Kiln with frozen shape inputs where the case has them and
    the plain build did not pass) in a worker; one record per case."""
    ex = CaseExecutor(timeout_s)
    records = []
    try:
        for k, name in enumerate(names):
            case = cases[name]
            rec = {"name": name, "op": case_op(case, cases), "ort": ex.case("ort", name), "kiln": ex.case("kiln", name)}
            if freeze and (shape_inputs(case) or rec["kiln"].get("freeze_sources")):
                rec["freeze_inputs"] = sorted(set(shape_inputs(case)) | set(rec["kiln"].get("freeze_sources", ())))
                rec["freeze"] = rec["kiln"] if rec["kiln"]["outcome"] == "pass" else ex.case("freeze", name)
            records.append(rec)
            if progress:
                progress(k, len(names), rec)
    finally:
        ex.close()
    return records


def freeze_outcome(rec: dict) -> str:
    """The case's outcome with its shape inputs frozen: the plain outcome when it has none."""
    return rec.get("freeze", rec["kiln"])["outcome"]


def message_group(r: dict) -> str:
    """An error without its variable parts (numbers, node and tensor names): which cause it is."""
    text = r.get("detail") or ""
    text = re.sub(r"^(<model>|/tmp/\S+):\s*", "", text)
    text = re.sub(r"first node .*", "first node #)", text)
    text = re.sub(r" -> .*", "", text)  # the fix: the same for every case of a cause
    text = re.sub(r"(must be known at compile time).*", r"\1", text)  # which op and input: the per-op table
    text = re.sub(r"node '[^']*'|node \"[^\"]*\"", "node #", text)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "#", text)
    return f"{r.get('type', r['outcome'])}: {text.strip()}"[:160]


def totals(records: list[dict]) -> dict:
    ort_pass = [r for r in records if r["ort"]["outcome"] == "pass"]
    kiln_pass = [r for r in ort_pass if r["kiln"]["outcome"] == "pass"]
    frz = [r for r in records if "freeze" in r]
    frz_na = any(r["freeze"]["outcome"] == "n/a" for r in frz)
    return {
        "cases": len(records),
        "ort_pass": len(ort_pass),
        "kiln_pass": len(kiln_pass),
        "kiln_pass_freeze": None if frz_na else sum(freeze_outcome(r) == "pass" for r in ort_pass),
        "kiln_pass_all": sum(r["kiln"]["outcome"] == "pass" for r in records),
        "crashes": sum(r["kiln"]["outcome"] == "crash" or freeze_outcome(r) == "crash" for r in records),
        "with_shape_inputs": len(frz),
        "outcomes": dict(collections.Counter(r["kiln"]["outcome"] for r in ort_pass)),
    }


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "-"


def markdown(records: list[dict], command: str, seconds: float) -> str:
    t = totals(records)
    frz = (
        "n/a (kiln.compile has no freeze_inputs= yet)"
        if t["kiln_pass_freeze"] is None
        else f"{t['kiln_pass_freeze']} ({_pct(t['kiln_pass_freeze'], t['ort_pass'])})"
    )
    lines = [
        "# ONNX backend node tests through Kiln",
        "",
        f"Made by `{command}` on {cpu_model_name()} ({seconds / 60:.0f} min, one worker process, default schedules).",
        "The cases are onnx's own (`onnx.backend.test.case.node`, onnx "
        f"{_onnx_version()}; the {', '.join(EXCLUDED_DOMAINS)} ones left out); onnxruntime {_ort_version()} runs "
        "beside Kiln and decides which cases count: Kiln is measured on the cases onnxruntime passes.",
        "A pass matches the case's expected outputs in dtype, shape and values (the case's rtol/atol: 1e-3/1e-7 "
        "unless it says). unsupported: a KilnError other than CompileError and InternalError (exit code 2, a "
        "clear message); internal: CompileError, InternalError or another exception; crash: the worker died or hung.",
        "",
        "| | cases |",
        "|---|---|",
        f"| cases | {t['cases']} |",
        f"| onnxruntime passes | {t['ort_pass']} |",
        f"| Kiln passes (of those) | {t['kiln_pass']} ({_pct(t['kiln_pass'], t['ort_pass'])}) |",
        f"| Kiln passes with --freeze-input (of those) | {frz} |",
        f"| Kiln passes (all cases) | {t['kiln_pass_all']} |",
        f"| crashes (all cases) | {t['crashes']} |",
        "",
        "Kiln outcomes on the cases onnxruntime passes: "
        + ", ".join(f"{k} {t['outcomes'].get(k, 0)}" for k in OUTCOMES)
        + f". {t['with_shape_inputs']} cases take a shape-determining value as a graph input; the freeze column "
        "compiles those with it frozen to the case's value (the plain result where that already passed or the case "
        "has no such input).",
        "",
        "## Per op (the cases onnxruntime passes; in brackets: those it does not)",
        "",
        "| op | cases | pass | mismatch | unsupported | internal | crash | pass with --freeze-input |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_op: dict[str, list[dict]] = collections.defaultdict(list)
    for r in records:
        by_op[r["op"]].append(r)
    for op in sorted(by_op):
        rs = by_op[op]
        ok = [r for r in rs if r["ort"]["outcome"] == "pass"]
        bad = [r for r in rs if r["ort"]["outcome"] != "pass"]
        cells = []
        for o in OUTCOMES:
            a, b = sum(r["kiln"]["outcome"] == o for r in ok), sum(r["kiln"]["outcome"] == o for r in bad)
            cells.append(f"{a}" + (f" ({b})" if b else ""))
        if any("freeze" in r for r in rs):
            f = "n/a" if t["kiln_pass_freeze"] is None else str(sum(freeze_outcome(r) == "pass" for r in ok))
        else:
            f = ""
        lines.append(f"| {op} | {len(ok)}" + (f" ({len(bad)})" if bad else "") + f" | {' | '.join(cells)} | {f} |")
    lines += [
        "",
        "## Failure causes (the cases onnxruntime passes), most frequent first",
        "",
        "| outcome | count | cause | ops | example case |",
        "|---|---|---|---|---|",
    ]
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in records:
        if r["ort"]["outcome"] == "pass" and r["kiln"]["outcome"] != "pass":
            groups[(r["kiln"]["outcome"], message_group(r["kiln"]))].append(r)
    for (outcome, msg), rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ops = collections.Counter(r["op"] for r in rs)
        opl = ", ".join(o for o, _ in ops.most_common(6)) + (", ..." if len(ops) > 6 else "")
        ex = rs[0]["kiln"].get("detail", "").replace("|", "\\|")[:200]
        lines.append(f"| {outcome} | {len(rs)} | {msg.replace('|', chr(92) + '|')} | {opl} | `{rs[0]['name']}`: {ex} |")
    frz_fail = [
        r
        for r in records
        if "freeze" in r and r["ort"]["outcome"] == "pass" and freeze_outcome(r) not in ("pass", "n/a")
    ]
    if frz_fail:
        lines += [
            "",
            "## With --freeze-input: the cases still failing",
            "",
            "| case | frozen | outcome | error |",
            "|---|---|---|---|",
        ]
        for r in frz_fail:
            fr = r["freeze"]
            lines.append(
                f"| `{r['name']}` | {', '.join(r['freeze_inputs'])} | {fr['outcome']} | "
                f"{fr.get('type', '')}: {(fr.get('detail') or '').replace('|', chr(92) + '|')[:160]} |"
            )
    ort_fail = collections.Counter(message_group(r["ort"]) for r in records if r["ort"]["outcome"] != "pass")
    lines += [
        "",
        "## Cases onnxruntime does not pass (not counted)",
        "",
        "| count | onnxruntime's error |",
        "|---|---|",
    ]
    lines += [f"| {n} | {m.replace('|', chr(92) + '|')} |" for m, n in ort_fail.most_common(15)]
    return "\n".join(lines) + "\n"


def _onnx_version() -> str:
    import onnx

    return onnx.__version__


def _ort_version() -> str:
    try:
        import onnxruntime

        return onnxruntime.__version__
    except ImportError:
        return "(not installed)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--sample", type=int, default=None, help="a fixed random sample of N cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default=None, help="only the cases of these ops (comma-separated)")
    ap.add_argument("--cases", default=None, help="only these cases (comma-separated names)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (only 1 is implemented)")
    ap.add_argument(
        "--timeout", type=float, default=60.0, help="seconds per case and phase before it counts as a crash"
    )
    ap.add_argument("--out", default="benchmarks/conformance.md")
    ap.add_argument("--json", action="store_true", help="also write the per-case records next to --out (.json)")
    ap.add_argument(
        "--merge", default=None, help="a previous --json file: its records for the cases not run now go into the report"
    )
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main()
    if a.jobs != 1:
        print("conformance: --jobs other than 1 is not implemented; running with one worker", file=sys.stderr)
    cases = all_cases()
    names = select(
        cases, a.ops.split(",") if a.ops else None, a.sample, a.seed, a.cases.split(",") if a.cases else None
    )
    t0 = time.perf_counter()

    def progress(k, n, rec):
        kr = rec["kiln"]
        fr = f" freeze={rec['freeze']['outcome']}" if "freeze" in rec else ""
        print(
            f"[{k + 1}/{n} {time.perf_counter() - t0:.0f}s] {rec['name']}: ort={rec['ort']['outcome']} "
            f"kiln={kr['outcome']}{fr} {kr.get('type', '')} {(kr.get('detail') or '')[:150]}",
            flush=True,
        )

    records = run_cases(names, cases, a.timeout, progress)
    if a.merge:
        done = {r["name"] for r in records}
        old = [
            r for r in json.loads(Path(a.merge).read_text())["records"] if r["name"] not in done and r["name"] in cases
        ]
        order = {n: i for i, n in enumerate(cases)}
        records = sorted(records + old, key=lambda r: order[r["name"]])
    seconds = time.perf_counter() - t0
    command = "python -m benchmarks.conformance " + " ".join(argv if argv is not None else sys.argv[1:])
    from kiln._io import atomic_write_text

    out = Path(a.out)
    atomic_write_text(out, markdown(records, command.strip(), seconds))
    if a.json:
        atomic_write_text(
            out.with_suffix(".json"),
            json.dumps({"command": command, "totals": totals(records), "records": records}, indent=1),
        )
    print(json.dumps(totals(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
