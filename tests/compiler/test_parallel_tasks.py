"""The C kernels' parallel loops (kiln/compiler/parallel_tasks.py): every task runs once, and Kiln's thread pool,
cutting the loop as kiln/runtime/pool.c and TVM's generated code do, gives each thread its share give or take one
task. The plain loop of 36 tasks (ViT-B's QKV matmul) gave two threads 20 and 16; timings in benchmarks/history.md."""

import re

import numpy as np
from helpers import make_model, rand
from onnx import helper

import kiln
from kiln.compiler import parallel_tasks
from kiln.compiler.passes.bf16_matmul_kernel import F32, kernel_func

CHUNKS_PER_THREAD = 4  # pool.c's KILN_CHUNKS


def _tasks_of(header: str, tasks: int) -> list[list[int]]:
    """The tasks each parallel iteration of `header` runs (evaluating its range as TVMScript writes it)."""
    p = int(re.search(r"T\.parallel\((\d+)\)", header).group(1))
    if p == tasks:
        return [[t] for t in range(p)]
    lo, hi = re.search(r"range\((.*), (.*)\):", header).groups()
    return [list(range(eval(lo, {"p_": i}), eval(hi, {"p_": i}))) for i in range(p)]


def _per_thread(per_iteration: list[list[int]], threads: int) -> list[int]:
    """Tasks each thread owns: the pool asks for threads x KILN_CHUNKS chunks, the generated code gives chunk c the
    iterations [c * step, (c + 1) * step), step = ceil(P / chunks), and thread i owns chunks [4 i, 4 i + 4)."""
    chunks = threads * CHUNKS_PER_THREAD
    step = -(-len(per_iteration) // chunks)
    owned = [0] * threads
    for c in range(chunks):
        owned[c // CHUNKS_PER_THREAD] += sum(len(t) for t in per_iteration[c * step : (c + 1) * step])
    return owned


def test_every_task_once_and_the_threads_evenly():
    for tasks in [*range(1, 70), 72, 96, 98, 108, 144, 378, 1000]:
        header, _ = parallel_tasks.loop(tasks)
        per_iteration = _tasks_of(header, tasks)
        assert sorted(t for ts in per_iteration for t in ts) == list(range(tasks)), tasks
        for threads in (1, 2, 4, 8):  # 8 or more tasks: even on two threads; 32 or more: on eight too
            if tasks >= (parallel_tasks.CHUNKS if threads <= 2 else parallel_tasks.WIDE):
                owned = _per_thread(per_iteration, threads)
                assert max(owned) - min(owned) <= 1, (tasks, threads, owned)


def test_the_plain_loop_was_uneven():
    """What the loop corrects: 36 tasks as one parallel loop give two threads 20 and 16 tasks."""
    assert _per_thread([[t] for t in range(36)], 2) == [20, 16]
    assert parallel_tasks.iterations(36) == 32 and parallel_tasks.iterations(12) == 8


def test_the_matmul_kernel_loop_is_balanced():
    """ViT-B's QKV matmul (197 x 768 x 2304): 36 column tasks in 32 parallel iterations."""
    script = kernel_func([197, 768], 768, 2304, False, kt=F32).script()
    assert "T.parallel(32)" in script and "p_ * 36 // 32" in script


def test_balanced_matmul_matches_numpy(tmp_path):
    """A matmul of 9 column tasks (576 columns in groups of 4 blocks of 16) and 13 rows, on the host's kernel."""
    x, w, b = rand(1, 13, 48), rand(48, 576, seed=1), rand(576, seed=2)
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["output"])]
    model = make_model(nodes, {"input": x}, ["output"], {"w": w, "b": b})
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    kiln.compile(tmp_path / "m.onnx", tmp_path / "m.kiln")
    got = kiln.load(tmp_path / "m.kiln").run({"input": x})["output"]
    np.testing.assert_allclose(got, x @ w + b, rtol=1e-4, atol=1e-4)
