"""The README's commands, run as a user runs them after `make demo`: every ```sh / ```bash block of
README.md, in order, in one bash script (so a `cd` or a file made by one block holds for the next),
each ```python block fed to `python -` at its place. .venv/bin is first on PATH and the scratch
folder the tour makes (`mktemp -d`) is under pytest's tmp_path. Only the set-up lines `make demo`
and `make test` are skipped: this test's environment is what they build. The served port is
replaced by a free one, so concurrent runs do not collide."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(sh|bash|python)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SETUP = re.compile(r"^\s*make\s+(demo|test)\b")
PORT = "8080"  # the port the README serves on
LIMIT_S = 600  # a hang (a server that never gets ready) fails the test instead of blocking the suite


def readme_blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def readme_script(text: str, port: int) -> str:
    lines = ["set -euo pipefail"]
    for lang, body in readme_blocks(text):
        if lang == "python":
            lines.append(f"python - <<'KILN_README_PY'\n{body}KILN_README_PY")
        else:
            lines += [line for line in body.splitlines() if not SETUP.match(line)]
    return "\n".join(lines).replace(PORT, str(port)) + "\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_readme_keeps_the_setup_commands():
    blocks = readme_blocks(README.read_text())
    setup = [line.split()[1] for _, body in blocks for line in body.splitlines() if SETUP.match(line)]
    assert "demo" in setup and "test" in setup, "README must show `make demo` and `make test` in a sh block"


def test_readme_commands_run(tmp_path):
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "the README is for users: keep it at most ~250 lines, the guide is in docs/"
    script = tmp_path / "readme.sh"
    script.write_text(readme_script(text, _free_port()))
    venv_bin = ROOT / ".venv" / "bin"
    bin_dir = venv_bin if venv_bin.is_dir() else Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "TMPDIR": str(tmp_path)}
    env.pop("VIRTUAL_ENV", None)
    t = time.perf_counter()
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the served model runs in the background: kill the whole group at the end
    )
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    took = time.perf_counter() - t
    assert proc.returncode == 0, f"README commands failed (rc {proc.returncode}) after {took:.0f} s:\n{out[-6000:]}"
    for made in ("encoder.kiln", "encoder-int8.kiln", "encoder-b.kiln", "out.npz", "served.npz"):
        assert any(tmp_path.rglob(made)), f"the tour did not write {made}:\n{out[-3000:]}"
    assert 'kiln_requests_total{model="encoder-b",version="v1",code="200"} 1' in out, out[-3000:]
