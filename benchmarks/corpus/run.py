"""Compiles every corpus model with Kiln's default options, checks it against onnxruntime and times both.

The corpus (export.py) is what Kiln's users bring: ONNX files from real exporters. This is the yardstick: for
each model, in a fresh subprocess of Kiln's venv (one model cannot take the next one down, and a hang is cut
by a timeout), `kiln.compile` with default options (input_shapes only for inputs with symbolic dims, pinned to
the recorded input), `kiln.load(out).run(feed)` on the fixed input export.py saved, onnxruntime on the same
input. Pass: every output within |kiln - ort| <= 1e-4 * max(1, max|ort|) + 1e-3 * |ort| (integer outputs
exactly, shapes equal); a model that quantizes activations at run time (DynamicQuantizeLinear) also passes
within twice onnxruntime's own output change under 1e-6 relative input noise (within_sensitivity: one
rounding flip there moves every later layer); otherwise mismatch; a raised exception is an error (KilnError
class and the first line of its message, or the exception). An error or mismatch is compiled again with
layout="NCHW", to learn whether the default layout passes cause it. Timing: Kiln and onnxruntime (2 threads
each) alternate in blocks of runs with a pause between blocks (both thread pools spin after a run; see
kiln.runtime.bench), medians.

    .venv/bin/python benchmarks/corpus/run.py [--corpus build/corpus] [--only a,b] [--out benchmarks/corpus]
    .venv/bin/python benchmarks/corpus/run.py --one NAME [--layout NCHW]   # one model, in this process

Writes OUT.md (CPU, command, date, the table) and OUT.json (every record).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kiln.runtime.hostinfo import cpu_model_name

ROOT = Path(__file__).resolve().parents[2]
THREADS = 2
COMPILE_TIMEOUT_S = 600
RUN_TIMEOUT_S = 300  # loading, checking and timing after the compile
TIME_BUDGET_S = 3.0  # per engine, for the timed runs
BLOCK, PAUSE_S = 8, 0.3
RTOL, ATOL = 1e-3, 1e-4


def error_text(e: BaseException) -> tuple[str, str]:
    """(class, first line of the message) of an exception, KilnErrors included."""
    msg = str(e).strip().splitlines()
    return type(e).__name__, (msg[0][:400] if msg else "")


def quant_steps(model_path) -> list[float]:
    """Per graph output: the scale of the DequantizeLinear that produces it (0 if none). Two int8 engines
    may round a tie differently: such an output may differ by one quantization step (onnxruntime's own
    kernels differ by as much between its VNNI and non-VNNI paths)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name: i for i in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    steps = []
    for o in m.graph.output:
        n = producer.get(o.name)
        scale = inits.get(n.input[1]) if n is not None and n.op_type == "DequantizeLinear" else None
        steps.append(float(np.max(numpy_helper.to_array(scale))) if scale is not None else 0.0)
    return steps


def compare(ours: list[np.ndarray], ref: list[np.ndarray], steps: list[float] | None = None) -> dict:
    """Output-by-output check: shapes equal, integers exact, floats within the scale-aware tolerance (plus
    one quantization step for an output a DequantizeLinear makes: see quant_steps)."""
    worst, max_abs, why = 0.0, 0.0, ""
    if len(ours) != len(ref):
        return {"ok": False, "why": f"{len(ours)} outputs, onnxruntime has {len(ref)}"}
    for i, (k, r) in enumerate(zip(ours, ref)):
        k, r = np.asarray(k), np.asarray(r)
        if k.shape != r.shape:
            return {"ok": False, "why": f"output {i}: shape {list(k.shape)} vs onnxruntime {list(r.shape)}"}
        if r.size == 0:
            continue
        if r.dtype.kind in "iub":
            bad = int(np.count_nonzero(k != r))
            if bad:
                return {"ok": False, "why": f"output {i} ({r.dtype}): {bad}/{r.size} elements differ"}
            continue
        k64, r64 = k.astype(np.float64), r.astype(np.float64)
        both_nan = np.isnan(k64) & np.isnan(r64)
        diff = np.where(both_nan, 0.0, np.abs(k64 - r64))
        finite = np.isfinite(r64)
        scale = max(1.0, float(np.abs(r64[finite]).max()) if finite.any() else 1.0)
        tol = ATOL * scale + RTOL * np.abs(np.where(finite, r64, 0.0)) + (1.01 * steps[i] if steps else 0.0)
        ratio = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff / tol)))
        max_abs = max(max_abs, float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))))
        if ratio > worst:
            worst = ratio
            if ratio > 1:
                why = (
                    f"output {i}: max |diff| {float(np.nanmax(diff)):.3g} (max|ort| {scale:.3g}), "
                    f"{ratio:.3g}x the tolerance"
                )
    return {"ok": worst <= 1.0, "max_abs_diff": max_abs, "worst_over_tol": worst, "why": why}


