"""Load generator for `kiln serve`, run by hand. Builds a zoo model, compiles it twice (batch 1 only,
and with batch buckets), starts each server as its own process on loopback, and drives it from
this process with keep-alive HTTP clients (pre-encoded .npz bodies, so the client's own CPU cost
stays small). Every phase is bounded in requests and seconds.

1. Closed loop: C clients each send one request at a time, for each concurrency level: throughput
   and latency percentiles, batch-1 server vs dynamic batching.
2. Overload: open loop at 2x the batching server's measured capacity, 10,000 requests: status
   counts (only 200 and 503 allowed), p99 of the accepted requests, server RSS after 1,000 and
   10,000 requests.

    .venv/bin/python benchmarks/load.py [--model mobilenet_v2] [--shape 1x3x224x224] [--levels 1,2,4,8,16]
        [--requests 400] [--seconds 20] [--overload-requests 10000] [--out benchmarks/load]"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil
from report import save, table

import kiln
from kiln import zoo


class Server:
    def __init__(self, artifact: Path, *args: str):
        self.p = subprocess.Popen(
            [sys.executable, "-m", "kiln", "serve", str(artifact), "--port", "0", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(re.search(r":(\d+)\s", self.p.stdout.readline()).group(1))
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/healthz")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become ready")

    def rss_mb(self) -> float:
        return psutil.Process(self.p.pid).memory_info().rss / 2**20

    def stop(self) -> None:
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(60)


class Client:
    """One keep-alive connection; returns (status, seconds)."""

    def __init__(self, port: int, path: str, body: bytes):
        self.port, self.path, self.body = port, path, body
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def send(self) -> tuple[int, float]:
        t = time.perf_counter()
        try:
            self.conn.request("POST", self.path, self.body, {"Content-Type": "application/x-npz"})
            r = self.conn.getresponse()
            r.read()
            return r.status, time.perf_counter() - t
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            return -1, time.perf_counter() - t


def pct(lat: list[float]) -> dict:
    a = np.asarray(lat) * 1e3 if lat else np.asarray([np.nan])
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 2),
        "p95_ms": round(float(np.percentile(a, 95)), 2),
        "p99_ms": round(float(np.percentile(a, 99)), 2),
    }


def closed_loop(server: Server, path: str, body: bytes, clients: int, requests: int, seconds: float) -> dict:
    results, lock = [], threading.Lock()
    deadline = time.perf_counter() + seconds
    start = time.perf_counter()

    def worker():
        c = Client(server.port, path, body)
        while time.perf_counter() < deadline:
            with lock:
                if len(results) >= requests:
                    return
            r = c.send()
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    wall = time.perf_counter() - start
    ok = [s for code, s in results if code == 200]
    return {"clients": clients, "requests": len(results), "ok": len(ok), "rps": round(len(ok) / wall, 1), **pct(ok)}


def overload(server: Server, path: str, body: bytes, rate: float, requests: int, seconds: float, clients: int) -> dict:
    """Open loop: request i is due at i/rate; `clients` threads send them (a late one goes at once)."""
    results, lock, rss = [], threading.Lock(), {}
    next_i = [0]
    start = time.perf_counter()

    def worker():
        c = Client(server.port, path, body)
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= requests or time.perf_counter() - start > seconds:
                return
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            r = c.send()
            with lock:
                results.append(r)
                n = len(results)
            if n in (1000, requests):
                rss[n] = round(server.rss_mb(), 1)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    rss.setdefault(len(results), round(server.rss_mb(), 1))
    wall = time.perf_counter() - start
    codes: dict[int, int] = {}
    for code, _ in results:
        codes[code] = codes.get(code, 0) + 1
    ok = [s for code, s in results if code == 200]
    return {
        "offered_rps": round(rate, 1),
        "requests": len(results),
        "codes": codes,
        "accepted_rps": round(len(ok) / wall, 1),
        **pct(ok),
        "rss_mb": rss,
        "wall_s": round(wall, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="transformer_encoder")
    ap.add_argument("--shape", default="1x16x128", help="one sample's shape (batch 1)")
    ap.add_argument("--buckets", default="1,2,4,8")
    ap.add_argument("--levels", default="1,2,4,8,16")
    ap.add_argument("--requests", type=int, default=1500, help="per concurrency level")
    ap.add_argument("--seconds", type=float, default=20.0, help="per concurrency level")
    ap.add_argument("--max-wait-ms", default="5")
    ap.add_argument("--overload-requests", type=int, default=10_000)
    ap.add_argument("--overload-seconds", type=float, default=300.0)
    ap.add_argument("--threads", default=None, help="server's TVM threads (default: kiln serve's own default)")
    ap.add_argument("--overload-clients", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/load")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kiln-load-"))
    build, default_shape = zoo.MODELS[a.model]
    name = default_shape.split(":")[0]
    dims = [int(d) for d in a.shape.split("x")]
    onnx_path = tmp / f"{a.model}.onnx"
    onnx.save(build(batch=None), onnx_path)  # symbolic batch: the buckets pin it
    single, batched = tmp / "single.kiln", tmp / "batched.kiln"
    kiln.compile(onnx_path, single, input_shapes=[f"{name}:{a.shape}"])
    kiln.compile(
        onnx_path,
        batched,
        shape_buckets=f"{name}:" + ",".join("x".join(map(str, [int(b)] + dims[1:])) for b in a.buckets.split(",")),
    )
    buf = io.BytesIO()
    np.savez(buf, **{name: np.random.default_rng(0).standard_normal(dims).astype(np.float32)})
    body = buf.getvalue()
    rows = {"model": a.model, "shape": a.shape, "buckets": a.buckets, "closed_loop": [], "overload": None}
    top = a.buckets.split(",")[-1]
    threads = ["--threads", a.threads] if a.threads else []
    for label, art, extra in (
        ("batch-1", single, ["--max-batch", "1", "--max-wait-ms", "0"]),
        ("dynamic batching", batched, ["--max-batch", top, "--max-wait-ms", a.max_wait_ms]),
        ("dynamic batching, no wait", batched, ["--max-batch", top, "--max-wait-ms", "0"]),
    ):
        srv = Server(art, "--queue", "256", *extra, *threads)
        path = f"/v1/models/{art.stem}:predict"
        try:
            for c in (int(x) for x in a.levels.split(",")):
                r = {"server": label, **closed_loop(srv, path, body, c, a.requests, a.seconds)}
                rows["closed_loop"].append(r)
                print(json.dumps(r), flush=True)
        finally:
            srv.stop()
    capacity = max(r["rps"] for r in rows["closed_loop"] if r["server"].startswith("dynamic batching"))
    srv = Server(
        batched,
        "--queue",
        "32",
        "--max-batch",
        a.buckets.split(",")[-1],
        "--max-wait-ms",
        a.max_wait_ms,
        "--timeout-ms",
        "2000",
        *threads,
    )
    try:
        rows["overload"] = {
            "capacity_rps": capacity,
            **overload(
                srv,
                f"/v1/models/{batched.stem}:predict",
                body,
                2 * capacity,
                a.overload_requests,
                a.overload_seconds,
                a.overload_clients,
            ),
        }
        print(json.dumps(rows["overload"]), flush=True)
    finally:
        srv.stop()
    lines = [
        f"`kiln serve` on loopback, {a.model} {a.shape}, batch buckets {a.buckets}, max wait {a.max_wait_ms} ms "
        f"(`benchmarks/load.py`, client in the same 2-core machine).",
        "",
    ]
    lines += table(
        ["server", "clients", "requests", "req/s", "p50 ms", "p95 ms", "p99 ms"],
        [
            [r["server"], r["clients"], r["ok"], r["rps"], r["p50_ms"], r["p95_ms"], r["p99_ms"]]
            for r in rows["closed_loop"]
        ],
    )
    o = rows["overload"]
    lines += [
        "",
        f"Overload: {o['offered_rps']} req/s offered (2x the measured capacity {o['capacity_rps']}), "
        f"{o['requests']} requests: status counts {o['codes']}, accepted {o['accepted_rps']} req/s, "
        f"accepted p50/p99 {o['p50_ms']}/{o['p99_ms']} ms, "
        f"server RSS {o['rss_mb']} MB (after n requests).",
        "",
        "Overload driven by an outside load generator (wrk; V1 JSON and V2 binary, 1 to 240 connections): "
        "[load_wrk.md](load_wrk.md).",
    ]
    save(a.out, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
