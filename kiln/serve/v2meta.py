"""What the Open Inference Protocol says about the server and its model, from the loaded artifact: server
and model metadata, and Triton's model-configuration and statistics extensions (so Triton's tools,
which read `max_batch_size` and the dims from the config, work unchanged)."""

from __future__ import annotations

from .. import __version__
from ..runtime.model import Model
from .batcher import batch_capacity
from .metrics import Metrics
from .v2codec import datatype

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics"]


def server_metadata() -> dict:
    return {"name": "kiln", "version": __version__, "extensions": EXTENSIONS}


def _dims(specs_per_bucket) -> list[int]:
    """One tensor's shape across the buckets: a dim that differs between them is -1."""
    shapes = [s.shape for s in specs_per_bucket]
    if len({len(s) for s in shapes}) != 1:
        return [-1]
    return [dims[0] if len(set(dims)) == 1 else -1 for dims in zip(*shapes)]


def _tensors(model: Model, side: str) -> list[dict]:
    per_bucket = list(zip(*(getattr(b, side) for b in model.buckets)))
    return [
        {"name": specs[0].name, "datatype": datatype(specs[0].dtype), "shape": _dims(specs)} for specs in per_bucket
    ]


def model_metadata(name: str, versions: list[str], model: Model) -> dict:
    return {
        "name": name,
        "versions": versions,
        "platform": "kiln",
        "inputs": _tensors(model, "inputs"),
        "outputs": _tensors(model, "outputs"),
    }


def max_batch_size(model: Model) -> int:
    """Triton's max_batch_size: the largest batch bucket, 0 when the artifact has no batch axis to vary."""
    cap = batch_capacity(model, 2**31)
    return cap if cap > 1 else 0


def _config_tensor(t: dict, batched: bool) -> dict:
    return {"name": t["name"], "data_type": "TYPE_" + t["datatype"], "dims": t["shape"][batched:]}


def model_config(name: str, model: Model, max_wait_ms: float) -> dict:
    mbs = max_batch_size(model)
    meta = model_metadata(name, [], model)
    config = {
        "name": name,
        "platform": "kiln",
        "backend": "kiln",
        "max_batch_size": mbs,
        "input": [_config_tensor(t, mbs > 0) for t in meta["inputs"]],
        "output": [_config_tensor(t, mbs > 0) for t in meta["outputs"]],
    }
    if mbs:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": int(max_wait_ms * 1e3)}
    return config


def model_stats(name: str, versions: list[str], metrics: Metrics) -> dict:
    stats = []
    for v in versions:
        outcomes = metrics.outcomes(v)
        zero = {"count": 0, "ns": 0}
        stats.append(
            {
                "name": name,
                "version": v,
                "last_inference": metrics.last_inference_ms.get(v, 0),
                "inference_count": metrics.stage_stats(v, "samples")["count"],
                "execution_count": sum(metrics.batch_counts[v]) if v in metrics.batch_counts else 0,
                "inference_stats": {
                    **outcomes,
                    "queue": metrics.stage_stats(v, "queue"),
                    "compute_input": zero,
                    "compute_infer": metrics.stage_stats(v, "compute_infer"),
                    "compute_output": zero,
                },
            }
        )
    return {"model_stats": stats}
