"""Run in a Python that has kserve (a subprocess of test_kserve.py): KServe's ModelServer app with
kiln's KilnModel, driven by KServe's own InferenceRESTClient (V2) through httpx's ASGI transport (no
socket: KServe's server binds every interface). Prints the results as JSON."""

import asyncio
import json
import sys

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferRequest, ModelServer, RESTConfig, model_server
from kserve.protocol.infer_type import InferInput
from kserve.protocol.rest.server import RESTServer

from kiln.integrations.kserve import KilnModel


async def main(artifact: str, x: np.ndarray) -> dict:
    model = KilnModel("net", artifact, num_threads=1)
    model.load()
    server = ModelServer(enable_grpc=False)
    server.register_model(model)
    rest = RESTServer("kserve.model_server:app", server.dataplane, server.model_repository_extension, 0)
    rest.create_application()  # registers the endpoints on kserve.model_server.app
    app = model_server.app
    client = InferenceRESTClient(RESTConfig(protocol="v2", transport=httpx.ASGITransport(app=app)))
    base = "http://kserve.test"
    inp = InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    res = await client.infer(base, InferRequest(model_name="net", infer_inputs=[inp], request_id="k1"), "net")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base) as raw:
        meta = (await raw.get("/v2/models/net")).json()
    ready = await client.is_model_ready(base, "net")
    await client.close()
    return {"id": res.id, "output": res.outputs[0].as_numpy().tolist(), "metadata": meta, "ready": ready}


if __name__ == "__main__":
    x = np.load(sys.argv[2])
    print("RESULT " + json.dumps(asyncio.run(main(sys.argv[1], x))))
