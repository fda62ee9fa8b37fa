"""Loop and If around sequences and optionals (sequences.py's walk): a Loop that carries one is unrolled (its
trip count must be static); an If on a constant is inlined; an If on data returns its sequences element by
element (both branches of one length) and its optionals as a bool tensor saying whether the value is there
beside the value (an empty branch's value: zeros of the optional's declared type)."""

from __future__ import annotations

import numpy as np
import onnx

from ..errors import UnsupportedModelError
from .decompose.control_flow import unroll_loop
from .decompose.emitter import Emitter
from .freeze import FLAG
from .onnx_load import to_array
from .sequence_io import Opt, Seq, is_structured


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


class Branches:
    """The control-flow half of sequences._Flattener (which defines run, value, static, sources, emitter)."""

    def loop(self, node, env):
        body = _attr(node, "body")
        from .simplify import outer_refs_of

        involved = (
            any(i in env for i in node.input[2:])
            or any(is_structured(v) for v in list(body.input) + list(body.output))
            or any(r in env for r in outer_refs_of(body))
        )
        if not involved:
            return None
        consts = {}
        for i, what in ((0, "trip count"), (1, "condition")):
            if len(node.input) > i and node.input[i]:
                consts[node.input[i]] = self.static(node, node.input[i], what)
        em = self.emitter(node)
        unroll_loop(node, em, {}, consts, self.where)
        return em.nodes

    def if_(self, node, env):
        from .simplify import inline

        cond = self.value(node.input[0])
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        if cond is not None:
            emitted: list = []
            inline(node, branches["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"], self.consts, emitted)
            return emitted
        results = {}
        for key, g in branches.items():
            local = dict(env)
            for init in g.initializer:
                self.known[init.name] = to_array(init, self.where)
            nodes = self.run(list(g.node), local)
            results[key] = (g, nodes, [local.get(o.name, o.name) for o in g.output])
        if all(isinstance(v, str) for _, _, outs in results.values() for v in outs):
            for g, nodes, _ in results.values():
                del g.node[:]
                g.node.extend(nodes)
            return None
        return self._if_of_structures(node, env, results)

    def _if_of_structures(self, node, env, results):
        (tg, tnodes, touts), (eg, enodes, eouts) = results["then_branch"], results["else_branch"]
        em_t, em_e = self.emitter(node), self.emitter(node)
        pairs: list = []  # (then flat name, else flat name, output name)
        for out, tv, ev in zip(node.output, touts, eouts):
            env_val = self._merge(node, out, tv, ev, em_t, em_e, pairs)
            if not isinstance(env_val, str):
                env[out] = env_val
        for g, nodes, em, side in ((tg, tnodes, em_t, 0), (eg, enodes, em_e, 1)):
            outs = []
            for p in pairs:
                o = f"{p[2]}/{'then' if side == 0 else 'else'}"
                em.nodes.append(onnx.helper.make_node("Identity", [p[side]], [o], name=o))
                outs.append(onnx.helper.make_empty_tensor_value_info(o))
            del g.node[:]
            g.node.extend(nodes + em.nodes)
            del g.output[:]
            g.output.extend(outs)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.output[:] = [p[2] for p in pairs]
        return [new]

    def _merge(self, node, out: str, tv, ev, em_t, em_e, pairs: list):
        """One If output's value from its branches' values, adding flat (then, else, name) triples."""
        if isinstance(tv, str) and isinstance(ev, str):
            pairs.append((tv, ev, out))
            return out
        if isinstance(tv, Seq) and isinstance(ev, Seq):
            if len(tv.items) != len(ev.items):
                self._branch_lengths(node, len(tv.items), len(ev.items))
            names = [f"{out}[{i}]" for i in range(len(tv.items))]
            pairs.extend(zip(tv.items, ev.items, names))
            return Seq(names)
        if isinstance(tv, Opt) or isinstance(ev, Opt):
            tv, ev = (v if isinstance(v, Opt) else Opt(True, v) for v in (tv, ev))
            flags = [
                v.present if isinstance(v.present, str) else em.const(np.array(bool(v.present)), "present")
                for v, em in ((tv, em_t), (ev, em_e))
            ]
            pairs.append((flags[0], flags[1], f"{out}?"))
            tval = tv.value if tv.value is not None else self._placeholder(node, tv, ev, em_t)
            eval_ = ev.value if ev.value is not None else self._placeholder(node, ev, tv, em_e)
            value = self._merge(node, f"{out}.value", tval, eval_, em_t, em_e, pairs)
            return Opt(f"{out}?", value)
        raise UnsupportedModelError(
            f"If output {out!r} is a sequence in one branch and not in the other",
            where=self.where_n(node),
            fix="return values of one type from both branches",
        )

    def _branch_lengths(self, node, a: int, b: int):
        src = self.sources(node.input[0])
        raise UnsupportedModelError(
            f"If returns a sequence of {a} elements in one branch and {b} in the other, on a condition computed "
            "from data: its length would only be known at run time",
            ops=[{"op_type": "If", "node": node.name, "input": node.input[0], "sources": src}],
            where=self.where_n(node),
            fix=f"freeze the condition's input: {FLAG} {src[0]}=VALUE" if src else "make the condition a constant",
        )

    def _placeholder(self, node, empty: Opt, other: Opt, em: Emitter):
        """The value an empty optional carries in its branch: zeros of its declared type, as many as the
        other branch's sequence holds."""
        if other.value is None:
            raise UnsupportedModelError(
                "If whose branches both return empty optionals", where=self.where_n(node), fix="return a value"
            )
        tp = empty.type
        if tp is not None and tp.WhichOneof("value") == "sequence_type":
            tp = tp.sequence_type.elem_type
        t = tp.tensor_type if tp is not None and tp.WhichOneof("value") == "tensor_type" else None
        if t is None or not t.HasField("shape") or not all(d.HasField("dim_value") for d in t.shape.dim):
            raise UnsupportedModelError(
                "an If returns an empty optional in one branch, on a condition computed from data, and the optional's "
                "type gives its value no static shape",
                where=self.where_n(node),
                fix="declare the element shape in the empty Optional's type attribute, or freeze the condition",
            )
        zeros = np.zeros([d.dim_value for d in t.shape.dim], onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
        if isinstance(other.value, Seq):
            return Seq([em.const(zeros, "absent") for _ in other.value.items])
        return em.const(zeros, "absent")
