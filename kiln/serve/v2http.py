"""The Open Inference Protocol (KServe V2) over HTTP, beside the V1 routes: health, server and model
metadata, readiness, infer (JSON and binary tensors), and Triton's config and statistics extensions.
Infer requests go through the server's own admission, batcher, canary split and metrics (Server.admit,
Server.infer), so V1 and V2 clients share one queue bound. Errors are V2's `{"error": "..."}`."""

from __future__ import annotations

from aiohttp import web

from ..errors import KilnError
from . import v2codec, v2meta
from .refused import Refused, error_body

MODEL = "/v2/models/{model}"
VERSIONED = "/v2/models/{model}/versions/{version}"


def v2_error(e: Refused) -> web.Response:
    return web.Response(body=error_body(e.message), status=e.status, content_type="application/json", headers=e.headers)


class V2:
    def __init__(self, server):
        self.s = server

    def _model(self, request: web.Request) -> tuple[str, str | None]:
        """The model and version a path names, both known: else Refused(404)."""
        name, version = request.match_info["model"], request.match_info.get("version")
        if name != self.s.opts.served_name:
            raise Refused(404, f"no model {name!r}; this server serves {self.s.opts.served_name!r}")
        if version is not None and version not in self.s.versions:
            raise Refused(404, f"no version {version!r} of {name!r}; the versions are {self.s.versions}")
        return name, version

    def _loaded(self, version: str | None):
        if not self.s.ready:
            raise Refused(503, self.s.load_error or "the model is still loading", retry=True)
        return self.s.models[version or self.s.versions[0]]

    # health and metadata ----------------------------------------------------------------------
    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(v2meta.server_metadata())

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        ok = self.s.ready and not self.s.draining
        return web.json_response({"ready": ok}, status=200 if ok else 400)  # V2: 4xx when not ready

    async def model_ready(self, request: web.Request) -> web.Response:
        return await _answer(self._model_ready, request)

    async def _model_ready(self, request: web.Request) -> web.Response:
        name, _ = self._model(request)
        ok = self.s.ready and not self.s.draining
        return web.json_response({"name": name, "ready": ok}, status=200 if ok else 400)

    async def model_metadata(self, request: web.Request) -> web.Response:
        return await _answer(self._model_metadata, request)

    async def _model_metadata(self, request: web.Request) -> web.Response:
        name, version = self._model(request)
        versions = [version] if version else self.s.versions
        return web.json_response(v2meta.model_metadata(name, versions, self._loaded(version)))

    async def config(self, request: web.Request) -> web.Response:
        return await _answer(self._config, request)

    async def _config(self, request: web.Request) -> web.Response:
        name, version = self._model(request)
        return web.json_response(v2meta.model_config(name, self._loaded(version), self.s.opts.max_wait_ms))

    async def stats(self, request: web.Request) -> web.Response:
        return await _answer(self._stats, request)

    async def _stats(self, request: web.Request) -> web.Response:
        name, version = self._model(request)
        return web.json_response(v2meta.model_stats(name, [version] if version else self.s.versions, self.s.metrics))

    # inference --------------------------------------------------------------------------------
    async def infer(self, request: web.Request) -> web.Response:
        return await self.s.counted(self._infer, request, v2_error)

    async def _infer(self, request: web.Request) -> web.Response:
        name, version = request.match_info["model"], request.match_info.get("version")
        version = request["version"] = self.s.admit(name, version, request.content_length)
        body = await self.s.read_body(request)
        model = self.s.models[version]
        try:
            req = v2codec.decode(
                body, request.headers.get("Inference-Header-Content-Length"), model.inputs, model.outputs
            )
        except KilnError as e:
            raise Refused(400, str(e)) from None
        data, header_length = v2codec.encode(req, name, version, await self.s.infer(version, req.feed))
        headers = {"X-Kiln-Model-Version": version}
        if header_length is None:
            return web.Response(body=data, content_type="application/json", headers=headers)
        headers["Inference-Header-Content-Length"] = str(header_length)
        return web.Response(body=data, content_type="application/octet-stream", headers=headers)


async def _answer(handle, request: web.Request) -> web.Response:
    try:
        return await handle(request)
    except Refused as e:
        return v2_error(e)


def v2_routes(server) -> list:
    v2 = V2(server)
    routes = [
        web.get("/v2", v2.server_metadata),
        web.get("/v2/health/live", v2.live),
        web.get("/v2/health/ready", v2.ready),
    ]
    for base in (MODEL, VERSIONED):
        routes += [
            web.get(base, v2.model_metadata),
            web.get(base + "/ready", v2.model_ready),
            web.get(base + "/config", v2.config),
            web.get(base + "/stats", v2.stats),
            web.post(base + "/infer", v2.infer),
        ]
    return routes
