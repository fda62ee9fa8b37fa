"""Goodput under overload, driven by an outside load generator: `wrk` (Debian's) against `kiln serve` on
loopback, the zoo encoder with batch buckets 1 and 4, V1 JSON bodies and V2 binary bodies. Capacity is the
accepted req/s at 8 connections; 2x and 30x overload are 16 and 240 connections (wrk is closed-loop: a 503
comes back at once and the connection sends again). Per phase: accepted req/s, 503s, latency of all answers,
server CPU-seconds per accepted request, and how busy the model's thread was (Triton stats' compute time
over the phase's wall time: under overload it should stay as busy as at capacity). Every phase is bounded
by --seconds.

    apt-get install wrk
    .venv/bin/python benchmarks/load_wrk.py [--seconds 5] [--repeat 3] [--src DIR ...] [--out benchmarks/load_wrk]

--src: the Kiln source tree the server runs from (repeatable: compare two trees in one run)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import psutil
from report import save, table

import kiln
from kiln import zoo

LUA = """local f = io.open(os.getenv("BODY"), "rb")
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.headers["Content-Type"] = os.getenv("CTYPE")
local h = os.getenv("HLEN")
if h and h ~= "" then wrk.headers["Inference-Header-Content-Length"] = h end
"""


def bodies(tmp: Path, x: np.ndarray) -> dict:
    v1 = tmp / "v1.json"
    v1.write_text(json.dumps({"inputs": {"input": x.tolist()}}))
    t = {"name": "input", "shape": list(x.shape), "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
    header = json.dumps({"inputs": [t], "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    v2 = tmp / "v2.bin"
    v2.write_bytes(header.encode() + x.tobytes())
    return {
        "V1 JSON": ("/v1/models/enc:predict", v1, "application/json", ""),
        "V2 binary": ("/v2/models/enc/infer", v2, "application/octet-stream", str(len(header))),
    }


def start(artifact: Path, src: str, port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=src)
    cmd = [sys.executable, "-m", "kiln", "serve", str(artifact), "--port", str(port), "--max-batch", "4"]
    # cwd: `python -m` puts the working directory before PYTHONPATH, so from the repository root every --src ran
    # the checkout's own kiln
    p = subprocess.Popen(cmd, env=env, cwd=src, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200:
                return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("server did not become ready")


def compute_ns(port: int) -> int:
    doc = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/enc/stats", timeout=5).read())
    return doc["model_stats"][0]["inference_stats"]["compute_infer"]["ns"]


def wrk(port: int, body: tuple, connections: int, seconds: float, lua: Path) -> dict:
    path, data, ctype, hlen = body
    env = dict(os.environ, BODY=str(data), CTYPE=ctype, HLEN=hlen)
    cmd = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--latency",
        "-s",
        str(lua),
        f"http://127.0.0.1:{port}{path}",
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=seconds + 60)
    out = run.stdout
    if not re.search(r"requests in", out):
        raise RuntimeError(f"wrk failed: {run.stderr or out}")
    total, secs = re.search(r"(\d+) requests in ([\d.]+)s", out).groups()
    non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    return {"total": int(total), "seconds": float(secs), "503": non2xx, "p50": lat.get("50"), "p99": lat.get("99")}


def phase(port: int, proc: psutil.Process, body: tuple, connections: int, seconds: float, lua: Path) -> dict:
    cpu0, ns0, t0 = sum(proc.cpu_times()[:2]), compute_ns(port), time.perf_counter()
    r = wrk(port, body, connections, seconds, lua)
    wall = time.perf_counter() - t0
    cpu, busy = sum(proc.cpu_times()[:2]) - cpu0, (compute_ns(port) - ns0) / 1e9 / wall
    ok = r["total"] - r["503"]
    return {
        "connections": connections,
        "accepted_rps": round(ok / r["seconds"], 1),
        "share_503": round(r["503"] / max(1, r["total"]), 3),
        "p50": r["p50"],
        "p99": r["p99"],
        "cpu_ms_per_ok": round(cpu / max(1, ok) * 1e3, 2),
        "model_busy": round(busy, 2),
    }


def goodput(rows: list[dict], most: int, capacity: int = 8) -> list[str]:
    """Per server and protocol: accepted req/s at `most` connections over `capacity` connections, each round's and
    their median (one round on a shared 2-vCPU host moved by 20-30%: history.md)."""
    by_run: dict = {}  # (server, round, protocol) -> {connections: accepted req/s}
    for r in rows:
        by_run.setdefault((r["server"], r["round"], r["protocol"]), {})[r["connections"]] = r["accepted_rps"]
    ratios: dict = {}
    for (server, _, proto), at in by_run.items():
        if at.get(capacity) and most in at:
            ratios.setdefault((Path(server).name, proto), []).append(at[most] / at[capacity])
    out = [f"Goodput: accepted req/s at {most} connections over {capacity}, per round (median):", ""]
    for (server, proto), v in ratios.items():
        out.append(f"- {server}, {proto}: {', '.join(f'{x:.0%}' for x in v)} (median {float(np.median(v)):.0%})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--levels", default="1,8,16,240", help="connections; 8 is capacity, 16 2x, 240 30x")
    ap.add_argument("--src", action="append", default=None, help="Kiln source tree for the server (repeatable)")
    ap.add_argument("--out", default="benchmarks/load_wrk")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every row; the summary gives each round's goodput and the median",
    )
    a = ap.parse_args(argv)
    srcs = a.src or [str(Path(__file__).resolve().parents[1])]
    tmp = Path(tempfile.mkdtemp(prefix="kiln-wrk-"))
    build, _ = zoo.MODELS["transformer_encoder"]
    onnx.save(build(batch=None), tmp / "enc.onnx")
    kiln.compile(tmp / "enc.onnx", tmp / "enc.kiln", shape_buckets="input:1x16x128,4x16x128")
    x = np.random.default_rng(0).standard_normal((1, 16, 128)).astype(np.float32)
    lua = tmp / "post.lua"
    lua.write_text(LUA)
    rows = []
    for i, src in enumerate(srcs):
        port = 18700 + i
        p = start(tmp / "enc.kiln", src, port)
        try:
            for rnd in range(a.repeat):
                for proto, body in bodies(tmp, x).items():
                    for c in map(int, a.levels.split(",")):
                        r = phase(port, psutil.Process(p.pid), body, c, a.seconds, lua)
                        r = {"server": src, "round": rnd + 1, "protocol": proto, **r}
                        rows.append(r)
                        print(json.dumps(r), flush=True)
        finally:
            p.terminate()
            p.wait(60)
    cpu = (Path("/proc/cpuinfo").read_text().split("model name")[1].split(":")[1].split("\n")[0]).strip()
    lines = [
        f"`kiln serve` driven by wrk on loopback (client on the same machine: {cpu}, {os.cpu_count()} vCPU, "
        f"shared), zoo transformer_encoder 1x16x128, batch buckets 1 and 4, --max-batch 4, queue 64, "
        f"{a.seconds:g} s per row (`benchmarks/load_wrk.py --seconds {a.seconds:g} --repeat {a.repeat}`). Capacity: 8 "
        "connections; 16 = 2x, 240 = 30x.",
        "",
    ]
    lines += table(
        ["server", "round", "protocol", "connections", "accepted req/s", "503 share", "p50", "p99", "CPU ms/ok"]
        + ["model busy"],
        [
            [Path(r["server"]).name, r["round"], r["protocol"], r["connections"], r["accepted_rps"], r["share_503"]]
            + [r["p50"], r["p99"], r["cpu_ms_per_ok"], r["model_busy"]]
            for r in rows
        ],
    )
    lines += ["", *goodput(rows, max(map(int, a.levels.split(","))))]
    save(a.out, rows, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
