"""Kiln on Ray Serve (the `ray` extra): a deployment whose replicas each load the artifact, on their own
CPUs, and answer the Open Inference Protocol (KServe V2: JSON or binary tensors) through Ray Serve's HTTP
proxy, batching requests with `@serve.batch`.

Ray counts CPUs but does not place an actor on particular cores, and Kiln's pool pins its workers inside
the process's mask: so each replica takes a disjoint set of the node's CPUs from a named allocator actor
and narrows its process to them before the model is loaded (kiln.runtime.replica).

    import ray
    from ray import serve
    from kiln.integrations.ray import deployment

    ray.init(num_cpus=4)
    serve.run(deployment("encoder.kiln", num_replicas=2, cpus_per_replica=2), route_prefix="/")
    # POST http://127.0.0.1:8000/v2/models/encoder/infer"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import ray
from ray import serve

from ..errors import KilnError
from ..runtime.model import Model
from ..runtime.replica import set_process_cpus
from ..serve import v2codec, v2meta

ALLOCATOR = "kiln-cpu-allocator"


@ray.remote(num_cpus=0)
class CpuAllocator:
    """Hands out disjoint CPU sets per node: replica k of a node gets the k-th `n` of its CPUs."""

    def __init__(self):
        self.used: dict[str, set[int]] = {}

    def take(self, node: str, allowed: list[int], n: int) -> list[int]:
        used = self.used.setdefault(node, set())
        free = [c for c in sorted(allowed) if c not in used]
        mine = free[:n] if len(free) >= n else sorted(allowed)[:n]  # more replicas than CPUs: share
        used.update(mine)
        return mine


def _allocator():
    return CpuAllocator.options(name=ALLOCATOR, get_if_exists=True, lifetime="detached").remote()


class KilnReplica:
    """One replica: the model on its own CPUs, V2 infer and metadata over Ray Serve's HTTP proxy."""

    def __init__(self, artifact: str, name: str, cpus: int):
        node = ray.get_runtime_context().get_node_id()
        self.cpus = ray.get(_allocator().take.remote(node, sorted(os.sched_getaffinity(0)), cpus))
        set_process_cpus(self.cpus)
        self.model = Model(artifact, num_threads=cpus, warmup=True)
        self.name = name

    def placement(self) -> dict:
        """This replica's process, its CPUs, and the CPUs its threads may run on (for checks)."""
        return {"pid": os.getpid(), "cpus": self.cpus, "mask": sorted(os.sched_getaffinity(0))}

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.005)
    async def _run(self, feeds: list[dict]) -> list[dict]:
        """Requests with the same input shapes run as one batch (the model pads to a bucket)."""
        names = [s.name for s in self.model.inputs]
        if len(feeds) > 1 and len({tuple(f[n].shape[1:] for n in names) for f in feeds}) == 1:
            joined = self.model.run_tensors({n: np.concatenate([f[n] for f in feeds]) for n in names})
            cuts = np.cumsum([f[names[0]].shape[0] for f in feeds])[:-1]
            parts = {k: np.split(v, cuts) for k, v in joined.items()}
            return [{k: parts[k][i] for k in parts} for i in range(len(feeds))]
        return [self.model.run_tensors(f) for f in feeds]

    async def __call__(self, request):
        from starlette.responses import JSONResponse, Response

        if request.method == "GET":
            return JSONResponse(v2meta.model_metadata(self.name, ["1"], self.model))
        body = await request.body()
        try:
            req = v2codec.decode(
                body, request.headers.get("inference-header-content-length"), self.model.inputs, self.model.outputs
            )
            self.model.select(self.model.validate(req.feed))
            results = await self._run(req.feed)
        except KilnError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        data, header_length = v2codec.encode(req, self.name, "1", results)
        if header_length is None:
            return Response(data, media_type="application/json")
        return Response(
            data, media_type="application/octet-stream", headers={"Inference-Header-Content-Length": str(header_length)}
        )


def deployment(artifact, *, name: str | None = None, num_replicas: int | str = 1, cpus_per_replica: int = 1):
    """A bound Ray Serve application: num_replicas replicas (or "auto" for Ray's autoscaling), each
    with cpus_per_replica CPUs of its own and that many Kiln threads."""
    name = name or Path(artifact).stem
    d = serve.deployment(
        KilnReplica,
        name=f"kiln-{name}",
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
    )
    return d.bind(str(Path(artifact).resolve()), name, cpus_per_replica)