DYNAMIC_QUANT = {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"}
# relative input noise: a few float32 ulps, the size of the rounding differences that different summation
# orders leave in a float layer's output; at 1e-7 most draws moved no value across a rounding boundary
# of ddddocr_common_old's first run-time quantization (the output moved 0, then 0.135 on another draw)
SENSITIVITY_EPS = 1e-6
SENSITIVITY_FACTOR = 2.0


def runtime_quantized(path: Path) -> bool:
    """Whether the model quantizes activations at run time (onnxruntime's quantize_dynamic): a float
    rounding difference before one of those ops can move a value across a rounding boundary, and the
    one-step change then propagates through every later layer."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return any(n.op_type in DYNAMIC_QUANT for n in m.graph.node)


def within_sensitivity(check: dict, sess, feed: dict, seeds: int = 5) -> dict:
    """For a run-time-quantized model that missed the tolerance: onnxruntime's own output change when its
    inputs move by a few float32 ulps (relative noise SENSITIVITY_EPS, the largest over `seeds` draws).
    Kiln passes when its difference is at most SENSITIVITY_FACTOR times that: the model cannot be matched
    closer by any engine that rounds one float differently. A difference far beyond the model's own fails."""
    base = sess.run(None, feed)
    sens = 0.0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        noisy = {
            k: (v * (1 + SENSITIVITY_EPS * rng.standard_normal(v.shape))).astype(v.dtype) if v.dtype.kind == "f" else v
            for k, v in feed.items()
        }
        for a, b in zip(sess.run(None, noisy), base):
            if np.asarray(b).dtype.kind == "f" and np.asarray(b).size:
                sens = max(sens, float(np.abs(np.asarray(a, np.float64) - b).max()))
    ok = check["max_abs_diff"] <= SENSITIVITY_FACTOR * sens
    why = (
        f"{check['why']}; onnxruntime's own output moves {sens:.3g} when its input moves by a few float32 ulps "
        f"({SENSITIVITY_EPS:g} relative): {'within' if ok else 'beyond'} {SENSITIVITY_FACTOR:g}x that"
    )
    return {**check, "ok": ok, "why": why, "ort_sensitivity": sens}


def time_both(kiln_fn, ort_fn) -> tuple[float, float, int]:
    """Medians (ms) of Kiln and onnxruntime, alternating blocks of BLOCK runs, a pause and an untimed run
    before each block so neither engine's spinning workers steal cores from the other."""
    for _ in range(3):
        kiln_fn()
        ort_fn()
    times = {"k": [], "o": []}
    t0 = time.perf_counter()
    kiln_fn()
    per_run = max(time.perf_counter() - t0, 1e-4)
    n = int(min(64, max(BLOCK, TIME_BUDGET_S / per_run)))
    while len(times["k"]) < n:
        for key, fn in (("k", kiln_fn), ("o", ort_fn)):
            time.sleep(PAUSE_S)
            fn()
            for _ in range(BLOCK):
                t = time.perf_counter()
                fn()
                times[key].append((time.perf_counter() - t) * 1e3)
    return float(np.median(times["k"])), float(np.median(times["o"])), len(times["k"])


def one(corpus: Path, name: str, layout: str | None, record: Path) -> None:
    """Compile, run, check and time one model in this process; the record file is rewritten after each
    phase, so a parent that had to kill this process still learns how far it got."""
    rec: dict = {"model": name, "layout": layout or "default", "phase": "start"}

    def save(**kw):
        rec.update(kw)
        record.write_text(json.dumps(rec))

    import onnx
    import onnxruntime as ort

    import kiln

    path = corpus / f"{name}.onnx"
    feed = dict(np.load(corpus / f"{name}.inputs.npz"))
    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    shapes = []
    for inp in m.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if inp.name not in inits and any(not d.HasField("dim_value") for d in dims):
            shapes.append(f"{inp.name}:{'x'.join(map(str, feed[inp.name].shape))}")
    rec["input_shapes"] = shapes
    del m
    save(phase="compile")
    art = corpus / "kiln" / f"{name}{'.' + layout if layout else ''}.kiln"  # kept, to reproduce a failure
    art.parent.mkdir(exist_ok=True)
    rec["artifact"] = str(art)
    kw = {"input_shapes": shapes} if shapes else {}
    if layout:
        kw["layout"] = layout
    t = time.perf_counter()
    try:
        res = kiln.compile(str(path), str(art), **kw)
    except BaseException as e:
        cls, msg = error_text(e)
        save(
            phase="compile",
            status="error",
            error_class=cls,
            error=msg,
            kiln_error=isinstance(e, kiln.KilnError),
            compile_s=round(time.perf_counter() - t, 1),
        )
        return
    skipped = [f"{x['failed_in']}: {x['error'][:120]}" for x in res.report.get("passes_skipped", [])]
    save(
        phase="run",
        compile_s=round(time.perf_counter() - t, 1),
        passes_skipped=skipped,
        kernels_unscheduled=res.report.get("kernels_unscheduled"),
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = THREADS, 1
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        ort_names = [o.name for o in sess.get_outputs()]
        ref = sess.run(None, feed)
    except Exception as e:
        cls, msg = error_text(e)
        save(status="ort-error", error_class=cls, error=msg)
        return
    try:
        model = kiln.load(str(art), num_threads=THREADS)
        outs = model.run(feed)
    except BaseException as e:
        cls, msg = error_text(e)
        save(phase="run", status="error", error_class=cls, error=msg, kiln_error=isinstance(e, kiln.KilnError))
        return
    ours = [outs[n] for n in ort_names] if set(ort_names) <= set(outs) else list(outs.values())
    check = compare(ours, ref, quant_steps(path))
    if not check["ok"] and runtime_quantized(path):
        check = within_sensitivity(check, sess, feed)
    save(phase="time", status="pass" if check["ok"] else "mismatch", check=check)
    kiln_ms, ort_ms, runs = time_both(lambda: model.run(feed), lambda: sess.run(None, feed))
    save(
        phase="done",
        kiln_p50_ms=round(kiln_ms, 3),
        ort_p50_ms=round(ort_ms, 3),
        ratio=round(kiln_ms / ort_ms, 2),
        runs=runs,
    )


def run_child(corpus: Path, name: str, layout: str | None, timeout_s: int, src: Path | None = None) -> dict:
    """One model in a fresh subprocess of this interpreter (Kiln's venv); a timeout or crash becomes an error.
    With src, the subprocess imports Kiln from that tree (--kiln-rev) instead of the working tree."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        record = Path(f.name)
    cmd = [sys.executable, __file__, "--corpus", str(corpus), "--one", name, "--record", str(record)]
    if layout:
        cmd += ["--layout", layout]
    t = time.perf_counter()
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(src or ""), os.environ.get("PYTHONPATH")])))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
        tail = (p.stderr or "").strip().splitlines()[-3:]
        rc = p.returncode
    except subprocess.TimeoutExpired:
        tail, rc = [], None
    try:
        rec = json.loads(record.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        rec = {}
    record.unlink(missing_ok=True)
    rec.setdefault("model", name)
    rec["wall_s"] = round(time.perf_counter() - t, 1)
    if rc is None and rec.get("phase") == "time" and rec.get("status") in ("pass", "mismatch"):
        # compiled and checked against onnxruntime; only the timing ran out: the status stands, p50s unknown
        rec["timing"] = f"timing did not finish within the {timeout_s} s limit"
    elif rc is None:
        rec.update(
            status="error",
            error_class="Timeout",
            error=f"no result after {timeout_s} s in phase {rec.get('phase', 'start')}",
        )
    elif "status" not in rec or (rc != 0 and rec.get("phase") != "done"):
        rec.update(
            status="error",
            error_class=rec.get("error_class") or f"Crash (exit {rc})",
            error=rec.get("error") or (tail[-1][:400] if tail else ""),
        )
    return rec


def kiln_state() -> str:
    """The commit Kiln ran at and whether kiln/ had uncommitted changes (the tree is shared with the engineers
    fixing the compiler: a table is only as good as the code it measured)."""

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    dirty = git("status", "--porcelain", "--", "kiln")
    head = git("rev-parse", "--short", "HEAD")
    return head + (f" + uncommitted changes in {len(dirty.splitlines())} kiln/ files" if dirty else "")


def export_rev(rev: str, corpus: Path) -> tuple[Path, str]:
    """A committed revision's kiln/ and tuning_logs/ (git archive) to import Kiln from: the working tree is
    shared with engineers editing the compiler, and a half-saved file there is not a result about Kiln."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.strip()
    src = corpus / "kiln-src" / sha
    if not (src / "kiln" / "__init__.py").exists():
        src.mkdir(parents=True, exist_ok=True)
        tar = subprocess.run(
            ["git", "archive", sha, "kiln", "tuning_logs"], capture_output=True, cwd=ROOT, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=tar, check=True)
    return src, f"{sha} (committed tree via --kiln-rev {rev}; uncommitted changes not included)"


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def write_report(out: Path, records: list[dict], manifest: dict, command: str, started: str, state: str) -> None:
    from report import table

    import kiln
    from kiln._io import atomic_write_text

    n = len(records)
    counts = {
        s: sum(r["status"] == s for r in records) for s in ("pass", "mismatch", "error", "ort-error", "export-error")
    }
    rows = []
    for r in records:
        meta = manifest.get(r["model"], {})
        err = ""
        if r["status"] in ("error", "ort-error", "export-error"):
            msg = re.sub(r"^\S+\.(onnx|kiln): ", "", r.get("error") or "")  # the file is in the model column
            err = f"{r.get('error_class', '')}: {msg[:220]}"
        elif r["status"] == "mismatch" or "ort_sensitivity" in r.get("check", {}):  # or passed by sensitivity
            err = r.get("check", {}).get("why", "")
        if r.get("timing"):
            err += ("; " if err else "") + r["timing"]
        if r.get("passes_skipped"):  # an optional pass that failed: the artifact is correct, maybe slower
            err += ("; " if err else "") + "passes skipped: " + "; ".join(r["passes_skipped"])
        nchw = r.get("nchw")
        if nchw:
            err += (
                f" [layout=NCHW: {nchw['status']}"
                + (f", {nchw.get('error_class')}" if nchw["status"] == "error" else "")
                + "]"
            )
        exporter = meta.get("exporter", "")
        opset = meta.get("opset", {}).get("ai.onnx", "")
        fmt = lambda v: "" if v is None else f"{v:g}"
        rows.append(
            [
                r["model"],
                cell(meta.get("source", "")),
                cell(f"{exporter}, opset {opset}" if opset else exporter),
                r["status"],
                cell(err[:300]),
                fmt(r.get("compile_s")),
                fmt(r.get("kiln_p50_ms")),
                fmt(r.get("ort_p50_ms")),
                fmt(r.get("ratio")),
            ]
        )
    lines = [
        f"# Kiln corpus: {n} exported models",
        "",
        f"CPU: {cpu_model_name()} ({os.cpu_count()} logical CPUs); Kiln {kiln.__version__}, "
        f"onnxruntime {__import__('onnxruntime').__version__}; {THREADS} threads each.",
        f"Command: `{command}`; started {started}, finished "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}; Kiln at {state}.",
        "",
        f"**{counts['pass']} pass, {counts['mismatch']} mismatch, {counts['error']} error**"
        + (f", {counts['ort-error']} onnxruntime error" if counts["ort-error"] else "")
        + (f", {counts['export-error']} export error" if counts["export-error"] else "")
        + f" (of {n}). Pass: every output within |kiln - ort| <= {ATOL:g} * max(1, max|ort|) + {RTOL:g} * |ort|, "
        "integer outputs exact; run-time-quantized models (DynamicQuantizeLinear) also within 2x onnxruntime's "
        "own output change under 1e-6 relative input noise (the notes column says which). "
        "Errors and mismatches were compiled again with layout=NCHW (in brackets). "
        "Kiln default options (layout NCHWc, the shipped tuning records); input_shapes only for symbolic dims. "
        "p50: medians of alternating blocks, 2 threads each; ratio = kiln / ort.",
        "",
        "Rebuild: `make corpus` (exports into build/corpus with .venv-corpus, then this table). "
        "One model: `.venv/bin/python benchmarks/corpus/run.py --one NAME [--layout NCHW]` (the artifact and a "
        "failing compile's repro.onnx land in build/corpus/kiln/); at the revision this table measured, with "
        "--kiln-rev: prefix `PYTHONPATH=build/corpus/kiln-src/SHA`. Latencies here come from a long run, on a "
        "machine that may have been shared (both engines slow down when another process takes a core; "
        "benchmarks/contention.md); the quiet-machine ratios are in benchmarks/corpus_speed.md "
        "(benchmarks/corpus/speed.py).",
        "",
    ]
    lines += table(
        [
            "model",
            "source",
            "exporter",
            "status",
            "error class: message",
            "compile s",
            "kiln p50 ms",
            "ort p50 ms",
            "ratio",
        ],
        rows,
    )
    data = {
        "cpu": cpu_model_name(),
        "command": command,
        "started": started,
        "kiln": state,
        "counts": counts,
        "records": records,
        "manifest": manifest,
    }
    atomic_write_text(out.with_suffix(".json"), json.dumps(data, indent=2))
    atomic_write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT / "build" / "corpus"))
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "corpus"))
    ap.add_argument("--one", help="run one model in this process (what each subprocess does)")
    ap.add_argument("--layout", default=None)
    ap.add_argument("--record", default=None)
    ap.add_argument("--no-retry", action="store_true", help="do not compile failures again with layout=NCHW")
    ap.add_argument("--report-only", action="store_true", help="write OUT.md again from OUT.json")
    ap.add_argument(
        "--kiln-rev",
        default=None,
        help="measure this committed revision of Kiln (git archive) instead of the working tree",
    )
    ap.add_argument(
        "--merge", action="store_true", help="with --only: replace those models' records in OUT.json, keep the others"
    )
    a = ap.parse_args(argv)
    corpus = Path(a.corpus)
    if a.one:
        record = Path(a.record) if a.record else Path(tempfile.mkstemp(suffix=".json")[1])
        one(corpus, a.one, a.layout, record)
        if not a.record:
            print(json.dumps(json.loads(record.read_text()), indent=2))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    if a.report_only:
        d = json.loads(Path(a.out).with_suffix(".json").read_text())
        write_report(Path(a.out), d["records"], d["manifest"], d["command"], d["started"], d.get("kiln", kiln_state()))
        return 0
    started = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M UTC}"
    command = "python benchmarks/corpus/run.py" + "".join(f" {x}" for x in (argv or sys.argv[1:]))
    manifest = json.loads((corpus / "manifest.json").read_text())
    only = set(filter(None, a.only.split(",")))
    state = kiln_state()
    src = None
    if a.kiln_rev:
        src, state = export_rev(a.kiln_rev, corpus)
    earlier = {}
    if a.merge and Path(a.out).with_suffix(".json").exists():
        d = json.loads(Path(a.out).with_suffix(".json").read_text())
        earlier, command, started = {r["model"]: r for r in d["records"]}, d["command"], d["started"]
        state = f"{d.get('kiln', '?')}; {a.only} rerun at {state}"
        command += f"; then {'python benchmarks/corpus/run.py' + ''.join(f' {x}' for x in (argv or sys.argv[1:]))}"
    done: dict[str, dict] = {}

    def merged() -> list[dict]:
        """Every record so far in manifest order: with --merge the earlier rows stay in each partial write, so an
        interrupted rerun of a few models never drops the others from the table."""
        return [done.get(n) or earlier[n] for n in manifest if n in done or n in earlier]

    for name, meta in manifest.items():
        if only and name not in only:
            continue
        if meta.get("status") != "ok":
            rec = {
                "model": name,
                "status": "export-error",
                "error_class": "ExportError",
                "error": meta.get("error", ""),
            }
        else:
            rec = run_child(corpus, name, a.layout, COMPILE_TIMEOUT_S + RUN_TIMEOUT_S, src)
            if rec["status"] in ("error", "mismatch") and not a.no_retry and not a.layout:
                alt = run_child(corpus, name, "NCHW", COMPILE_TIMEOUT_S + RUN_TIMEOUT_S, src)
                rec["nchw"] = {
                    k: alt.get(k)
                    for k in ("status", "error_class", "error", "compile_s", "check", "kiln_p50_ms", "ort_p50_ms")
                }
        rec["onnx"] = str(
            (corpus / f"{name}.onnx").relative_to(ROOT)
            if (corpus / f"{name}.onnx").is_relative_to(ROOT)
            else corpus / f"{name}.onnx"
        )
        done[name] = rec
        print(
            json.dumps(
                {
                    k: rec.get(k)
                    for k in (
                        "model",
                        "status",
                        "error_class",
                        "error",
                        "compile_s",
                        "passes_skipped",
                        "kernels_unscheduled",
                        "kiln_p50_ms",
                        "ort_p50_ms",
                        "wall_s",
                    )
                }
                | ({"nchw": rec["nchw"]["status"]} if "nchw" in rec else {})
            ),
            file=sys.stderr,
            flush=True,
        )
        write_report(Path(a.out), merged(), manifest, command, started, state)  # partial results survive a kill
    write_report(Path(a.out), merged(), manifest, command, started, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
