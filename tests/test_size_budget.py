"""The size budget `make lint` runs (tools/size_budget.py): today's tree passes, a new offender fails,
and an allow-list entry that fits the budget now fails too (the list only shrinks)."""

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parent.parent / "tools" / "size_budget.py"
_spec = importlib.util.spec_from_file_location("size_budget", _PATH)
sb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sb)


def test_the_tree_fits_the_budget_and_its_allow_list():
    assert sb.problems(sb.offenders(), sb.allowed()) == []


def test_a_new_offender_and_a_stale_entry_both_fail(tmp_path):
    pkg = tmp_path / "kiln"
    pkg.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(sb.MAX_FUNCTION))
    (pkg / "m.py").write_text(f"class A:\n    def long(self):\n{body}\n")
    sb.REPO, repo = tmp_path, sb.REPO
    try:
        found = sb.offenders(pkg)
    finally:
        sb.REPO = repo
    assert list(found) == ["kiln/m.py::A.long"]
    assert sb.problems(found, set())[0].startswith("kiln/m.py::A.long: ")
    assert "remove it" in sb.problems({}, {"kiln/gone.py::f"})[0]
