"""`kiln profile` / `kiln bench --profile`: where an artifact's milliseconds go, kernel by kernel,
against this CPU's roofline: what a person reads before optimizing (like onnxruntime's profiler
or OpenVINO's `benchmark_app -pc`, with the FMA peak beside each kernel).

Timing: TVM 0.27's Relax VM has no profiler any more (no `profile=True`), so each kernel is timed
by the VM's instrument hook (called before and after every call instruction) on the artifact's own
library, loaded with TVM's runtime only. Runs alternate: one plain run (the latency), one run with
the hook (the kernels), so drift hits both; per kernel the median over the instrumented runs. The
hook costs a few microseconds per call, inside the kernels' times. VM builtins (allocations,
reshapes: not kernels) are summed apart.

Static facts (source ONNX nodes, FLOPs, bytes, tuned or default schedule) come from the manifest's
`kernel_info` (kiln/compiler/kernel_info.py, computed at compile time); an artifact built before it
existed still gets times, without them."""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time

from ..errors import OptionsError
from ..optfield import option
from .bench import SPELL_RATIO, feed_for, first_run, spell
from .model import configure_threads, load, pool_lock
from .peak import fresh_fma_peak, fresh_unit_peak, memory_bandwidth

TOP = 15
# kernel kinds (schedules/kinds.KINDS, as the manifest's kernel_info names them) whose FLOPs are multiply-adds,
# which the FMA peak bounds
MULTIPLY_ADD = frozenset(
    {
        "conv2d",
        "conv2d_nchw",
        "depthwise_nchw",
        "conv3d",
        "matmul",
        "winograd",
        "depthwise_pointwise",
        "bf16_conv",
        "attention",
        "bf16_matmul",
        "fp16_matmul",
        "f32_matmul",
        "f32_conv",
    }
)
NO_PEAK_UNITS = ("amx", "arm-bf16", "arm-fp16")  # units (precision_units.describe) with no measured peak loop yet
UNIT_NAMES = {"bf16": ("GFLOP/s", "vdpbf16ps"), "int8": ("GOP/s", "vpdpbusd")}  # a unit peak's rate and loop
BUILTIN = "vm.builtin."
OVERSTATED = 1.10  # kernels adding up to more than this share of the plain run: the timing itself shows


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    """`kiln profile`'s options; the flagged fields are its command-line flags (kiln/cli/measure.py)."""

    threads: int | None = option(None, "default: physical cores", type=int)
    warmup: int = option(5, "untimed runs first")
    repeat: int = option(50, "profiled runs (as many plain runs alternate, for the latency)")
    top: int = option(TOP, "kernels in the table (--json has all)")
    inputs: str | None = option(
        None, "profile on these inputs (an .npz of input name -> array); default: random ones", metavar="IN.npz"
    )
    trusted_keys: tuple | None = None

    def __post_init__(self):
        if self.warmup < 0 or self.repeat < 1 or self.top < 1:
            raise OptionsError(
                "warmup must be >= 0, repeat >= 1 and top >= 1", where="kiln profile", fix="e.g. --repeat 50 --top 15"
            )


