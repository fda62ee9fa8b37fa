"""A `kiln serve` process on loopback for the serving tests: started, waited for, stopped."""

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


class Proc:
    def __init__(self, *args):
        self.p = subprocess.Popen(
            [sys.executable, "-m", "kiln", "serve", "--port", "0", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.line = line = self.p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, (line, self.p.stderr.read() if self.p.poll() is not None else "")
        self.url = f"http://127.0.0.1:{m.group(1)}"
        deadline = time.time() + 60
        while time.time() < deadline:
            code, _, _ = self.get("/healthz")
            if code == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("server never became ready")

    def get(self, path):
        try:
            r = urllib.request.urlopen(self.url + path, timeout=30)
            return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def post(self, path, body, ctype="application/json"):
        req = urllib.request.Request(self.url + path, data=body, headers={"Content-Type": ctype})
        try:
            r = urllib.request.urlopen(req, timeout=30)
            return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def predict(self, x, name="net1", **kw):
        return self.post(f"/v1/models/{name}:predict", json.dumps({"inputs": {"input": x.tolist()}}).encode(), **kw)

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        return self.p.wait(30)
