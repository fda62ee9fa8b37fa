"""`kiln serve` with sequence buckets: requests of any token length up to the largest bucket are padded into
the smallest bucket that holds them and answered with outputs of their own length, equal to kiln.load().run."""

import json
import re
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from helpers import HIDDEN, VOCAB, text_encoder

import kiln


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("seqserve") / "text.kiln"
    kiln.compile(
        text_encoder(),
        path,
        shape_buckets=["input_ids:1x8,1x16", "attention_mask:1x8,1x16"],
        pad_values=["input_ids=0"],
    )
    p = subprocess.Popen(
        [sys.executable, "-m", "kiln", "serve", str(path), "--port", "0", "--max-batch", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = "http://127.0.0.1:" + re.search(r"http://127\.0\.0\.1:(\d+)", p.stdout.readline()).group(1)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url + "/healthz", timeout=5)
            break
        except OSError:
            time.sleep(0.2)
    yield url, kiln.load(path)
    p.terminate()
    p.wait(timeout=30)


@pytest.mark.parametrize("length", [3, 9, 16])
def test_served_lengths_equal_the_runtime(server, length):
    url, model = server
    rng = np.random.default_rng(length)
    ids = rng.integers(1, VOCAB, (1, length)).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    body = json.dumps({"inputs": {k: v.tolist() for k, v in feed.items()}}).encode()
    req = urllib.request.Request(url + "/v1/models/text:predict", body, {"Content-Type": "application/json"})
    out = np.asarray(json.loads(urllib.request.urlopen(req, timeout=60).read())["outputs"]["output"], np.float32)
    assert out.shape == (1, length, HIDDEN)
    np.testing.assert_allclose(out, model.run(feed)["output"], rtol=1e-5, atol=1e-5)
