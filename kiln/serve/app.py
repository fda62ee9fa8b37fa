"""`kiln serve`: an aiohttp server around one or more loaded artifacts (model versions), speaking
Kiln's V1 routes and the Open Inference Protocol (v2http.py; gRPC beside it with --grpc-port,
v2grpc.py), all through one admission check (Server.admit) and one batcher per version.

aiohttp: a maintained asyncio HTTP stack in one package, with its own server (no ASGI glue), so
the event loop, the batcher and the graceful shutdown live in one place we control.

The server binds first and answers /healthz with 503 until every version is loaded and warmed
up; on SIGTERM/SIGINT it refuses new requests (503), finishes those in flight, and exits."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time

import numpy as np
from aiohttp import web

from .. import env
from ..errors import KilnError
from ..runtime.hostinfo import physical_cores
from ..runtime.model import Model
from ..runtime.replica import apply_cpus, default_threads
from . import codec
from .batcher import Batcher, QueueFull
from .metrics import Metrics
from .options import ServeOptions
from .refused import Refused, error_body
from .v2http import v2_routes


def _v1_error(e: Refused) -> web.Response:
    body = error_body(e.message, e.status)
    return web.Response(body=body, status=e.status, content_type="application/json", headers=e.headers)


class Server:
    def __init__(self, opts: ServeOptions):
        self.opts = opts
        self.metrics = Metrics()
        self.models: dict[str, Model] = {}
        self.batchers: dict[str, Batcher] = {}
        self.ready = False
        self.draining = False
        self.load_error: str | None = None
        self.inflight = 0
        self._rng = random.Random(opts.seed)
        self.versions = [v for v, _ in opts.models]
        self._weights = [opts.weights()[v] for v in self.versions]
        self.app = web.Application(client_max_size=int(opts.max_body_mb * 2**20))
        self.app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/metrics", self.metrics_page),
                web.get("/v1/models", self.list_models),
                web.post("/v1/models/{tail:.+}", self.predict),
                *v2_routes(self),
            ]
        )
        self._runner: web.AppRunner | None = None
        self._grpc = None
        self.port: int | None = None
        self.grpc_port: int | None = None

    # life cycle -------------------------------------------------------------------------------
    async def start(self, reuse_port: bool = False) -> int:
        """A lone server listens at once and loads in the background (/healthz says "loading"). A
        `--workers` child (reuse_port) loads first: the kernel spreads the shared port's connections
        over every listener, so a listening sibling that is still loading would answer 503s."""
        if reuse_port:
            await self._load()
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.opts.host, self.opts.port, reuse_port=reuse_port or None)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.opts.grpc_port is not None:
            from .v2grpc import start_grpc

            self._grpc, self.grpc_port = await start_grpc(self, self.opts.host, self.opts.grpc_port)
        if not reuse_port:
            asyncio.get_running_loop().create_task(self._load())
        return self.port

    @property
    def threads(self) -> int:
        """TVM threads: all cores but one, which the event loop needs (HTTP, decoding, shedding load).
        With every core for TVM the server served fewer requests under load and collapsed under overload
        (TVM's threads plus the event loop oversubscribe the cores; TVM's pool spins): benchmarks/history.md."""
        if self.opts.threads:
            return self.opts.threads
        if env.num_threads():
            return default_threads()
        apply_cpus()
        return max(1, physical_cores() - 1)

    async def _load(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            for version, path in self.opts.models:
                m = await loop.run_in_executor(
                    None,
                    lambda p=path: Model(
                        p, num_threads=self.threads, warmup=self.opts.warmup, trusted_keys=self.opts.trusted_keys
                    ),
                )
                self.models[version] = m
                b = Batcher(m, version, self.metrics, self.opts.max_batch, self.opts.max_wait_ms, self.opts.queue)
                b.start()
                self.batchers[version] = b
            self.ready = True
        except KilnError as e:
            self.load_error = str(e)
        except Exception as e:  # keep serving /healthz with the reason
            self.load_error = f"{type(e).__name__}: {e}"

    async def drain(self, grace_s: float | None = None) -> None:
        """Refuse new requests, wait for those in flight, then close."""
        self.draining = True
        deadline = time.monotonic() + (grace_s if grace_s is not None else self.opts.timeout_ms / 1e3 + 5)
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        for b in self.batchers.values():
            await b.stop()
        if self._runner:
            await self._runner.cleanup()

    # handlers ---------------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        if self.load_error:
            return web.json_response({"status": "failed", "error": self.load_error}, status=503)
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if not self.ready:
            return web.json_response({"status": "warming up"}, status=503, headers={"Retry-After": "1"})
        return web.json_response({"status": "ready", "model": self.opts.served_name, "versions": self.versions})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self.metrics.render(self.opts.served_name),
            content_type="text/plain",
            headers={"X-Prometheus-Format": "0.0.4"},
        )

    async def list_models(self, request: web.Request) -> web.Response:
        share = self.opts.weights()
        return web.json_response(
            {
                "model": self.opts.served_name,
                "ready": self.ready,
                "versions": [
                    {
                        "version": v,
                        "artifact": p,
                        "share": share[v],
                        "buckets": [b.name for b in self.models[v].buckets] if v in self.models else None,
                    }
                    for v, p in self.opts.models
                ],
            }
        )

    def _route(self, tail: str) -> tuple[str | None, str | None]:
        """'name:predict' or 'name/versions/V:predict' -> (name, version or None)."""
        path, sep, verb = tail.rpartition(":")
        if not sep or verb != "predict":
            return None, None
        name, _, rest = path.partition("/versions/")
        return name, (rest or None)

    async def counted(self, handle, request: web.Request, render) -> web.Response:
        """Run one inference request's handler: in flight while it runs (drain waits for it), counted in
        /metrics by the version that served it (request["version"]) and its status; render turns a
        Refused into the protocol's error body."""
        t0 = time.perf_counter()
        status = 500
        self.inflight += 1
        try:
            try:
                response = await handle(request)
            except Refused as e:
                request["version"] = e.version or request.get("version", "-")
                response = render(e)
            status = response.status
            return response
        finally:
            self.inflight -= 1
            self.metrics.request(request.get("version", "-"), status, time.perf_counter() - t0)

    def admit(self, name: str, version: str | None, content_length: int | None) -> str:
        """Decide on the request line and headers alone, before the body is read: the model and version
        exist, the server takes requests, the version's queue has room, the body is not too large.
        -> the version that serves it (the canary split picks one when none is asked for)."""
        if name != self.opts.served_name:
            raise Refused(404, f"no model {name!r}; this server serves {self.opts.served_name!r}")
        if version is not None and version not in self.versions:
            raise Refused(404, f"no version {version!r} of {name!r}; the versions are {self.versions}")
        if self.draining:
            raise Refused(503, "the server is shutting down", retry=True)
        if not self.ready:
            raise Refused(503, self.load_error or "the model is still loading", retry=True)
        version = version or self._pick()
        limit = int(self.opts.max_body_mb * 2**20)
        refused = None
        if self.batchers[version].full():  # shed load before paying for the body: overload stays cheap
            refused = self._queue_full()
        elif content_length is not None and content_length > limit:
            refused = Refused(413, f"body of {content_length} bytes exceeds the limit of {limit} (--max-body-mb)")
        if refused:
            refused.version = version
            raise refused
        return version

    def _pick(self) -> str:
        """The canary split's version for a request that names none (no draw with one version: time saved
        per request, refused ones included; benchmarks/history.md)."""
        return self.versions[0] if len(self.versions) == 1 else self._rng.choices(self.versions, self._weights)[0]

    async def read_body(self, request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = int(self.opts.max_body_mb * 2**20)
            raise Refused(413, f"body exceeds the limit of {limit} bytes (--max-body-mb)") from None

    def _queue_full(self) -> Refused:
        return Refused(503, f"queue full ({self.opts.queue} waiting); retry later", retry=True)

    async def infer(self, version: str, feed: dict) -> dict[str, np.ndarray]:
        """Decoded inputs -> outputs by name, through the version's batcher (V1 and V2 alike)."""
        model = self.models[version]
        try:
            arrays = model.validate(feed)
            model.select(arrays)  # a shape no bucket holds is the client's error, before it queues
        except KilnError as e:
            raise Refused(400, str(e)) from None
        try:
            fut = self.batchers[version].submit(arrays)
        except QueueFull:
            raise self._queue_full() from None
        try:
            outs = await asyncio.wait_for(asyncio.shield(fut), self.opts.timeout_ms / 1e3)
        except TimeoutError:
            fut.cancel()
            raise Refused(504, f"no result within {self.opts.timeout_ms:g} ms (--timeout-ms)") from None
        except KilnError as e:
            raise Refused(400, str(e)) from None
        except Exception as e:
            raise Refused(500, f"internal error: {type(e).__name__}: {e}") from None
        return {s.name: o for s, o in zip(model.outputs, outs)}

    async def predict(self, request: web.Request) -> web.Response:
        return await self.counted(self._predict, request, _v1_error)

    async def _predict(self, request: web.Request) -> web.Response:
        name, version = self._route(request.match_info["tail"])
        if name is None:
            raise Refused(404, f"unknown path {request.path}; POST /v1/models/{self.opts.served_name}:predict")
        version = request["version"] = self.admit(name, version, request.content_length)
        body = await self.read_body(request)
        as_npz = codec.is_npz(request.content_type)
        try:
            feed = codec.decode(body, request.content_type, self.models[version].inputs)
        except KilnError as e:
            raise Refused(400, str(e)) from None
        data, ctype = codec.encode(await self.infer(version, feed), as_npz)
        return web.Response(body=data, content_type=ctype, headers={"X-Kiln-Model-Version": version})


async def _main(opts: ServeOptions, reuse_port: bool, announce) -> None:
    server = Server(opts)
    port = await server.start(reuse_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    announce(
        f"kiln serve: {opts.served_name} ({', '.join(f'{v}={p}' for v, p in opts.models)}) on http://{opts.host}:{port}"
        f"  POST /v1/models/{opts.served_name}:predict"
        + (f"  gRPC on {opts.host}:{server.grpc_port}" if server.grpc_port is not None else "")
    )
    await stop.wait()
    announce("kiln serve: shutting down (finishing requests in flight)")
    await server.drain()


def _announce(line: str) -> None:
    """One write per line: `--workers N` children share the parent's stdout, and print()'s separate
    writes of text and newline interleaved there (two announcements on one line). A pipe write of
    up to PIPE_BUF (4 KiB) bytes is atomic."""
    data = (line + "\n").encode()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a captured or replaced stdout
        print(line, flush=True)
        return
    sys.stdout.flush()
    os.write(fd, data)


def serve(opts: ServeOptions, reuse_port: bool = False, announce=_announce) -> None:
    asyncio.run(_main(opts, reuse_port, announce))


__all__ = ["Server", "serve"]
