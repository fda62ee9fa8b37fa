"""One home for knobs: every KILN_* environment variable is read in kiln/env.py (the thread pool's also in
kiln/runtime/pool.py, which the C++ runner mirrors) and listed in docs/cli.md."""

import re
from pathlib import Path

from kiln import env

ROOT = Path(__file__).resolve().parent.parent
READ_ELSEWHERE = {"kiln/runtime/pool.py"}  # KILN_THREAD_POOL: the runtime's pool, beside the C++ runner


def _declared() -> set[str]:
    return {v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and v.startswith("KILN_")}


def test_every_variable_is_listed_in_the_docs():
    docs = (ROOT / "docs" / "cli.md").read_text()
    assert not {v for v in _declared() if f"`{v}`" not in docs}


def test_no_module_reads_the_environment_for_a_kiln_variable_but_env():
    reads = re.compile(r"os\.environ|getenv")
    offenders = []
    for p in sorted((ROOT / "kiln").rglob("*.py")):
        rel = str(p.relative_to(ROOT))
        text = p.read_text()
        if rel == "kiln/env.py" or rel in READ_ELSEWHERE or not reads.search(text):
            continue
        offenders += [f"{rel}: {n}" for n in sorted(set(re.findall(r"KILN_[A-Z_]+", text)))]
    assert not offenders, "read KILN_* variables in kiln/env.py:\n" + "\n".join(offenders)
    assert {"KILN_THREAD_POOL"} <= _declared()
