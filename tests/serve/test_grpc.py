"""The Open Inference Protocol over gRPC (`kiln serve --grpc-port`), driven by Triton's own client
(tritonclient.grpc): health, metadata, infer with raw tensors both ways; results equal kiln.load().run."""

import re

import numpy as np
import pytest
from helpers import rand
from serving import Proc

import kiln

pytest.importorskip("grpc", reason="pip install 'kiln[grpc]'")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="pip install 'tritonclient[grpc]'")
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def server(served):
    s = Proc("--model", f"v1={served[0]}", "--model", f"v2={served[1]}", "--name", "net", "--grpc-port", "0")
    port = re.search(r"gRPC on [\d.]+:(\d+)", s.line).group(1)
    s.grpc = f"127.0.0.1:{port}"
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc)
    yield c
    c.close()


def test_health_and_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("net") and client.is_model_ready("net", "v2")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "kiln" and "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("net", as_json=True)
    assert model["versions"] == ["v1", "v2"]
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "3", "16", "16"]}]
    with pytest.raises(InferenceServerException, match="no model 'other'"):
        client.get_model_metadata("other")


@pytest.mark.parametrize("version, index", [("v1", 0), ("v2", 1)])
def test_infer_raw_tensors_equal_the_runtime(client, served, version, index):
    x = rand(3, 3, 16, 16, seed=11)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    r = client.infer("net", [inp], model_version=version, request_id="g-1")
    assert r.get_response().id == "g-1" and r.get_response().model_version == version
    want = kiln.load(served[index]).run({"input": x})["output"]
    np.testing.assert_allclose(r.as_numpy("output"), want, rtol=1e-6, atol=1e-6)


def test_bad_grpc_requests_get_status_codes(client):
    x = rand(1, 3, 16, 16, seed=12)
    wrong = grpcclient.InferInput("input", [1, 3, 16, 16], "FP64")
    wrong.set_data_from_numpy(x.astype(np.float64))
    with pytest.raises(InferenceServerException, match="datatype 'FP64'") as e:
        client.infer("net", [wrong])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    good = grpcclient.InferInput("input", [1, 3, 16, 16], "FP32")
    good.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="no version 'v9'") as e:
        client.infer("net", [good], model_version="v9")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert client.infer("net", [good]).as_numpy("output").shape == (1, 8, 16, 16)  # still serving
