"""The parallel loop over a C kernel's tasks (matmul, attention, conv), written so Kiln's thread pool shares it evenly.

The pool (kiln/runtime/pool.c) cuts a parallel loop into threads x KILN_CHUNKS chunks (8 on two threads), thread i
owning a contiguous share, and TVM's generated code gives each chunk ceil(extent / chunks) iterations. Where the
extent is not a multiple of the chunk count the last chunks come short and one thread owns more tasks than another:
ViT-B's QKV matmul, 36 tasks of one column group each, ran as chunks of 5, 5, 5, 5 | 5, 5, 5, 1 (20 tasks against
16; the idle thread finds no chunk left to take), at 80% of the FMA peak where its other matmuls ran at 88-91%
(benchmarks/history.md). Here the loop runs P iterations, P a multiple of the chunk count, iteration p the tasks
[p U / P, (p + 1) U / P): every chunk then holds its thread's share of the U tasks, give or take one."""

from __future__ import annotations

CHUNKS = 8  # the pool's chunks of a loop on two threads (pool.c's KILN_CHUNKS per thread)
WIDE = 32  # ... on eight threads: P a multiple of this where there are that many tasks


def iterations(tasks: int) -> int:
    """P: the loop's parallel iterations for `tasks` tasks: a multiple of 32 (even shares on up to eight threads)
    where there are that many, else of 8 (two threads), and the tasks themselves where they are fewer than 8 (the
    pool's stealing shares those)."""
    if tasks < CHUNKS:
        return tasks
    return tasks // WIDE * WIDE if tasks >= WIDE else tasks // CHUNKS * CHUNKS


def loop(tasks: int, var: str = "t", indent: str = "    ") -> tuple[str, str]:
    """(the TVMScript loop header(s) binding `var` to each task in turn, the body's indent)."""
    p = iterations(tasks)
    if p == tasks:
        return f"{indent}for {var} in T.parallel({tasks}):\n", indent + "    "
    inner = indent + "    "
    tasks_of_p = f"range(p_ * {tasks} // {p}, (p_ + 1) * {tasks} // {p})"
    head = f"{indent}for p_ in T.parallel({p}):\n{inner}for {var} in {tasks_of_p}:\n"
    return head, inner + "    "


__all__ = ["CHUNKS", "iterations", "loop"]
