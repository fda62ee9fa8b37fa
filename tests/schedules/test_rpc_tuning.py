"""Tuning on remote devices through TVM's own RPC tracker: a tracker and two servers on loopback,
candidates measured on both; one server killed mid-run costs only its in-flight candidates; the
records apply to `kiln compile`."""

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import helper

import kiln
from kiln.compiler import CompileOptions
from kiln.compiler.tune import tune
from kiln.errors import OptionsError
from kiln.schedules.tuning.database import open_database, target_key
from kiln.schedules.tuning.tuning import TuneOptions

pytest.importorskip("tornado")  # TVM's tracker needs it (dev dependency)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# TVM's tracker and server modules, run after `import kiln` so that TVM imports without torch (4 s less each)
RUN_MODULE = (
    "import kiln, runpy, sys; sys.argv[0] = sys.argv[1]; del sys.argv[1]; "
    "runpy.run_module(sys.argv[0], run_name='__main__')"
)


def _start(args) -> subprocess.Popen:
    env = dict(os.environ, TVM_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-c", RUN_MODULE, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the server and its worker processes
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


def _free(port: int, key: str) -> int:
    from tvm import rpc

    try:
        return rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get(key, {}).get("free", 0)
    except Exception:
        return -1


@pytest.fixture
def tracker_with_two_servers():
    port = _port()
    procs = [
        _start(
            [
                "tvm.exec.rpc_tracker",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--port-end",
                str(port + 1),
                "--silent",
            ]
        )
    ]
    try:
        deadline = time.time() + 60
        while _free(port, "kiln-test") < 0 and time.time() < deadline:
            time.sleep(0.5)
        servers = [
            _start(
                [
                    "tvm.exec.rpc_server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(_port()),
                    "--port-end",
                    "65000",
                    "--tracker",
                    f"127.0.0.1:{port}",
                    "--key",
                    "kiln-test",
                    "--silent",
                ]
            )
            for _ in range(2)
        ]
        procs += servers
        while _free(port, "kiln-test") < 2 and time.time() < deadline:
            time.sleep(0.5)
        assert _free(port, "kiln-test") == 2, "the RPC servers did not register"
        yield port, servers
    finally:
        for p in procs:
            _stop(p)


def test_tuning_over_rpc_survives_a_dead_server(tmp_path, tracker_with_two_servers):
    port, servers = tracker_with_two_servers
    x = rand(1, 16, 8, 8)
    model = make_model(
        [
            helper.make_node("Conv", ["input", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["output"]),
        ],
        {"input": x},
        ["output"],
        {"w": rand(16, 16, 3, 3, seed=1) * 0.2},
    )
    co = CompileOptions.make()
    lines = []

    def progress(line):
        lines.append(line)
        if line.startswith("round 1:"):
            _stop(servers[0])  # a device dies mid-run: the next rounds go to the other one

    r = tune(
        model,
        co,
        TuneOptions(
            db_root=str(tmp_path), trials=16, round_trials=8, rpc_tracker=f"127.0.0.1:{port}", rpc_key="kiln-test"
        ),
        progress=progress,
    )
    assert r["devices"] == 2 and "measuring on 2 device(s)" in lines[0]
    assert sum(1 for l in lines if l.startswith("round")) >= 2  # it went on after the server died
    db = tmp_path / target_key(co.target)
    recs = open_database(db).get_all_tuning_records()
    ok = [rec for rec in recs if rec.run_secs and all(float(s) < 1e9 for s in rec.run_secs)]
    assert len(ok) >= 8  # measured candidates from both rounds (failed ones are recorded as failures)
    out = kiln.compile(model, tmp_path / "t.kiln", tuning_db=str(tmp_path))
    assert out.report["tuned_kernels"] >= 1
    np.testing.assert_allclose(
        kiln.load(tmp_path / "t.kiln").run({"input": x})["output"],
        ort_run(model, {"input": x})[0],
        rtol=1e-4,
        atol=1e-4,
    )


def test_rpc_errors(tmp_path):
    with pytest.raises(OptionsError, match="go together"):
        TuneOptions(trials=1, rpc_tracker="127.0.0.1:1")
    with pytest.raises(OptionsError, match="HOST:PORT"):
        TuneOptions(trials=1, rpc_tracker="nohost", rpc_key="k")
    with pytest.raises(OptionsError, match="cannot reach the RPC tracker"):
        tune(
            make_model([helper.make_node("Relu", ["input"], ["output"])], {"input": rand(1, 4)}, ["output"]),
            CompileOptions.make(),
            TuneOptions(db_root=str(tmp_path), trials=1, rpc_tracker=f"127.0.0.1:{_port()}", rpc_key="k"),
        )
