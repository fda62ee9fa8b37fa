"""kiln.integrations.ray: a Ray Serve deployment of two replicas on a local loopback cluster (2 CPUs).
Answers over Ray Serve's HTTP proxy (V2 JSON and binary) equal kiln.load().run, and the replicas run
on disjoint CPUs. Starts Ray: marked slow and ray (make test-all, or pytest -m ray)."""

import json
import socket
import urllib.request

import numpy as np
import pytest
from helpers import batchable_conv, rand

import kiln

pytestmark = [pytest.mark.slow, pytest.mark.ray]
ray = pytest.importorskip("ray", reason="pip install 'kiln[ray]'")
try:  # Ray Serve imports gRPC stubs that refuse an older protobuf runtime (a VersionError, not an ImportError)
    from ray import serve
except Exception as e:
    pytest.skip(f"ray.serve does not import here: {type(e).__name__}: {e}", allow_module_level=True)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from kiln.integrations.ray import deployment

    m = batchable_conv()
    path = tmp_path_factory.mktemp("ray") / "net.kiln"
    kiln.compile(m, path, shape_buckets="input:1x3x8x8,4x3x8x8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    handle = serve.run(deployment(path, num_replicas=2, cpus_per_replica=1), route_prefix="/")
    yield path, f"http://127.0.0.1:{port}", handle
    serve.shutdown()
    ray.shutdown()


def _post(url, body, headers):
    req = urllib.request.Request(url, data=body, headers=headers)
    r = urllib.request.urlopen(req, timeout=60)
    return r.headers, r.read()


def test_v2_json_and_binary_equal_the_runtime(app):
    path, url, _ = app
    ref = kiln.load(path)
    for i in range(6):
        x = rand(1 + i % 3, 3, 8, 8, seed=i)
        t = {"name": "input", "shape": list(x.shape), "datatype": "FP32"}
        if i % 2:
            header = json.dumps(
                {
                    "inputs": [{**t, "parameters": {"binary_data_size": x.nbytes}}],
                    "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
                }
            ).encode()
            h, body = _post(
                url + "/v2/models/net/infer",
                header + x.tobytes(),
                {"Inference-Header-Content-Length": str(len(header))},
            )
            n = int(h["Inference-Header-Content-Length"])
            out = json.loads(body[:n])["outputs"][0]
            got = np.frombuffer(body[n:], np.float32).reshape(out["shape"])
        else:
            _, body = _post(
                url + "/v2/models/net/infer", json.dumps({"inputs": [{**t, "data": x.ravel().tolist()}]}).encode(), {}
            )
            out = json.loads(body)["outputs"][0]
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, ref.run({"input": x})["output"], rtol=1e-5, atol=1e-5)


def test_two_replicas_run_on_disjoint_cpus(app):
    _, _, handle = app
    seen = {}
    for _ in range(40):
        p = handle.placement.remote().result(timeout_s=60)
        seen[p["pid"]] = p
        if len(seen) == 2:
            break
    assert len(seen) == 2, seen
    a, b = seen.values()
    assert a["mask"] == a["cpus"] and b["mask"] == b["cpus"]
    assert not set(a["cpus"]) & set(b["cpus"])
