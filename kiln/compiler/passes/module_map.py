"""What the rewriting passes share: the loop that applies a rewrite to every Relax function of a
module that is not a fused primitive, into a copy (never mutate the caller's module), the same over every
binding block, and a mutator that replaces the calls a function picks, counting them."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax


def rewrite_functions(mod: tvm.IRModule, rewrite: Callable[[relax.Function], relax.Expr]) -> tvm.IRModule:
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function) and "Primitive" not in (f.attrs or {}):
            out[gv] = rewrite(f)
    return out


def rewrite_blocks(mod: tvm.IRModule, rewrite: Callable) -> tvm.IRModule:
    """rewrite(block) -> block over every binding block of every function rewrite_functions visits."""

    def one(f):
        if not isinstance(f.body, relax.SeqExpr):
            return f
        blocks = [rewrite(blk) for blk in f.body.blocks]
        return relax.Function(f.params, relax.SeqExpr(blocks, f.body.body), f.ret_ty, f.is_pure, f.attrs)

    return rewrite_functions(mod, one)


def block_like(block, bindings: list):
    """A block of `block`'s kind (dataflow or not) holding `bindings`."""
    return (relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock)(bindings)


def rebuilt(block, bindings, replace: dict):
    """The block with `replace` (binding index -> the bindings in its place, [] drops it) applied to its `bindings`
    (the block itself where nothing changed)."""
    if not replace:
        return block
    return block_like(block, [nb for i, b in enumerate(bindings) for nb in replace.get(i, [b])])


def var_like(block):
    """The Var class for new bindings in `block`: DataflowVar inside a dataflow block."""
    return relax.DataflowVar if isinstance(block, relax.DataflowBlock) else relax.Var


@relax.expr_functor.mutator
class CallRewriter(relax.PyExprMutator):
    """Visits calls bottom-up; `rewrite(builder, call)` returns the replacement or None to keep the
    call (with `lookup`: `rewrite(builder, call, lookup_binding)`, to see what a Var argument is bound
    to). `count` says how many it replaced; new functions go through `builder_`."""

    def __init__(self, mod: tvm.IRModule, rewrite: Callable, lookup: bool = False):
        super().__init__(mod)
        self.rewrite, self.lookup = rewrite, lookup
        self.count = 0

    def visit_call_(self, call):
        call = super().visit_call_(call)
        new = (
            self.rewrite(self.builder_, call, self.lookup_binding) if self.lookup else self.rewrite(self.builder_, call)
        )
        if new is None:
            return call
        self.count += 1
        return new


def rewrite_with(
    mod: tvm.IRModule, mutator, prepare: Callable[[relax.Function], None] | None = None
) -> tuple[tvm.IRModule, int]:
    """Run `mutator` (which counts its rewrites in `.count`) over every Relax function that is not a
    fused primitive, `prepare(function)` first when given; returns the new module, holding the
    functions the mutator's builder added, and the count (the caller's module itself when 0)."""

    def one(f):
        if prepare is not None:
            prepare(f)
        return mutator.visit_expr(f)

    out = rewrite_functions(mod, one)
    if not mutator.count:
        return mod, 0
    return keep_added_functions(out, mod, mutator.builder_), mutator.count


def keep_added_functions(out: tvm.IRModule, mod: tvm.IRModule, builder) -> tvm.IRModule:
    """`out` with the functions `builder` (made over `mod`) added that `mod` did not have."""
    had = {gv.name_hint for gv in mod.get_global_vars()}
    for gv, f in builder.get().functions.items():
        if gv.name_hint not in had:
            out[gv] = f
    return out


def rewrite_calls(mod: tvm.IRModule, rewrite: Callable, lookup: bool = False) -> tuple[tvm.IRModule, int]:
    """Replace the calls `rewrite(builder, call)` picks (see CallRewriter) in every Relax function
    that is not a fused primitive; returns the new module, holding the functions the rewrites
    added, and how many calls were replaced (the caller's module itself when none was)."""
    return rewrite_with(mod, CallRewriter(mod, rewrite, lookup))
