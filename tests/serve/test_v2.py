"""The Open Inference Protocol (KServe V2) over HTTP, driven by Triton's own client (tritonclient.http):
health, metadata, config, stats, infer with JSON and binary tensors; results equal kiln.load().run."""

import concurrent.futures
import json
import re
import urllib.error
import urllib.request

import numpy as np
import pytest
from helpers import rand
from serving import Proc

import kiln

httpclient = pytest.importorskip("tritonclient.http", reason="pip install 'tritonclient[http]'")


@pytest.fixture(scope="module")
def server(served):
    s = Proc("--model", f"v1={served[0]}", "--model", f"v2={served[1]}", "--name", "net", "--max-wait-ms", "20")
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


def _infer(client, x, binary_in, binary_out, version="v1", **kw):
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary_in)
    out = httpclient.InferRequestedOutput("output", binary_data=binary_out)
    return client.infer("net", [inp], model_version=version, outputs=[out], **kw)


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("net") and client.is_model_ready("net", "v2")
    assert not client.is_model_ready("other")
    meta = client.get_server_metadata()
    assert meta["name"] == "kiln" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_config_and_stats(client):
    meta = client.get_model_metadata("net")
    assert meta["versions"] == ["v1", "v2"] and meta["platform"] == "kiln"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]  # batch buckets 1..8
    assert meta["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 8, 16, 16]}]
    config = client.get_model_config("net")
    assert config["max_batch_size"] == 8
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [3, 16, 16]}]
    _infer(client, rand(2, 3, 16, 16), True, True, version="v2")
    (stats,) = client.get_inference_statistics("net", "v2")["model_stats"]
    assert stats["version"] == "v2" and stats["inference_count"] >= 2 and stats["execution_count"] >= 1
    assert stats["inference_stats"]["success"]["count"] >= 1 and stats["inference_stats"]["success"]["ns"] > 0


@pytest.mark.parametrize("binary_in, binary_out", [(False, False), (True, True), (True, False), (False, True)])
def test_infer_json_and_binary_equal_the_runtime(client, served, binary_in, binary_out):
    x = rand(3, 3, 16, 16, seed=5)
    r = _infer(client, x, binary_in, binary_out, request_id="req-42")
    assert r.get_response()["id"] == "req-42" and r.get_response()["model_version"] == "v1"
    want = kiln.load(served[0]).run({"input": x})["output"]
    np.testing.assert_allclose(r.as_numpy("output"), want, rtol=1e-6, atol=1e-6)


def test_default_outputs_come_binary(client, served):
    x = rand(1, 3, 16, 16, seed=6)
    inp = httpclient.InferInput("input", [1, 3, 16, 16], "FP32")
    inp.set_data_from_numpy(x)
    r = client.infer("net", [inp], model_version="v2")  # no outputs named: binary_data_output
    assert r.get_output("output")["parameters"]["binary_data_size"] == 8 * 16 * 16 * 4
    np.testing.assert_allclose(r.as_numpy("output"), kiln.load(served[1]).run({"input": x})["output"], atol=1e-6)


