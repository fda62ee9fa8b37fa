"""Kiln as a KServe model (the `kserve` extra): a `kserve.Model` around `kiln.load`, its V2 metadata
from the artifact's manifest, startable as a ServingRuntime's command:

    python -m kiln.integrations.kserve --model_name encoder --artifact /mnt/models/encoder.kiln

KServe's ModelServer then serves the Open Inference Protocol (REST and gRPC) and its own V1 protocol
(`{"instances": [...]}`, taken as the first input's batch). It listens on every interface, as a model
server in a pod must; run it inside its pod (docs/serving.md has the ServingRuntime manifest)."""

from __future__ import annotations

import argparse
import sys

import kserve
import numpy as np
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

from ..runtime.model import Model
from ..serve import v2codec, v2meta


class KilnModel(kserve.Model):
    def __init__(self, name: str, artifact: str, num_threads: int | None = None):
        super().__init__(name)
        self.artifact, self.num_threads = artifact, num_threads
        self.model: Model | None = None

    def load(self) -> bool:
        self.model = Model(self.artifact, num_threads=self.num_threads, warmup=True)
        self.ready = True
        return self.ready

    def get_input_types(self) -> list[dict]:
        return v2meta.model_metadata(self.name, [], self.model)["inputs"]

    def get_output_types(self) -> list[dict]:
        return v2meta.model_metadata(self.name, [], self.model)["outputs"]

    def _feed(self, payload) -> dict[str, np.ndarray]:
        if isinstance(payload, InferRequest):
            return {i.name: i.as_numpy() for i in payload.inputs}
        first = self.model.inputs[0]  # V1: {"instances": [...]}, one sample per instance
        return {first.name: np.asarray(payload["instances"], dtype=first.dtype)}

    async def predict(self, payload, headers=None, response_headers=None):
        results = self.model.run_tensors(self._feed(payload))
        if not isinstance(payload, InferRequest):
            return {"predictions": next(iter(results.values())).tolist()}
        outputs = [
            InferOutput(name=k, shape=list(v.shape), datatype=v2codec.datatype(v.dtype), data=v)
            for k, v in results.items()
        ]
        return InferResponse(response_id=payload.id, model_name=self.name, infer_outputs=outputs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(parents=[kserve.model_server.parser])
    parser.add_argument("--artifact", required=True, help="the .kiln file to serve")
    parser.add_argument("--num_threads", type=int, default=None, help="Kiln threads (default: KILN_NUM_THREADS)")
    a, _ = parser.parse_known_args(argv)
    model = KilnModel(a.model_name, a.artifact, a.num_threads)
    model.load()
    kserve.ModelServer().start([model])
    return 0


if __name__ == "__main__":
    sys.exit(main())
