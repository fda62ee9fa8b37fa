"""The Open Inference Protocol (KServe V2) over gRPC (`kiln serve --grpc-port`, the `grpc` extra):
inference.GRPCInferenceService's ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and
ModelInfer, on the same event loop as the HTTP server and through the same admission, batcher and
metrics. Tensors come as raw_input_contents or typed contents, and go back as raw_output_contents.
The messages are generated from proto/grpc_predict_v2.proto (KServe's field numbers)."""

from __future__ import annotations

import time

import grpc
import numpy as np

from ..errors import KilnError
from . import v2codec, v2meta
from .proto import grpc_predict_v2_pb2 as pb
from .refused import Refused

SERVICE = "inference.GRPCInferenceService"
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
CONTENTS = {  # V2 datatype -> the InferTensorContents field that holds it
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _param(p: pb.InferParameter):
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def request_doc(req: pb.ModelInferRequest) -> tuple[dict, memoryview]:
    """A gRPC infer request as the HTTP codec's JSON header and binary data, so both are checked alike:
    each raw_input_contents entry becomes a binary input of that many bytes."""
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise Refused(400, f"{len(raw)} raw_input_contents for {len(req.inputs)} inputs: send one per input")
    inputs = []
    for i, t in enumerate(req.inputs):
        doc = {"name": t.name, "shape": list(t.shape), "datatype": t.datatype}
        if raw:
            doc["parameters"] = {"binary_data_size": len(raw[i])}
        else:
            doc["data"] = list(getattr(t.contents, CONTENTS.get(t.datatype, "bytes_contents")))
        inputs.append(doc)
    outputs = [{"name": o.name} for o in req.outputs]
    doc = {"inputs": inputs, **({"outputs": outputs} if outputs else {})}
    return doc, memoryview(b"".join(raw))


def _response(req: pb.ModelInferRequest, version: str, results: dict, order: list[str] | None):
    resp = pb.ModelInferResponse(model_name=req.model_name, model_version=version, id=req.id)
    for name in order or list(results):
        a = np.ascontiguousarray(results[name])
        resp.outputs.add(name=name, datatype=v2codec.datatype(a.dtype), shape=list(a.shape))
        resp.raw_output_contents.append(a.tobytes())
    return resp


class V2Grpc:
    def __init__(self, server):
        self.s = server

    async def server_live(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request, context):
        return pb.ServerReadyResponse(ready=self.s.ready and not self.s.draining)

    async def model_ready(self, request, context):
        await self._known(request.name, request.version or None, context)
        return pb.ModelReadyResponse(ready=self.s.ready and not self.s.draining)

    async def server_metadata(self, request, context):
        return pb.ServerMetadataResponse(**v2meta.server_metadata())

    async def model_metadata(self, request, context):
        version = await self._known(request.name, request.version or None, context)
        if not self.s.ready:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.s.load_error or "the model is still loading")
        model = self.s.models[version or self.s.versions[0]]
        meta = v2meta.model_metadata(request.name, [version] if version else self.s.versions, model)
        return pb.ModelMetadataResponse(**meta)

    async def _known(self, name: str, version: str | None, context) -> str | None:
        if name != self.s.opts.served_name:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no model {name!r}; this server serves {self.s.opts.served_name!r}"
            )
        if version is not None and version not in self.s.versions:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no version {version!r}; the versions are {self.s.versions}"
            )
        return version

    async def model_infer(self, request: pb.ModelInferRequest, context):
        t0, version, status = time.perf_counter(), "-", 500
        self.s.inflight += 1
        try:
            version = self.s.admit(request.model_name, request.model_version or None, request.ByteSize())
            doc, raw = request_doc(request)
            model = self.s.models[version]
            try:
                req = v2codec.decode_doc(doc, raw, model.inputs, model.outputs)
            except KilnError as e:
                raise Refused(400, str(e)) from None
            resp = _response(request, version, await self.s.infer(version, req.feed), req.outputs)
            status = 200
            return resp
        except Refused as e:
            status, version = e.status, e.version or version
            await context.abort(CODES.get(e.status, grpc.StatusCode.INTERNAL), e.message)
        finally:
            self.s.inflight -= 1
            self.s.metrics.request(version, status, time.perf_counter() - t0)


def _unary(fn, request_type, response_type):
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=request_type.FromString, response_serializer=response_type.SerializeToString
    )


async def start_grpc(server, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """A gRPC server on the running loop beside the HTTP one; -> (it, the port it bound)."""
    v2 = V2Grpc(server)
    methods = {
        "ServerLive": _unary(v2.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
        "ServerReady": _unary(v2.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
        "ModelReady": _unary(v2.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
        "ServerMetadata": _unary(v2.server_metadata, pb.ServerMetadataRequest, pb.ServerMetadataResponse),
        "ModelMetadata": _unary(v2.model_metadata, pb.ModelMetadataRequest, pb.ModelMetadataResponse),
        "ModelInfer": _unary(v2.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
    }
    limit = int(server.opts.max_body_mb * 2**20)
    g = grpc.aio.server(options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", -1)])
    g.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    bound = g.add_insecure_port(f"{host}:{port}")
    await g.start()
    return g, bound
