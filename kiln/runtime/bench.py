"""`kiln bench`: latency percentiles, QPS, cold start and peak RSS of an artifact, optionally beside
onnxruntime on the same input. The two alternate in blocks of runs, with a pause and one untimed
run before each block, so machine drift hits both equally while neither engine's idle-spinning worker threads
(both thread pools spin for a while after each run) steal cores from the other: alternating run
by run made both engines several times slower than either alone (benchmarks/history.md).
onnxruntime is imported only when asked for (it is never a runtime dependency)."""

from __future__ import annotations

import dataclasses
import os
import resource
import time

import numpy as np

from ..errors import InputError, OptionsError
from ..optfield import option
from .model import load

BLOCK = 8  # runs per engine before switching (when comparing with onnxruntime), and at least BLOCK_MIN_S of them
BLOCK_MIN_S = 0.05  # 8 runs of a fast model after each pause were mostly its wake-up (benchmarks/history.md)
BLOCK_PAUSE_S = 0.3  # a shorter pause left onnxruntime slower (spinning TVM workers; benchmarks/history.md)
TAIL_FLAG_RATIO = 2.0  # p99 over p50 above this flags the run: its tail is not the model's speed
SPELL_WINDOW_S = 1.0  # runs are cut into windows of this much of their own time to find a slow spell
SPELL_RATIO = 1.3  # the slowest window's median over the fastest's above this: the machine changed speed


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """`kiln bench`'s options; the flagged fields are its command-line flags (kiln/cli/measure.py)."""

    threads: int | None = option(None, "default: physical cores", type=int)
    warmup: int = option(5, "untimed runs first")
    repeat: int | None = option(None, "number of timed runs (instead of --seconds)", type=int)  # None: `seconds`
    seconds: float = option(10.0, "time budget for timed runs")
    onnx: str | None = option(None, "also run onnxruntime on the same input, alternating", metavar="MODEL.onnx")
    inputs: str | None = option(
        None, "run on these inputs (an .npz of input name -> array); default: random ones", metavar="IN.npz"
    )
    trusted_keys: tuple | None = None

    def __post_init__(self):
        if self.warmup < 0 or (self.repeat is not None and self.repeat < 1) or self.seconds <= 0:
            raise OptionsError(
                "warmup must be >= 0, repeat >= 1 and seconds > 0",
                where="kiln bench",
                fix="e.g. --warmup 5 --repeat 100",
            )


def percentiles(ms: list[float], prefix: str = "") -> dict:
    """Latency percentiles, the worst run, and the tail: p99 over p50, flagged above TAIL_FLAG_RATIO
    (a tail that long comes from the machine or the runtime, not from the model's kernels)."""
    a = np.asarray(ms)
    p50, p99 = float(np.percentile(a, 50)), float(np.percentile(a, 99))
    ratio = p99 / p50 if p50 > 0 else float("inf")
    return {
        f"{prefix}p50_ms": p50,
        f"{prefix}p90_ms": float(np.percentile(a, 90)),
        f"{prefix}p99_ms": p99,
        f"{prefix}mean_ms": float(a.mean()),
        f"{prefix}min_ms": float(a.min()),
        f"{prefix}max_ms": float(a.max()),
        f"{prefix}qps": float(1e3 / a.mean()),
        f"{prefix}p99_over_p50": ratio,
        f"{prefix}tail_flag": bool(ratio > TAIL_FLAG_RATIO),
        f"{prefix}spell": spell(ms),
    }


def spell(ms: list[float], window_s: float = SPELL_WINDOW_S) -> float:
    """The slowest window's median latency over the fastest's, windows of window_s of consecutive runs (at
    least 3 runs each; 1.0 with fewer than two). A slow spell (another guest on the same physical core, a
    clock change) slows every run for seconds, which scattered slow runs (preemption, page faults) do not:
    on a shared 2-vCPU host, windows at 0.9x and 1.8x a model's p50 for 4-14 s at a time
    (benchmarks/tail.md), all of it in the p99."""
    meds = [float(np.median(w)) for w in windows(ms, window_s).values()]
    return max(meds) / min(meds) if len(meds) > 1 else 1.0


