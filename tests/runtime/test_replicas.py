"""Replicas on one host never share pinned cores: the pool pins its workers only inside a CPU set chosen
for the process (KILN_CPUS, taskset, a cpuset), and KILN_NUM_THREADS sets the threads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from onnx import helper

import kiln
from kiln.runtime.replica import parse_cpus
from tests.helpers import make_model, rand

CHILD = textwrap.dedent(
    """
    import json, sys, numpy as np, kiln
    from pathlib import Path
    m = kiln.load(sys.argv[1])
    for _ in range(5):
        m.run({"x": np.ones((1, 16, 32, 32), np.float32)})
    pinned = []
    for t in Path("/proc/self/task").iterdir():
        if (t / "comm").read_text().strip() == "kiln-pool":
            status = (t / "status").read_text()
            pinned.append(status.split("Cpus_allowed_list:")[1].split()[0])
    print(json.dumps({"threads": m.num_threads, "mask": sorted(__import__("os").sched_getaffinity(0)), "pool": pinned}))
    """
)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    m = make_model(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        {"x": rand(1, 16, 32, 32)},
        ["y"],
        {"w": rand(32, 16, 3, 3, seed=1)},
    )
    p = tmp_path_factory.mktemp("replicas") / "m.kiln"
    kiln.compile(m, p)
    return p


def _replicas(artifact, envs: list[dict]) -> list[dict]:
    import json

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(artifact)], env={**os.environ, **env}, stdout=subprocess.PIPE, text=True
        )
        for env in envs
    ]
    return [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]


def _cpus(lists: list[str]) -> set[int]:
    return set().union(*(parse_cpus(s) for s in lists)) if lists else set()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_two_replicas_with_disjoint_masks_pin_disjoint_cores(artifact):
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    a, b = ",".join(map(str, cpus[:half])), ",".join(map(str, cpus[half:]))
    ra, rb = _replicas(artifact, [{"KILN_CPUS": a, "KILN_NUM_THREADS": "2"}, {"KILN_CPUS": b, "KILN_NUM_THREADS": "2"}])
    assert ra["mask"] == cpus[:half] and rb["mask"] == cpus[half:]
    assert ra["threads"] == rb["threads"] == 2 and ra["pool"] and rb["pool"]  # the pool started workers
    pinned_a, pinned_b = _cpus(ra["pool"]), _cpus(rb["pool"])
    assert pinned_a <= set(ra["mask"]) and pinned_b <= set(rb["mask"]) and not pinned_a & pinned_b


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_replicas_on_the_whole_machine_pin_nothing(artifact):
    """Before: both pinned worker 0 onto the second CPU. Now a worker with every CPU allowed stays unpinned."""
    if len(os.sched_getaffinity(0)) < os.cpu_count():
        pytest.skip("this process is already narrowed to some CPUs")
    ra, rb = _replicas(artifact, [{"KILN_NUM_THREADS": "2"}, {"KILN_NUM_THREADS": "2"}])
    everything = set(range(os.cpu_count()))
    for r in (ra, rb):
        assert r["pool"] and all(_cpus([s]) == everything for s in r["pool"]), r


def test_bad_kiln_cpus_is_an_options_error():
    with pytest.raises(kiln.OptionsError, match="not a CPU list"):
        parse_cpus("two")
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
