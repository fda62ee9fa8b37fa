"""wrk (Debian's HTTP load generator, a client no one here wrote) drives `kiln serve` with 8 connections for a second:
every answer is 200 and byte for byte the answer whose outputs equal `kiln.load().run`'s (wrk's Lua checks each
response). --max-batch 1: every request runs alone, on the kernels `kiln.load().run` runs."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from helpers import rand
from serving import Proc

import kiln

WRK = shutil.which("wrk")
pytestmark = pytest.mark.skipif(WRK is None, reason="needs wrk (Debian's package: make test installs it with apt-get)")

LUA = """
local function read(name) local f = io.open(os.getenv(name), "rb"); local s = f:read("*a"); f:close(); return s end
wrk.method, wrk.body = "POST", read("BODY")
wrk.headers["Content-Type"] = "application/json"
local expect = read("EXPECT")
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok, bad = 0, 0 end
function response(status, headers, body)
  if status == 200 and body == expect then ok = ok + 1 else bad = bad + 1 end
end
function done(summary, latency, requests)
  local o, b = 0, 0
  for _, t in ipairs(threads) do o, b = o + t:get("ok"), b + t:get("bad") end
  io.write(string.format("KILN ok=%d bad=%d\\n", o, b))
end
"""


def test_wrk_answers_equal_the_runtime(served, tmp_path):
    x = rand(1, 3, 16, 16, seed=5)
    body = json.dumps({"inputs": {"input": x.tolist()}}).encode()
    s = Proc(served[0], "--max-batch", "1")
    try:
        code, _, expect = s.post("/v1/models/net1:predict", body)
        assert code == 200
        got = np.asarray(json.loads(expect)["outputs"]["output"], np.float32)
        np.testing.assert_allclose(got, kiln.load(served[0]).run({"input": x})["output"], rtol=1e-6, atol=1e-6)
        for name, data in (("body", body), ("expect", expect), ("post.lua", LUA.encode())):
            (tmp_path / name).write_bytes(data)
        env = dict(os.environ, BODY=str(tmp_path / "body"), EXPECT=str(tmp_path / "expect"))
        cmd = [WRK, "-t", "2", "-c", "8", "-d", "1s", "-s", str(tmp_path / "post.lua")]
        run = subprocess.run([*cmd, f"{s.url}/v1/models/net1:predict"], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        m = re.search(r"KILN ok=(\d+) bad=(\d+)", run.stdout)
        assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, run.stdout
    finally:
        s.stop()