def windows(ms: list[float], window_s: float) -> dict[int, np.ndarray]:
    """Consecutive runs grouped by the window_s of their own time they fall in (run i in window
    floor(sum of runs 0..i / window_s)), keyed by that window's index; windows of fewer than 3 runs left out."""
    a = np.asarray(ms)
    if not a.size:
        return {}
    cut = np.floor(np.cumsum(a) / (window_s * 1e3)).astype(int)
    starts = np.flatnonzero(np.diff(cut)) + 1  # cut never decreases: each window is one slice
    return {int(cut[i]): w for i, w in zip([0, *starts], np.split(a, starts)) if w.size >= 3}


def slow_runs(ms: list[float], switches: list[int], prefix: str = "") -> dict:
    """How many runs took over TAIL_FLAG_RATIO times the median, and how many of those the kernel
    preempted (an involuntary context switch of some thread of this process during the run): the
    cause benchmarks/tail.py measured for such runs on a busy machine."""
    a, c = np.asarray(ms), np.asarray(switches)
    slow = a > TAIL_FLAG_RATIO * float(np.median(a))
    return {
        f"{prefix}slow_runs": int(slow.sum()),
        f"{prefix}slow_runs_preempted": int((slow & (c > 0)).sum()),
        f"{prefix}runs_preempted": int((c > 0).sum()),
    }


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _ort_session(path: str, threads: int):
    try:
        import onnxruntime as ort
    except ImportError:
        raise OptionsError(
            "--onnx needs onnxruntime, which is not installed", where="--onnx", fix="pip install onnxruntime"
        ) from None
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _first_run_after_warmup(path, threads, feed, trusted_keys) -> tuple[float, float]:
    """A second load with warmup=True (every bucket run once at load time): the first real run's
    latency then, and what the warm-up cost at load."""
    t = time.perf_counter()
    m = load(path, num_threads=threads, warmup=True, trusted_keys=trusted_keys)
    warmup_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    m.run(feed)
    return (time.perf_counter() - t) * 1e3, warmup_ms


def random_inputs(specs) -> dict:
    """Normal floats; integers and booleans in {0, 1}, valid for every index-like input (token ids, token
    types, masks, positions) whatever the table's size: a Gather of 0..9 into a 2-row token-type table
    fails in onnxruntime (and reads out of bounds in any engine that does not check)."""
    rng = np.random.default_rng(0)
    return {
        s.name: (rng.standard_normal(s.shape) if np.dtype(s.dtype).kind == "f" else rng.integers(0, 2, s.shape)).astype(
            s.dtype
        )
        for s in specs
    }


