"""Latency histogram PNG for `kiln bench --plot` (matplotlib, imported only here)."""

from __future__ import annotations

from ..errors import OptionsError


def latency_histogram(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise OptionsError(
            "--plot needs matplotlib, which is not installed", where="--plot", fix="pip install 'kiln[bench]'"
        ) from None
    from .._io import atomic_open

    fig, ax = plt.subplots(figsize=(7, 4))
    series = [("kiln", result["latencies_ms"])] + (
        [("onnxruntime", result["ort_latencies_ms"])] if "ort_latencies_ms" in result else []
    )
    for label, ms in series:
        ax.hist(ms, bins=40, alpha=0.6, label=f"{label} (p50 {sorted(ms)[len(ms) // 2]:.2f} ms)")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("runs")
    ax.set_title(f"{result['artifact']} - {result['threads']} thread(s)")
    ax.legend()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
