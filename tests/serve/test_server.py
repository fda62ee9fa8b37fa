"""`kiln serve` end to end: a real server process on loopback, real HTTP requests."""

import concurrent.futures
import io
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from helpers import rand
from serving import Proc

import kiln
from kiln.serve import ServeOptions


@pytest.fixture
def server(served):
    s = Proc(served[0], "--max-wait-ms", "20")
    yield s
    s.stop()


def test_predict_json_and_npz_match_the_runtime(server, served):
    ref = kiln.load(served[0])
    x = rand(1, 3, 16, 16, seed=3)
    code, headers, body = server.predict(x)
    assert code == 200 and headers["X-Kiln-Model-Version"] == "v1"
    np.testing.assert_allclose(
        np.array(json.loads(body)["outputs"]["output"], np.float32),
        ref.run({"input": x})["output"],
        rtol=1e-6,
        atol=1e-6,
    )
    buf = io.BytesIO()
    np.savez(buf, input=rand(3, 3, 16, 16, seed=4))
    code, headers, body = server.post("/v1/models/net1:predict", buf.getvalue(), "application/x-npz")
    assert code == 200 and headers["Content-Type"] == "application/x-npz"
    out = np.load(io.BytesIO(body))["output"]
    np.testing.assert_allclose(out, ref.run({"input": rand(3, 3, 16, 16, seed=4)})["output"], rtol=1e-6, atol=1e-6)


def test_bad_requests_get_json_errors(server):
    for body, code, what in [
        (b"{", 400, "not valid JSON"),
        (b'{"x": 1}', 400, '"inputs"'),
        (b'{"inputs": {"input": [[1, 2], [3]]}}', 400, "rectangular"),
        (json.dumps({"inputs": {"input": rand(16, 3, 16, 16).tolist()}}).encode(), 400, "larger than every bucket"),
        (b'{"inputs": {"input": [1.0]}}', 400, "rank"),
    ]:
        c, h, b = server.post("/v1/models/net1:predict", body)
        assert c == code and what in json.loads(b)["error"], (c, b[:300])
        assert h["Content-Type"].startswith("application/json")
    c, _, b = server.post("/v1/models/other:predict", b"{}")
    assert c == 404 and "serves 'net1'" in json.loads(b)["error"]
    c, _, b = server.post("/v1/models/net1:explain", b"{}")
    assert c == 404


def test_oversized_body_is_413(served):
    s = Proc(served[0], "--max-body-mb", "0.05")
    try:
        c, _, b = s.predict(rand(8, 3, 16, 16))  # ~120 KB of JSON
        assert c == 413 and "exceeds the limit" in json.loads(b)["error"]
        assert s.predict(rand(1, 3, 16, 16))[0] == 200  # ~15 KB
    finally:
        s.stop()


def test_dynamic_batching_splits_results_back_per_request(served):
    s = Proc(served[0], "--max-wait-ms", "200", "--max-batch", "8")
    try:
        ref = kiln.load(served[0])
        xs = [rand(1, 3, 16, 16, seed=100 + i) for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda x: s.predict(x), xs))
        for x, (code, _, body) in zip(xs, results):
            assert code == 200
            np.testing.assert_allclose(
                np.array(json.loads(body)["outputs"]["output"], np.float32),
                ref.run({"input": x})["output"],
                rtol=1e-5,
                atol=1e-5,
            )
        metrics = s.get("/metrics")[2].decode()
        batches = float(re.search(r'kiln_batch_size_count\{model="net1",version="v1"\} (\d+)', metrics).group(1))
        requests = float(re.search(r'kiln_batch_size_sum\{model="net1",version="v1"\} (\d+)', metrics).group(1))
        assert requests == 8 and batches < 8  # several requests shared a run
        assert 'kiln_requests_total{model="net1",version="v1",code="200"} 8' in metrics
        assert re.search(r'kiln_request_latency_seconds\{model="net1",version="v1",quantile="0.99"\} [0-9.]+', metrics)
        assert 'kiln_queue_depth{model="net1",version="v1"} 0' in metrics
    finally:
        s.stop()