def read_inputs(path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise OptionsError(
            f"cannot read inputs file: {e}", where=path, fix="give an .npz whose keys are the model's input names"
        ) from None


def _ort_accepts(sess, feed: dict, opts: BenchOptions) -> None:
    """onnxruntime's verdict on the inputs before any timing: a rejection is about the inputs, not Kiln."""
    try:
        sess.run(None, feed)
    except Exception as e:
        msg = str(e).strip().splitlines()
        raise InputError(
            f"onnxruntime rejected the {'given' if opts.inputs else 'random'} inputs: {msg[-1][:300] if msg else e}",
            where=opts.onnx,
            fix="pass real inputs with --inputs IN.npz (input name -> array), e.g. token ids within the vocabulary",
        ) from None


def feed_for(model, inputs: str | None) -> dict:
    """The inputs a measuring command runs on: the --inputs file's, or random ones of the model's shapes."""
    return read_inputs(inputs) if inputs else random_inputs(model.inputs)


def first_run(model, feed: dict, random: bool) -> None:
    """One run through Model.run, which rejects inputs the model does not accept (a compiled If whose other branch
    random values select: silero VAD's sample rate) with an InputError; for random inputs the fix is --inputs."""
    try:
        model.run(feed)
    except InputError as e:
        if not random:
            raise
        raise InputError(
            f"the random inputs were rejected: {e.what}",
            where=e.where,
            fix="pass inputs the model accepts with --inputs IN.npz (input name -> array)",
        ) from None


def bench(path: str | os.PathLike, opts: BenchOptions = BenchOptions(), feed: dict | None = None) -> dict:
    t0 = time.perf_counter()
    model = load(path, num_threads=opts.threads, trusted_keys=opts.trusted_keys)
    random = feed is None and not opts.inputs
    feed = feed_for(model, opts.inputs) if feed is None else feed
    t1 = time.perf_counter()
    first_run(model, feed, random)
    first_ms = (time.perf_counter() - t1) * 1e3
    cold_ms = (time.perf_counter() - t0) * 1e3
    rss_mb = _peak_rss_mb()  # before onnxruntime and the second load below: one model's footprint
    first_warm_ms, warmup_ms = _first_run_after_warmup(path, opts.threads, feed, opts.trusted_keys)
    sess = _ort_session(opts.onnx, model.num_threads) if opts.onnx else None
    runners = [("", lambda: model.run(feed))]
    if sess is not None:
        _ort_accepts(sess, feed, opts)
        runners.append(("ort_", lambda: sess.run(None, feed)))
    for _ in range(opts.warmup):
        for _, fn in runners:
            fn()
    times: dict[str, list[float]] = {p: [] for p, _ in runners}
    switches: dict[str, list[int]] = {p: [] for p, _ in runners}  # involuntary context switches during each run
    blocks: dict[str, list[int]] = {p: [] for p, _ in runners}  # where each block of runs starts in times[p]
    start = time.perf_counter()

    def more() -> bool:
        if opts.repeat:
            return len(times[""]) < opts.repeat
        return time.perf_counter() - start < opts.seconds or len(times[""]) < 3

    while more():
        for prefix, fn in runners:
            if len(runners) > 1:
                time.sleep(BLOCK_PAUSE_S)  # let the other engine's spinning workers park
                fn()  # untimed: wakes this engine's parked workers
            blocks[prefix].append(len(times[prefix]))
            block_start, done = time.perf_counter(), 0
            while done < BLOCK or time.perf_counter() - block_start < BLOCK_MIN_S:
                if prefix == "" and not more():
                    break
                done += 1
                c = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw  # every thread of the process: the pool's too
                t = time.perf_counter()
                fn()
                times[prefix].append((time.perf_counter() - t) * 1e3)
                switches[prefix].append(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - c)
    n = len(times[""])
    if "ort_" in times:
        times["ort_"] = times["ort_"][:n] or times["ort_"]
        switches["ort_"] = switches["ort_"][: len(times["ort_"])]
    result = {
        "artifact": str(path),
        "target": model.manifest["target"],
        "threads": model.num_threads,
        "runs": len(times[""]),
        "warmup": opts.warmup,
        **percentiles(times[""]),
        **slow_runs(times[""], switches[""]),
        "cold_start_ms": cold_ms,
        "peak_rss_mb": rss_mb,
        "first_run_ms": first_ms,
        "first_run_after_warmup_ms": first_warm_ms,
        "warmup_ms": warmup_ms,
        "latencies_ms": times[""],
    }
    if sess is not None:
        result.update(percentiles(times["ort_"], "ort_"))
        result.update(slow_runs(times["ort_"], switches["ort_"], "ort_"))
        result["ratio_p50"] = result["p50_ms"] / result["ort_p50_ms"]
        result.update(block_ratios(times, blocks))
        result["ort_latencies_ms"] = times["ort_"]
        ref = sess.run(None, feed)
        ours = model.run(feed)
        result["max_abs_diff"] = max(_abs_diff(ours[o.name], r) for o, r in zip(model.outputs, ref))
    return result


def _abs_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    """Largest |ours - ref|: 0 for two empty outputs (a detector that found nothing), inf for different
    shapes (which broadcasting would otherwise hide)."""
    ref = np.asarray(ref)
    if ours.shape != ref.shape:
        return float("inf")
    return float(np.abs(ours.astype(np.float64) - ref).max()) if ours.size else 0.0


def block_ratios(times: dict, blocks: dict) -> dict:
    """Kiln's median over onnxruntime's for each pair of adjacent blocks (run in the same few hundred
    milliseconds, so drift hits both): the spread of these says how far to trust ratio_p50."""

    def medians(p):
        n = len(times[p])  # onnxruntime's runs are cut to Kiln's count: a block may start past the end
        starts = [min(s, n) for s in blocks[p]] + [n]
        return [float(np.median(times[p][a:b])) if b > a else None for a, b in zip(starts, starts[1:])]

    # an empty block (time ran out at its start, or cut off) drops its pair, not the pairing of the rest
    ratios = [k / o for k, o in zip(medians(""), medians("ort_")) if k is not None and o is not None]
    if not ratios:
        return {}
    q25, q50, q75 = (float(v) for v in np.percentile(ratios, [25, 50, 75]))
    return {"ratio_block_pairs": len(ratios), "ratio_block_q25": q25, "ratio_block_median": q50, "ratio_block_q75": q75}


def format_bench(r: dict) -> str:
    lines = [
        f"{r['artifact']} on {r['target']}, {r['threads']} thread(s), {r['runs']} runs after {r['warmup']} warm-up",
        f"  kiln         p50 {r['p50_ms']:9.3f} ms  p90 {r['p90_ms']:9.3f}  p99 {r['p99_ms']:9.3f}  "
        f"mean {r['mean_ms']:9.3f}  min {r['min_ms']:9.3f}  max {r['max_ms']:9.3f}  {r['qps']:8.1f} QPS",
        f"  cold start {r['cold_start_ms']:.1f} ms (load + first run), peak RSS {r['peak_rss_mb']:.1f} MB",
        f"  first run {r['first_run_ms']:.1f} ms without warm-up, {r['first_run_after_warmup_ms']:.1f} ms after "
        f"warm-up (load with warmup: {r['warmup_ms']:.1f} ms)",
    ]
    if "ort_p50_ms" in r:
        lines.insert(
            2,
            f"  onnxruntime  p50 {r['ort_p50_ms']:9.3f} ms  p90 {r['ort_p90_ms']:9.3f}  p99 {r['ort_p99_ms']:9.3f}"
            f"  mean {r['ort_mean_ms']:9.3f}  min {r['ort_min_ms']:9.3f}  max {r['ort_max_ms']:9.3f}"
            f"  {r['ort_qps']:8.1f} QPS",
        )
        lines.append(f"  kiln / onnxruntime p50 = {r['ratio_p50']:.2f}x   max abs diff {r['max_abs_diff']:.3g}")
        if "ratio_block_median" in r:
            lines.append(
                f"  per block pair ({r['ratio_block_pairs']} pairs of {BLOCK} runs): "
                f"median {r['ratio_block_median']:.2f}x, "
                f"middle half {r['ratio_block_q25']:.2f}-{r['ratio_block_q75']:.2f}x"
            )
    lines += tail_lines(r)
    return "\n".join(lines)


def tail_lines(r: dict) -> list[str]:
    """One line per engine whose p99 is more than TAIL_FLAG_RATIO times its p50."""
    out = []
    for prefix, name in (("", "kiln"), ("ort_", "onnxruntime")):
        if r.get(f"{prefix}tail_flag"):
            ratio, worst = r[f"{prefix}p99_over_p50"], r[f"{prefix}max_ms"]
            line = f"  TAIL: {name} p99 is {ratio:.1f}x its p50 (worst run {worst:.1f} ms)"
            if f"{prefix}slow_runs" in r:
                line += (
                    f"; {r[f'{prefix}slow_runs']} run(s) over {TAIL_FLAG_RATIO:g}x p50, "
                    f"{r[f'{prefix}slow_runs_preempted']} of them preempted by another process "
                    "(see benchmarks/tail.md)"
                )
            if r.get(f"{prefix}spell", 1.0) > SPELL_RATIO:
                line += (
                    f"; the machine slowed for whole seconds (slowest {SPELL_WINDOW_S:g} s of runs "
                    f"{r[f'{prefix}spell']:.1f}x the fastest): rerun on a quiet machine before blaming the model"
                )
            out.append(line)
    return out
