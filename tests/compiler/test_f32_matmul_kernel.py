"""F32MatmulKernel: which targets put float32 matmuls by constant weights on Kiln's fp32 C kernel (AVX-512 only;
structural, compiled for pinned targets on any host), and how its tasks split the work. Numerics on the host:
tests/compiler/test_ragged_rows.py."""

import pytest
from helpers import make_model, rand
from onnx import helper

from kiln.compiler.optimize import optimize
from kiln.compiler.options import CompileOptions
from kiln.compiler.passes.bf16_matmul_kernel import tasks
from kiln.frontends.importer import import_onnx


def _matmul(rows: int, k: int, n: int):
    nodes = [helper.make_node("MatMul", ["input", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["output"])]
    return make_model(nodes, {"input": rand(1, rows, k)}, ["output"], {"w": rand(k, n, seed=1), "b": rand(n, seed=2)})


@pytest.mark.parametrize(
    "target, taken",
    [("llvm -mcpu=znver4", 1), ("llvm -mcpu=sapphirerapids", 1), ("llvm -mcpu=haswell", 0), ("llvm -mcpu=znver3", 0)],
)
def test_avx512_targets_take_fp32_matmuls(target, taken):
    report = optimize(import_onnx(_matmul(31, 64, 96)).mod, CompileOptions.make(target=target)).report
    assert report["f32_kernel_matmuls"] == taken
    assert report["dense_packed"] == 1 - taken  # what the C kernel leaves, PackDenseWeights packs for TVM's schedule


def test_bf16_kernel_takes_them_first_under_bf16():
    opts = CompileOptions.make(target="llvm -mcpu=znver4", precision="bf16")
    report = optimize(import_onnx(_matmul(31, 64, 96)).mod, opts).report
    assert report["bf16_kernel_matmuls"] == 1 and report["f32_kernel_matmuls"] == 0


def _tasks(m: int, k: int, n: int):
    return tasks(m, n // 16, k)


def test_tasks_take_several_column_groups_where_x_is_past_l2():
    rows, col_tasks, tile, per = _tasks(1500, 384, 1536)  # Whisper-tiny's FFN-up: x 2.3 MB, a group 98 KB
    assert per > 1 and col_tasks % 2 == 0 and rows == 1500
    assert _tasks(17, 768, 768)[3] == 1  # x in L2: one group per task, 12 tasks
    assert _tasks(1500, 1536, 384)[:2] == (750, 6)  # 6 groups: the rows split too, 12 tasks


def test_tasks_stay_even_for_two_threads():
    for m, k, n in [(1500, 384, 1152), (197, 768, 3072), (577, 768, 2304), (1500, 512, 2048)]:
        rows, col_tasks, _, _ = _tasks(m, k, n)
        assert (col_tasks * -(-m // rows)) % 2 == 0
