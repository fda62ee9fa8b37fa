"""Server metrics in Prometheus text format. Fixed memory: latencies are kept in a sliding window
(quantiles over the last WINDOW requests), counters and histograms are plain integers."""
from __future__ import annotations

import collections
import threading

import numpy as np

WINDOW = 10_000
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
QUANTILES = (0.5, 0.95, 0.99)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: collections.Counter = collections.Counter()  # (version, code) -> n
        self.latency: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=WINDOW))
        self.latency_sum: collections.Counter = collections.Counter()
        self.batch_counts: dict[str, list[int]] = collections.defaultdict(lambda: [0] * (len(BATCH_BUCKETS) + 1))
        self.batch_sum: collections.Counter = collections.Counter()
        self.queue_depth: dict[str, callable] = {}

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

    def render(self, model: str) -> str:
        out = ["# HELP kiln_requests_total Predict requests by model version and HTTP status.",
               "# TYPE kiln_requests_total counter"]
        with self._lock:
            requests = sorted(self.requests.items())
            versions = sorted(set(self.latency) | set(self.batch_counts) | set(self.queue_depth))
        for (version, code), n in requests:
            out.append(f'kiln_requests_total{{model="{model}",version="{version}",code="{code}"}} {n}')
        out += ["# HELP kiln_request_latency_seconds Latency of successful predict requests (quantiles over the last "
                f"{WINDOW}).", "# TYPE kiln_request_latency_seconds summary"]
        for v in versions:
            for q, val in self.quantiles(v).items():
                out.append(f'kiln_request_latency_seconds{{model="{model}",version="{v}",quantile="{q}"}} {val:.6f}')
            with self._lock:
                out.append(f'kiln_request_latency_seconds_sum{{model="{model}",version="{v}"}} {self.latency_sum[v]:.6f}')
                out.append(f'kiln_request_latency_seconds_count{{model="{model}",version="{v}"}} '
                           f'{sum(n for (ver, c), n in self.requests.items() if ver == v and c == 200)}')
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