def profile(path: str | os.PathLike, opts: ProfileOptions = ProfileOptions(), feed: dict | None = None) -> dict:
    """Profile the artifact at `path` on `feed` (default: --inputs, else random inputs of the first bucket's
    shapes). The timed runs call the VM's entry directly, so one Model.run first rejects inputs the model does not
    accept as an InputError (not a failure inside the compiled code)."""
    model = load(path, num_threads=opts.threads, trusted_keys=opts.trusted_keys)
    random = feed is None and not opts.inputs
    feed = feed_for(model, opts.inputs) if feed is None else feed
    first_run(model, feed, random)
    arrays = model.validate(feed)
    b = model.select(arrays)
    vm, entry, weights, _ = model._fns[b]  # the VM beside its entry function (kiln.runtime.model)
    tvm = model._tvm
    args = [tvm.runtime.tensor(a, model._dev) for a in arrays]
    per_run: list[dict] = []
    current: dict = {}
    calls: dict = {}
    started: list = []
    clock = time.perf_counter

    def hook(func, name, before, ret, *a):
        if before:
            started.append(clock())
        else:
            t = clock() - started.pop()
            current[name] = current.get(name, 0.0) + t
            calls[name] = calls.get(name, 0) + 1
        return 0

    latencies, instrumented = [], []
    info = (model.manifest.get("buckets") or [{}])[b].get("kernel_info") or {}
    measure = _peak_measures(info)
    # each peak measured before and after the runs, the better kept: a busy spell rarely covers both
    before = {k: f(model.num_threads) for k, f in measure.items()}
    with model._lock, pool_lock:
        configure_threads(tvm, model.num_threads)
        for _ in range(opts.warmup):
            entry(*args, *weights)
        try:
            for _ in range(opts.repeat):
                t = clock()
                entry(*args, *weights)
                latencies.append((clock() - t) * 1e3)
                vm.set_instrument(hook)
                current = {}
                t = clock()
                entry(*args, *weights)
                instrumented.append((clock() - t) * 1e3)
                vm.set_instrument(None)
                per_run.append(current)
        finally:
            vm.set_instrument(None)
    peaks = {k: _best(before[k], f(model.num_threads)) for k, f in measure.items()}
    bandwidth = memory_bandwidth()
    return summarize(
        per_run,
        {k: v // opts.repeat for k, v in calls.items()},
        latencies,
        info,
        peaks["fma"],
        bandwidth,
        {
            "artifact": str(path),
            "target": model.manifest["target"],
            "threads": model.num_threads,
            "bucket": model.buckets[b].name,
            "runs": opts.repeat,
            "warmup": opts.warmup,
            "top": opts.top,
            "latency_ms_instrumented": statistics.median(instrumented),
        },
        unit_peaks={k: v for k, v in peaks.items() if k != "fma"},
    )


def _peak_measures(info: dict) -> dict:
    """The peaks a profile of these kernels needs: the fp32 FMA peak always, a dot-product unit's (peak.UNITS) where
    a kernel runs on it."""
    measure = {"fma": fresh_fma_peak}
    for unit in {_peak_kind(v) for v in info.values()} - {"fma", None}:
        measure[unit] = functools.partial(fresh_unit_peak, unit)
    return measure


def _best(a: dict | None, b: dict | None) -> dict | None:
    return max((q for q in (a, b) if q), key=lambda q: q["gflops"], default=None)


def summarize(
    per_run: list[dict],
    calls: dict,
    latencies: list[float],
    info: dict,
    peak: dict,
    bandwidth: float,
    meta: dict,
    unit_peaks: dict | None = None,
) -> dict:
    """The profile: per kernel the median over runs of its time per run, with the manifest's facts
    and the roofline (peak: the fp32 FMA peak; unit_peaks: "bf16" and "int8" -> the peak of the dot-product unit
    those kernels run on, where measured); sorted by time."""
    peaks = {"fma": peak, **(unit_peaks or {})}
    names = {n for run in per_run for n in run}
    median = {n: statistics.median(run.get(n, 0.0) for run in per_run) * 1e3 for n in names}
    kernels = [n for n in names if not n.startswith(BUILTIN)]
    total = sum(median[n] for n in kernels)
    latency = statistics.median(latencies)
    rows = []
    for n in sorted(kernels, key=lambda n: -median[n]):
        facts = info.get(n, {})
        ms, c = median[n], calls.get(n, 0)
        flops = facts.get("flops", 0) * c if facts else None
        moved = (facts.get("bytes_read", 0) + facts.get("bytes_written", 0)) * c if facts else None
        gflops = flops / ms / 1e6 if flops and ms > 0 else None
        rows.append(
            {
                "kernel": n,
                "ops": facts.get("ops", []),
                "calls": c,
                "ms": ms,
                "share": ms / total if total else 0.0,
                "flops": flops,
                "gflops": gflops,
                **_kernel_peak(facts, gflops, peaks),
                "int8": bool(facts.get("int8")),
                "kind": facts.get("kind"),
                "bytes": moved,
                "gbs": moved / ms / 1e6 if moved and ms > 0 else None,
                "schedule": facts.get("schedule", "unknown"),
            }
        )
    builtins = {n: median[n] for n in names if n.startswith(BUILTIN)}
    hooked = sum(calls.get(n, 0) for n in names)  # kernel and builtin calls per run, each timed by two hooks
    extra = meta.get("latency_ms_instrumented", latency) - latency
    flops_total = sum(r["flops"] or 0 for r in rows)
    return {
        **meta,
        "latency_ms": latency,
        "kernels_ms": total,
        "kernels_share_of_latency": total / latency if latency else None,
        # what timing a call costs: the instrumented run's excess over the plain one, per hooked call
        "instrument_us_per_call": max(extra, 0.0) * 1e3 / hooked if hooked else None,
        "builtins_ms": sum(builtins.values()),
        "builtins": builtins,
        "peak_gflops": peak["gflops"],
        "peak_method": peak["method"],
        "unit_peaks_gflops": {k: v["gflops"] for k, v in peaks.items() if k != "fma" and v},
        "roofline_share": _roofline(rows, peaks, latency),
        "bandwidth_gbs": bandwidth,
        "gflops_total": flops_total / 1e9,
        "gflops_per_s": flops_total / latency / 1e6 if latency else None,
        "static_facts": bool(info),
        "not_called": sorted(set(info) - names),
        "latencies_ms": latencies,
        # the slowest fifth of the plain runs' median over the fastest fifth's: a machine that changed speed
        # mid-profile (a slow spell: benchmarks/tail.md) mixes both speeds into every kernel's time
        "spell": spell(latencies, window_s=sum(latencies) / 5e3) if len(latencies) >= 15 else 1.0,
        "kernels": rows,
        # multiply-add kernels faster than the measured FMA peak: both peak measurements ran slow (a busy machine)
        "above_peak": [r["kernel"] for r in rows if (r["peak_share"] or 0) > 1.0],
    }


def _kernel_peak(facts: dict, gflops: float | None, peaks: dict) -> dict:
    """A kernel's share of the peak of its unit: fp32 FMA, vdpbf16ps for a bf16 kernel on AVX512-BF16 (twice the
    FMA's multiply-adds: against the FMA peak BERT's read 175-188%), vpdpbusd for an int8 one on AVX512-VNNI. None for
    units with no measured peak (AMX, Arm, int8 without VNNI: no_peak), and for kernels whose FLOPs are not
    multiply-adds (softmax's exp, max and divide: 151% of the FMA peak in the zoo transformer)."""
    kind = _peak_kind(facts)
    return {"peak_share": _share(gflops, peaks.get(kind)), "peak_unit": kind, "no_peak": _unmeasured(facts)}


def _peak_kind(facts: dict) -> str | None:
    """The measured peak that bounds the kernel: "fma" (fp32), "bf16" (AVX512-BF16's vdpbf16ps), "int8"
    (AVX512-VNNI's vpdpbusd), or None: its FLOPs are not multiply-adds, or its unit has no measured peak."""
    return _unit_peak(facts) if _multiply_adds(facts) else None


def _unmeasured(facts: dict) -> bool:
    """The kernel's multiply-adds run on a unit with no measured peak: AMX, Arm's bf16/fp16, int8 without VNNI."""
    return _multiply_adds(facts) and _unit_peak(facts) is None


def _multiply_adds(facts: dict) -> bool:
    return bool(facts.get("int8")) or _fma_bound(facts)


def _unit_peak(facts: dict) -> str | None:
    """The peak loop of the unit the kernel's multiply-adds run on (precision_units' unit), None where none is."""
    unit = str(facts.get("unit", ""))
    if facts.get("int8"):
        return "int8" if unit.startswith("avx512-vnni") else None
    if unit.startswith(NO_PEAK_UNITS):
        return None
    return "bf16" if unit.startswith("avx512-bf16") else "fma"


def _share(gflops, peak: dict | None) -> float | None:
    return gflops / peak["gflops"] if gflops and peak and peak["gflops"] else None


def _roofline(rows: list[dict], peaks: dict, latency: float) -> float | None:
    """The run's share of the roofline: the time its FLOPs take at the peak of each kernel's unit (the FMA peak for
    FLOPs that are not multiply-adds) over the latency; None where a kernel with FLOPs runs on a unit with no
    measured peak, or with no FLOPs at all."""
    if not latency:
        return None
    at_peak = 0.0
    for r in (r for r in rows if r["flops"]):
        peak = peaks.get(r["peak_unit"] or "fma")
        if r["no_peak"] or not (peak and peak["gflops"]):
            return None
        at_peak += r["flops"] / (peak["gflops"] * 1e6)
    return at_peak / latency if at_peak else None


def _fma_bound(facts: dict) -> bool:
    """The FMA peak bounds the kernel: float multiply-adds (an artifact from before kinds were recorded: any)."""
    return not facts.get("int8") and facts.get("kind", "matmul") in MULTIPLY_ADD


def _short(ops: list[str], width: int = 28) -> str:
    s = ", ".join(ops) if ops else "-"
    return s if len(s) <= width else s[: width - 3] + "..."


def _opt(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_profile(p: dict) -> str:
    """The terminal table: the top kernels by time, then the totals."""
    top = p["kernels"][: p.get("top", TOP)]
    width = max([len("kernel")] + [min(len(r["kernel"]), 48) for r in top])
    head = (
        f"{'kernel':<{width}}  {'source ops':<28} {'calls':>5} {'ms':>8} {'%':>5} {'GFLOP/s':>8} {'%peak':>5} "
        f"{'MB':>7} schedule"
    )
    lines = [
        f"{p['artifact']} on {p['target']}, {p['threads']} thread(s), {p['runs']} profiled runs; peak "
        f"{p['peak_gflops']:.0f} GFLOP/s ({p['peak_method']}, {p['threads']} core(s)), "
        + "".join(f"{k} {v:.0f} {UNIT_NAMES[k][0]} ({UNIT_NAMES[k][1]}), " for k, v in _unit_peaks(p))
        + f"memory {p['bandwidth_gbs']:.0f} GB/s",
        head,
        "-" * len(head),
    ]
    for r in top:
        name = r["kernel"] if len(r["kernel"]) <= 48 else r["kernel"][:45] + "..."
        lines.append(
            f"{name:<{width}}  {_short(r['ops']):<28} {r['calls']:>5} {r['ms']:>8.3f} "
            f"{r['share'] * 100:>5.1f} "
            f"{_opt(r['gflops'], '8.1f'):>8} {_opt(r['peak_share'] and r['peak_share'] * 100, '5.1f'):>5} "
            f"{_opt(r['bytes'] and r['bytes'] / 1e6, '7.2f'):>7} {r['schedule']}"
        )
    rest = p["kernels"][len(top) :]
    if rest:
        lines.append(f"... {len(rest)} more kernel(s): {sum(r['ms'] for r in rest):.3f} ms")
    lines.append(
        f"total: {len(p['kernels'])} kernels {p['kernels_ms']:.3f} ms + VM builtins "
        f"{p['builtins_ms']:.3f} ms; "
        f"measured latency (median, same runs) {p['latency_ms']:.3f} ms: kernels are "
        f"{p['kernels_share_of_latency'] * 100:.0f}%"
        + (
            f"; {p['gflops_total']:.3f} GFLOP per run, {p['gflops_per_s']:.1f} GFLOP/s end to end "
            + _end_to_end_share(p)
            if p["gflops_total"]
            else ""
        )
    )
    if p.get("above_peak"):
        lines.append(
            f"(note: {len(p['above_peak'])} multiply-add kernel(s) ran faster than the measured peak: the machine was "
            "busy while it was measured, so the %peak column reads high; profile again on a quiet machine)"
        )
    share, per_call = p.get("kernels_share_of_latency") or 0.0, p.get("instrument_us_per_call")
    if share > OVERSTATED and per_call:
        lines.append(
            f"(note: the kernels add up to {share * 100:.0f}% of the plain run: timing each call costs about "
            f"{per_call:.1f} us (instrumented runs {p['latency_ms_instrumented']:.3f} ms), so kernels of a few "
            "microseconds read high)"
        )
    if p.get("spell", 1.0) > SPELL_RATIO:
        lines.append(
            f"(note: the machine's speed changed during the profile: the slowest fifth of the runs had a median "
            f"{p['spell']:.1f}x the fastest fifth's, so every kernel's time mixes both speeds; profile again, or on a "
            "quiet machine)"
        )
    if p.get("not_called"):
        lines.append(f"(never called as kernels, e.g. turned into VM reshapes by TVM: {', '.join(p['not_called'])})")
    if not p["static_facts"]:
        lines.append(
            "(this artifact's manifest has no kernel_info: recompile it for source ops, FLOPs, bytes and schedules)"
        )
    return "\n".join(lines)


def _unit_peaks(p: dict) -> list:
    return list((p.get("unit_peaks_gflops") or {}).items())


def _end_to_end_share(p: dict) -> str:
    share = p.get("roofline_share", p["gflops_per_s"] / p["peak_gflops"])  # a profile saved before the key
    if share is not None:
        return f"({share * 100:.1f}% of peak)"
    if any(r.get("int8") for r in p["kernels"]):
        return "(int8 kernels: no share of the float32 peak)"
    return "(kernels on units with no measured peak, e.g. AMX tiles: no share of the peak)"


def check_plot() -> None:
    """Fail before anything runs when --plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise OptionsError(
            "--plot needs matplotlib, which is not installed", where="--plot", fix="pip install 'kiln[bench]'"
        ) from None


def plot_profile(p: dict, path: str, top: int = 25) -> None:
    """A PNG bar chart of the kernels' times (top `top`), coloured by schedule, each bar labelled
    with its share of the FMA peak."""
    check_plot()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._io import atomic_open

    rows = p["kernels"][:top][::-1]
    colours = {"tuned": "tab:green", "default": "tab:blue", "c-kernel": "tab:purple", "none": "tab:red"}
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.32 * len(rows)))
    labels = [
        (r["kernel"] if len(r["kernel"]) <= 40 else r["kernel"][:37] + "...")
        + (f"  [{_short(r['ops'], 24)}]" if r["ops"] else "")
        for r in rows
    ]
    bars = ax.barh(
        range(len(rows)), [r["ms"] for r in rows], color=[colours.get(r["schedule"], "tab:gray") for r in rows]
    )
    for bar, r in zip(bars, rows):
        if r["peak_share"] is not None:
            ax.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                f" {r['peak_share'] * 100:.0f}% peak",
                va="center",
                fontsize=7,
            )
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xlabel("ms per run")
    ax.set_title(
        f"{os.path.basename(p['artifact'])}: kernels {p['kernels_ms']:.2f} ms of {p['latency_ms']:.2f} ms, "
        f"{p['threads']} thread(s); peak {p['peak_gflops']:.0f} GFLOP/s",
        fontsize=9,
    )
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=7, loc="lower right")
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