def test_full_queue_is_503_with_retry_after_and_late_requests_504(served):
    s = Proc(served[0], "--queue", "1", "--max-batch", "1", "--max-wait-ms", "0")
    try:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: s.predict(rand(8, 3, 16, 16, seed=i)), range(48)))
        codes = [c for c, _, _ in results]
        assert set(codes) <= {200, 503} and 503 in codes and 200 in codes, codes
        assert all(h["Retry-After"] == "1" for c, h, _ in results if c == 503)
    finally:
        s.stop()
    s = Proc(served[0], "--timeout-ms", "0.001")
    try:
        c, _, b = s.predict(rand(1, 3, 16, 16))
        assert c == 504 and "--timeout-ms" in json.loads(b)["error"]
    finally:
        s.stop()


def test_sigterm_finishes_in_flight_requests_then_exits(served):
    s = Proc(served[0], "--max-wait-ms", "1500", "--max-batch", "8", "--timeout-ms", "5000")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(s.predict, rand(1, 3, 16, 16))  # waits ~1.5 s in the batcher
        time.sleep(0.5)
        s.p.send_signal(signal.SIGTERM)
        code, _, _ = fut.result(timeout=30)
    assert code == 200
    assert s.p.wait(30) == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(s.url + "/healthz", timeout=5)


def test_canary_split_between_versions(served):
    s = Proc(
        "--model",
        f"v1={served[0]}",
        "--model",
        f"v2={served[1]}",
        "--split",
        "v2=0.25",
        "--name",
        "net",
        "--max-wait-ms",
        "0",
    )
    try:
        x = rand(1, 3, 16, 16)
        outs = {v: kiln.load(p).run({"input": x})["output"] for v, p in (("v1", served[0]), ("v2", served[1]))}
        seen = {"v1": 0, "v2": 0}
        for _ in range(200):
            code, h, body = s.predict(x, name="net")
            v = h["X-Kiln-Model-Version"]
            seen[v] += 1
            np.testing.assert_allclose(
                np.array(json.loads(body)["outputs"]["output"], np.float32), outs[v], rtol=1e-5, atol=1e-5
            )
        assert 30 <= seen["v2"] <= 70, seen  # 25% of 200 = 50; binomial sd ~6
        code, h, _ = s.predict(x, name="net/versions/v2")
        assert code == 200 and h["X-Kiln-Model-Version"] == "v2"
        versions = json.loads(s.get("/v1/models")[2])["versions"]
        assert [(v["version"], v["share"]) for v in versions] == [("v1", 0.75), ("v2", 0.25)]
    finally:
        s.stop()


@pytest.mark.parametrize(
    "models, split, msg",
    [([], (), "no model"), (["v1=a.kiln"], (), "no such artifact"), (["MODEL"], ("v1=2",), "bad --split")],
)
def test_serve_options_errors(models, split, msg, served):
    models = [m if m != "MODEL" else str(served[0]) for m in models]
    with pytest.raises(kiln.OptionsError, match=msg):
        ServeOptions.make(models, split)


def test_grpc_port_is_refused_with_workers(served):
    with pytest.raises(kiln.OptionsError, match="--grpc-port serves from one process"):
        ServeOptions.make([str(served[0])], workers=2, grpc_port=8081)


def test_healthz_reports_a_model_that_fails_to_load(tmp_path):
    bad = tmp_path / "bad.kiln"
    bad.write_bytes(b"not a zip")
    p = subprocess.Popen(
        [sys.executable, "-m", "kiln", "serve", str(bad), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        url = re.search(r"http://[\d.:]+", p.stdout.readline()).group(0)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=5)
            except urllib.error.HTTPError as e:
                doc = json.loads(e.read())
                if doc["status"] == "failed":
                    assert e.code == 503 and "not a valid .kiln file" in doc["error"]
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("healthz never reported the failure")
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def test_workers_share_one_port_and_stop_together(served):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen(
        [sys.executable, "-m", "kiln", "serve", str(served[0]), "--port", str(port), "--workers", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        announced = [p.stdout.readline(), p.stdout.readline()]
        assert all(f":{port}" in line for line in announced), announced
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(url + "/healthz", timeout=5).status == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        body = json.dumps({"inputs": {"input": rand(1, 3, 16, 16).tolist()}}).encode()
        for _ in range(10):
            r = urllib.request.urlopen(
                urllib.request.Request(
                    url + "/v1/models/net1:predict", data=body, headers={"Content-Type": "application/json"}
                ),
                timeout=30,
            )
            assert r.status == 200
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
