"""Server metrics in Prometheus text format. Fixed memory: latencies are kept in a sliding window
(quantiles over the last WINDOW requests), counters and histograms are plain integers. The tail is
shown as `kiln bench` shows it: the worst request in the window, p99 over p50, and a flag when that
ratio exceeds bench's TAIL_FLAG_RATIO."""

from __future__ import annotations

import collections
import threading

import numpy as np

WINDOW = 10_000
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
QUANTILES = (0.5, 0.95, 0.99)
TAIL_FLAG_RATIO = 2.0  # the same threshold as kiln bench (kiln/runtime/bench.py)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: collections.Counter = collections.Counter()  # (version, code) -> n
        self.latency: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=WINDOW))
        self.latency_sum: collections.Counter = collections.Counter()
        self.batch_counts: dict[str, list[int]] = collections.defaultdict(lambda: [0] * (len(BATCH_BUCKETS) + 1))
        self.batch_sum: collections.Counter = collections.Counter()
        self.queue_depth: dict[str, callable] = {}
        self.stages: collections.Counter = collections.Counter()  # (version, stage) -> [count, ns] as two keys
        self.last_inference_ms: dict[str, int] = {}

    def stage(self, version: str, name: str, seconds: float, count: int = 1) -> None:
        """Time spent in one stage of serving (queue, compute), for Triton's statistics extension."""
        with self._lock:
            self.stages[(version, name, "count")] += count
            self.stages[(version, name, "ns")] += int(seconds * 1e9)

    def stage_stats(self, version: str, name: str) -> dict[str, int]:
        with self._lock:
            return {"count": self.stages[(version, name, "count")], "ns": self.stages[(version, name, "ns")]}

    def outcomes(self, version: str) -> dict[str, dict[str, int]]:
        """Successful and failed requests of one version: their count and total latency (ns)."""
        with self._lock:
            ok = self.requests[(version, 200)]
            failed = sum(n for (v, c), n in self.requests.items() if v == version and c != 200)
            ns = int(self.latency_sum[version] * 1e9)
        return {"success": {"count": ok, "ns": ns}, "fail": {"count": failed, "ns": 0}}

    def request(self, version: str, code: int, seconds: float | None) -> None:
        with self._lock:
            self.requests[(version, code)] += 1
            if seconds is not None and code == 200:
                self.latency[version].append(seconds)
                self.latency_sum[version] += seconds

    def batch(self, version: str, size: int) -> None:
        with self._lock:
            counts = self.batch_counts[version]
            counts[next((i for i, b in enumerate(BATCH_BUCKETS) if size <= b), len(BATCH_BUCKETS))] += 1
            self.batch_sum[version] += size

    def quantiles(self, version: str) -> dict[float, float]:
        with self._lock:
            lat = np.fromiter(self.latency.get(version, ()), dtype=np.float64)
        return {q: float(np.quantile(lat, q)) if lat.size else float("nan") for q in QUANTILES}

    def tail(self, version: str) -> dict[str, float]:
        """max, p99 over p50, and the flag (1 when that ratio exceeds TAIL_FLAG_RATIO) over the window."""
        with self._lock:
            lat = np.fromiter(self.latency.get(version, ()), dtype=np.float64)
        if not lat.size:
            return {"max": float("nan"), "p99_over_p50": float("nan"), "flag": 0}
        p50, p99 = np.quantile(lat, [0.5, 0.99])
        ratio = float(p99 / p50) if p50 > 0 else float("inf")
        return {"max": float(lat.max()), "p99_over_p50": ratio, "flag": int(ratio > TAIL_FLAG_RATIO)}

    def render(self, model: str) -> str:
        out = [
            "# HELP kiln_requests_total Predict requests by model version and HTTP status.",
            "# TYPE kiln_requests_total counter",
        ]
        with self._lock:
            requests = sorted(self.requests.items())
            versions = sorted(set(self.latency) | set(self.batch_counts) | set(self.queue_depth))
        for (version, code), n in requests:
            out.append(f'kiln_requests_total{{model="{model}",version="{version}",code="{code}"}} {n}')
        out += [
            "# HELP kiln_request_latency_seconds Latency of successful predict requests (quantiles over the last "
            f"{WINDOW}).",
            "# TYPE kiln_request_latency_seconds summary",
        ]
        for v in versions:
            for q, val in self.quantiles(v).items():
                out.append(f'kiln_request_latency_seconds{{model="{model}",version="{v}",quantile="{q}"}} {val:.6f}')
            with self._lock:
                out.append(
                    f'kiln_request_latency_seconds_sum{{model="{model}",version="{v}"}} {self.latency_sum[v]:.6f}'
                )
                out.append(
                    f'kiln_request_latency_seconds_count{{model="{model}",version="{v}"}} '
                    f"{sum(n for (ver, c), n in self.requests.items() if ver == v and c == 200)}"
                )
        tails = {v: self.tail(v) for v in versions}
        for name, key, what in (
            ("max_seconds", "max", "The slowest successful predict request"),
            ("p99_over_p50", "p99_over_p50", "p99 over p50 of predict latency"),
            ("tail_flag", "flag", f"1 when p99 over p50 exceeds {TAIL_FLAG_RATIO:g}"),
        ):
            out += [
                f"# HELP kiln_request_latency_{name} {what} (over the last {WINDOW}).",
                f"# TYPE kiln_request_latency_{name} gauge",
            ]
            for v in versions:
                val = tails[v][key]
                text = f"{val}" if key == "flag" else f"{val:.6f}"
                out.append(f'kiln_request_latency_{name}{{model="{model}",version="{v}"}} {text}')
        out += ["# HELP kiln_batch_size Requests per executed batch.", "# TYPE kiln_batch_size histogram"]
        for v in versions:
            with self._lock:
                counts = list(self.batch_counts[v])
                total = self.batch_sum[v]
            cum = 0
            for b, n in zip(BATCH_BUCKETS + ("+Inf",), counts):
                cum += n
                out.append(f'kiln_batch_size_bucket{{model="{model}",version="{v}",le="{b}"}} {cum}')
            out.append(f'kiln_batch_size_sum{{model="{model}",version="{v}"}} {total}')
            out.append(f'kiln_batch_size_count{{model="{model}",version="{v}"}} {cum}')
        out += ["# HELP kiln_queue_depth Requests waiting for a batch.", "# TYPE kiln_queue_depth gauge"]
        for v, depth in sorted(self.queue_depth.items()):
            out.append(f'kiln_queue_depth{{model="{model}",version="{v}"}} {depth()}')
        return "\n".join(out) + "\n"
