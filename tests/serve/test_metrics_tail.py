"""/metrics shows the tail per model version as kiln bench does: max, p99 over p50, the flag."""

import re

from kiln.serve.metrics import Metrics


def _gauge(text, name, version):
    m = re.search(rf'kiln_request_latency_{name}{{model="m",version="{version}"}} ([0-9.naninf]+)', text)
    return float(m.group(1))


def test_tail_gauges_per_version():
    m = Metrics()
    for _ in range(200):
        m.request("v1", 200, 0.006)
        m.request("v2", 200, 0.006)
    for _ in range(5):
        m.request("v2", 200, 0.5)  # isolated slow requests: v2's p99 is far above its p50
    m.request("v1", 500, 9.0)  # failed requests are not latencies
    text = m.render("m")
    assert "# TYPE kiln_request_latency_max_seconds gauge" in text
    assert "# TYPE kiln_request_latency_tail_flag gauge" in text
    assert _gauge(text, "max_seconds", "v1") == 0.006 and _gauge(text, "tail_flag", "v1") == 0
    assert _gauge(text, "p99_over_p50", "v1") == 1.0
    assert _gauge(text, "max_seconds", "v2") == 0.5 and _gauge(text, "tail_flag", "v2") == 1
    assert _gauge(text, "p99_over_p50", "v2") > 2
    assert 'kiln_request_latency_seconds{model="m",version="v2",quantile="0.5"}' in text


def test_a_version_without_requests_has_no_tail():
    m = Metrics()
    m.batch("v1", 1)
    text = m.render("m")
    assert _gauge(text, "tail_flag", "v1") == 0
    assert 'kiln_request_latency_max_seconds{model="m",version="v1"} nan' in text