def test_nested_json_data_and_the_canary_split(server, served):
    x = rand(1, 3, 16, 16, seed=8)
    body = {"id": "n", "inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": x.tolist()}]}
    code, headers, raw = server.post("/v2/models/net/infer", json.dumps(body).encode())
    doc = json.loads(raw)
    assert code == 200 and doc["id"] == "n" and doc["model_version"] == headers["X-Kiln-Model-Version"]
    (out,) = doc["outputs"]
    want = kiln.load(served[0 if doc["model_version"] == "v1" else 1]).run({"input": x})["output"]
    assert out["shape"] == [1, 8, 16, 16] and out["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), want, atol=1e-6)


def _v2_json(server, x):
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    return server.post("/v2/models/net/versions/v1/infer", json.dumps(body).encode())


def test_concurrent_v2_requests_batch_with_v1(server, served):
    xs = [rand(1, 3, 16, 16, seed=200 + i) for i in range(8)]
    ref = kiln.load(served[0])
    before = server.get("/metrics")[2].decode()

    def one(i):  # V1 and V2 clients share the batcher (tritonclient's gevent client is not for threads)
        return server.predict(xs[i], name="net/versions/v1") if i % 2 else _v2_json(server, xs[i])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for i, (code, _, body) in enumerate(results):
        doc = json.loads(body)
        got = doc["outputs"]["output"] if i % 2 else np.reshape(doc["outputs"][0]["data"], doc["outputs"][0]["shape"])
        assert code == 200
        np.testing.assert_allclose(np.asarray(got, np.float32), ref.run({"input": xs[i]})["output"], atol=1e-5)
    after = server.get("/metrics")[2].decode()
    runs, requests = (_batches(after, k) - _batches(before, k) for k in ("count", "sum"))
    assert requests == 8 and runs < 8  # requests of both protocols shared runs


def _batches(metrics: str, kind: str) -> int:
    m = re.search(rf'kiln_batch_size_{kind}\{{model="net",version="v1"\}} (\d+)', metrics)
    return int(m.group(1)) if m else 0


def _body(x, datatype="FP32", shape=None, binary=False, name="input"):
    t = {"name": name, "shape": list(x.shape) if shape is None else shape, "datatype": datatype}
    if not binary:
        return json.dumps({"inputs": [{**t, "data": x.ravel().tolist()}]}).encode(), None
    header = json.dumps({"inputs": [{**t, "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return header + x.tobytes(), len(header)


def _post(server, path, body, header_length=None):
    req = urllib.request.Request(server.url + path, data=body, headers={"Content-Type": "application/octet-stream"})
    if header_length is not None:
        req.add_header("Inference-Header-Content-Length", str(header_length))
    try:
        r = urllib.request.urlopen(req, timeout=30)
        return r.status, json.loads(r.read())  # no binary outputs asked for: a JSON answer
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _bad_requests(x):
    body, n = _body(x, binary=True)
    return [
        ("/v2/models/net/infer", *_body(x, datatype="FP64"), 400, "datatype 'FP64'"),
        ("/v2/models/net/infer", *_body(x[0]), 400, "rank 3"),  # a sample without its batch axis
        ("/v2/models/net/infer", *_body(x, shape=[1, 3, 16, 8]), 400, "values for shape"),
        ("/v2/models/net/infer", *_body(x, name="image"), 400, "unknown input 'image'"),
        ("/v2/models/net/infer", b'{"inputs": []}', None, 400, "missing ['input']"),
        ("/v2/models/net/infer", body[:-100], n, 400, "100 bytes short"),  # truncated binary body
        ("/v2/models/net/infer", body, len(body) + 1, 400, "Inference-Header-Content-Length"),
        ("/v2/models/net/infer", b"{", None, 400, "not valid JSON"),
        ("/v2/models/other/infer", body, n, 404, "no model 'other'"),
        ("/v2/models/net/versions/v9/infer", body, n, 404, "no version 'v9'"),
    ]


def test_bad_v2_requests_get_v2_errors_and_the_server_keeps_serving(server):
    import psutil

    x = rand(1, 3, 16, 16, seed=9)
    for path, body, n, code, what in _bad_requests(x):
        got, doc = _post(server, path, body, n)
        assert got == code and what in doc["error"] and set(doc) == {"error"}, (path, n, got, doc)
    for path in ("/v2/models/other", "/v2/models/net/versions/v9", "/v2/models/other/config"):
        code, _, raw = server.get(path)
        assert code == 404 and "error" in json.loads(raw)
    rss = psutil.Process(server.p.pid).memory_info().rss
    for _ in range(30):  # nothing kept per bad request
        for path, body, n, _, _ in _bad_requests(x):
            _post(server, path, body, n)
    assert psutil.Process(server.p.pid).memory_info().rss - rss < 20 * 2**20
    good, n = _body(x, binary=True)
    assert _post(server, "/v2/models/net/infer", good, n)[0] == 200


def test_oversized_v2_body_is_413(served):
    s = Proc(served[0], "--max-body-mb", "0.05")
    try:
        body, n = _body(rand(8, 3, 16, 16), binary=True)  # 24 KB binary: fits
        assert _post(s, "/v2/models/net1/infer", body, n)[0] == 200
        code, doc = _post(s, "/v2/models/net1/infer", *_body(rand(8, 3, 16, 16)))  # ~120 KB of JSON
        assert code == 413 and "exceeds the limit" in doc["error"]
    finally:
        s.stop()
