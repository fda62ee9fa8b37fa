"""ONNX sequences and optionals of static length, flattened into tensors before anything else sees the
graph (Kiln compiles ahead of time: a sequence is its elements, a fixed number of tensors once inputs are
pinned). One walk over the graph keeps, per sequence-valued name, the tensor names of its elements (Seq),
and per optional, whether it holds a value (Opt: statically, or by a bool tensor computed at run time)
and that value. Sequence ops become what they select (SequenceAt: an Identity, SequenceLength: a
constant, ConcatFromSequence: a Concat); SequenceMap and a Loop that carries a sequence are unrolled
(their lengths and trip counts are static), an If on a constant is inlined and an If on data returns its
sequences element by element. The graph's sequence and optional outputs become tensor outputs (`y[0]`,
`y[1]`, ...; sequence_io.py records the structure for the runtime).

What cannot be static is refused by name, with the graph inputs it depends on (a trip count, a position
or a split fed at run time): the sequence's length or an element's shape would only be known when it runs."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import onnx

from ..errors import UnsupportedModelError
from .constant_inputs import reachable
from .decompose.control_flow import inline_body, unsqueeze
from .decompose.emitter import Emitter
from .decompose.sequences import split_to_sequence
from .freeze import FLAG
from .onnx_load import to_array
from .sequence_branches import Branches
from .sequence_io import Opt, Seq, is_structured, write_structure

HANDLED = frozenset(
    {
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceInsert",
        "SequenceErase",
        "SequenceAt",
        "SequenceLength",
        "ConcatFromSequence",
        "SplitToSequence",
        "SequenceMap",
        "Optional",
        "OptionalHasElement",
        "OptionalGetElement",
    }
)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def needs_flattening(model: onnx.ModelProto, seeds: dict) -> bool:
    def walk(g):
        for n in g.node:
            if n.op_type in HANDLED:
                return True
            for a in n.attribute:
                for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                    if walk(sub) or any(is_structured(v) for v in list(sub.input) + list(sub.output)):
                        return True
        return False

    return bool(seeds) or any(is_structured(o) for o in model.graph.output) or walk(model.graph)


def flatten_sequences(model: onnx.ModelProto, seeds: dict, in_structure: dict, where: str) -> None:
    """Rewrite the model (in place) into tensors only; record its I/O structure in its metadata."""
    if not needs_flattening(model, seeds):
        return
    f = _Flattener(model, where)
    env = dict(seeds)
    g = model.graph
    nodes = f.run(list(g.node), env, top=True)
    outputs, structure = [], []
    for vi in g.output:
        v = env.get(vi.name)
        if v is None:
            outputs.append(vi)
            structure.append((vi.name, vi.name))
            continue
        elem = _elem_type(vi.type)
        node = f.flat_output(vi.name, v, elem, outputs, nodes)
        structure.append((vi.name, node))
    del g.node[:]
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend(outputs)
    del g.value_info[:]
    from .simplify import write_constants

    write_constants(g, f.consts)
    write_structure(model, in_structure, structure)


def _elem_type(tp: onnx.TypeProto) -> int:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tp.tensor_type.elem_type
    if kind in ("sequence_type", "optional_type"):
        return _elem_type(getattr(tp, kind).elem_type)
    return onnx.TensorProto.UNDEFINED


class _Flattener(Branches):
    def __init__(self, model: onnx.ModelProto, where: str):
        self.model, self.where = model, where
        self.consts = {i.name: to_array(i, where) for i in model.graph.initializer}
        self.known: dict = {}  # values computed here for kept nodes (their nodes still produce them)
        self.producer: dict = {}
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        self.opset = self.opsets.get("", self.opsets.get("ai.onnx", 13))
        self.inputs = {i.name for i in model.graph.input}
        self.top: list = []
        self.n = 0

    # ------------------------------------------------------------------------------------------ the walk

    def run(self, nodes: list, env: dict, top: bool = False) -> list:
        out = self.top if top else []
        queue = collections.deque(nodes)
        while queue:
            node = queue.popleft()
            emitted = self.step(node, env) if node.domain in ("", "ai.onnx") else None
            if emitted is None:
                self.keep(node, env, out)
            else:
                queue.extendleft(reversed(emitted))
        return out

    def emitter(self, node) -> Emitter:
        self.n += 1
        em = Emitter(f"{node.name or node.op_type}/seq{self.n}", self.consts)
        em.opset = self.opset
        return em

    def where_n(self, node) -> str:
        return f"{self.where}: node {node.name or node.op_type!r}"

    def keep(self, node, env: dict, out: list) -> None:
        bad = [i for i in node.input if i in env]
        if bad:
            raise UnsupportedModelError(
                f"{node.op_type} takes the sequence or optional {bad[0]!r}, which Kiln represents only for the "
                "sequence ops (SequenceAt, SequenceInsert, ConcatFromSequence, SequenceMap, ...)",
                where=self.where_n(node),
                fix="read the sequence's elements with SequenceAt or ConcatFromSequence before this op",
            )
        for o in node.output:
            if o:
                self.producer[o] = node
        out.append(node)

    def step(self, node, env: dict):
        """The nodes that replace node (processed next), or None to keep it."""
        op = node.op_type
        if op == "Identity" and node.input[0] in env:
            env[node.output[0]] = env[node.input[0]]
            return []
        if op == "If":
            return self.if_(node, env)
        if op == "Loop":
            return self.loop(node, env)
        handler = getattr(self, "op_" + op, None)
        return handler(node, env) if handler is not None and op in HANDLED else None

    # ------------------------------------------------------------------------------------------ constants

    def value(self, name: str):
        """The value of a tensor known at compile time, or None."""
        if not name:
            return None
        for table in (self.consts, self.known):
            if name in table:
                return np.asarray(table[name])
        node = self.producer.get(name)
        if node is None or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
        ):
            return None
        from .simplify import NONDETERMINISTIC, eval_node

        if node.op_type in NONDETERMINISTIC or node.domain not in ("", "ai.onnx"):
            return None
        feeds = {}
        for i in node.input:
            if i:
                v = self.value(i)
                if v is None or v.size > 4096:
                    return None
                feeds[i] = v
        with warnings.catch_warnings():  # a value it cannot fold stays for TVM: simplify.py warns of it later
            warnings.simplefilter("ignore")
            values = eval_node(node, feeds, self.opsets, {}, self.where)
        if values is None:
            return None
        self.known.update({o: v for o, v in zip(node.output, values) if o})
        return self.known.get(name)

    def sources(self, name: str) -> list[str]:
        """The graph inputs a value is computed from."""
        producer = self.producer
        return sorted(reachable(name, self.inputs, lambda v: () if v not in producer else producer[v].input))

    def static(self, node, name: str, what: str):
        v = self.value(name)
        if v is not None:
            return v
        src = self.sources(name)
        hint = f"freeze it: {FLAG} {src[0]}=VALUE if it is known when you deploy" if src else "make it a constant"
        raise UnsupportedModelError(
            f"{node.op_type}'s {what} {name!r} is computed from data: the sequence's length or its elements' shapes "
            "would only be known at run time (Kiln compiles sequences of static length)",
            ops=[{"op_type": node.op_type, "node": node.name, "input": name, "sources": src}],
            where=self.where_n(node),
            fix=hint,
        )

    def seq(self, node, env: dict, name: str) -> Seq:
        v = env.get(name)
        if isinstance(v, Opt):
            v = v.value
        if not isinstance(v, Seq):
            raise UnsupportedModelError(
                f"{node.op_type} input {name!r} is not a sequence Kiln can follow (an empty optional, or a value "
                "made by an op Kiln does not represent sequences for)",
                where=self.where_n(node),
                fix="build the sequence with SequenceConstruct/SequenceInsert/SplitToSequence from tensors",
            )
        return v

    # ------------------------------------------------------------------------------------------ sequence ops

    def op_SequenceConstruct(self, node, env):
        env[node.output[0]] = Seq(node.input)
        return []

    def op_SequenceEmpty(self, node, env):
        env[node.output[0]] = Seq(())
        return []

    def _position(self, node, env, default: int | None):
        if len(node.input) < (3 if node.op_type == "SequenceInsert" else 2) or not node.input[-1]:
            return default
        return int(self.static(node, node.input[-1], "position").reshape(-1)[0])

    def op_SequenceInsert(self, node, env):
        s = list(self._seq(node, env, 0).items)
        pos = self._position(node, env, len(s))
        t = node.input[1]
        if t in env:
            raise UnsupportedModelError(
                "sequences of sequences are not supported", where=self.where_n(node), fix="insert tensors only"
            )
        s.insert(pos, t)
        env[node.output[0]] = Seq(s)
        return []

    def op_SequenceErase(self, node, env):
        s = list(self._seq(node, env, 0).items)
        pos = self._position(node, env, -1)
        del s[pos]
        env[node.output[0]] = Seq(s)
        return []

    def op_SequenceAt(self, node, env):
        s = self._seq(node, env, 0).items
        if self.value(node.input[1]) is None and self._same_shapes(s):  # one shape: stacked, then gathered
            em = self.emitter(node)
            stacked = em.op("Concat", [unsqueeze(em, x, 0) for x in s], axis=0)
            em.op("Gather", [stacked, em.reshape(node.input[1], [])], out=node.output[0], axis=0)
            return em.nodes
        pos = int(self.static(node, node.input[1], "position").reshape(-1)[0])
        if not -len(s) <= pos < len(s):
            raise UnsupportedModelError(
                f"SequenceAt position {pos} is outside the sequence of {len(s)} elements",
                where=self.where_n(node),
                fix="check the position against the sequence's length",
            )
        return [onnx.helper.make_node("Identity", [s[pos]], [node.output[0]], name=node.name)]

    def _same_shapes(self, items) -> bool:
        shapes = self.shapes() if items else {}
        return bool(items) and all(x in shapes for x in items) and len({shapes[x] for x in items}) == 1

    def op_SequenceLength(self, node, env):
        self.consts[node.output[0]] = np.array(len(self._seq(node, env, 0).items), np.int64)
        return []

    def op_ConcatFromSequence(self, node, env):
        s = self._seq(node, env, 0).items
        if not s:
            raise UnsupportedModelError(
                "ConcatFromSequence of an empty sequence", where=self.where_n(node), fix="concatenate at least one"
            )
        em = self.emitter(node)
        axis = _attr(node, "axis", 0)
        parts = list(s)
        if _attr(node, "new_axis", 0):
            parts = [unsqueeze(em, p, axis) for p in parts]
        if len(parts) == 1:
            em.op("Identity", parts, out=node.output[0])
        else:
            em.op("Concat", parts, out=node.output[0], axis=axis)
        return em.nodes

    def op_SplitToSequence(self, node, env):
        em = self.emitter(node)
        split = node.input[1] if len(node.input) > 1 and node.input[1] else ""
        consts = dict(self.consts)
        if split:
            v = self.value(split)
            if v is not None:
                consts[split] = v
        split_to_sequence(node, em, self.shapes(), consts, self.where, runtime_split=self._runtime_split(node))
        return em.nodes

    def _runtime_split(self, node):
        """The error for a split fed at run time that is a scalar (a run-time number of elements)."""

        def refuse():
            self.static(node, node.input[1], "split")

        return refuse

    def shapes(self) -> dict:
        from .simplify import static_shapes, write_constants

        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        del m.graph.node[:]
        m.graph.node.extend(self.top)
        del m.graph.output[:]
        del m.graph.value_info[:]
        write_constants(m.graph, dict(self.consts))
        return static_shapes(m)

    def _seq(self, node, env, i: int) -> Seq:
        return self.seq(node, env, node.input[i])

    def op_SequenceMap(self, node, env):
        body = _attr(node, "body")
        seqs = [self._seq(node, env, i) if i == 0 or node.input[i] in env else None for i in range(len(node.input))]
        lengths = {len(s.items) for s in seqs if s is not None}
        if len(lengths) != 1:
            raise UnsupportedModelError(
                f"SequenceMap's sequences differ in length ({sorted(lengths)})",
                where=self.where_n(node),
                fix="map over sequences of one length",
            )
        n = lengths.pop()
        em = self.emitter(node)
        results = [[] for _ in node.output]
        for i in range(n):
            feeds = [s.items[i] if s is not None else x for s, x in zip(seqs, node.input)]
            outs = inline_body(em, body, feeds, f"map{i}")
            for k, o in enumerate(outs[: len(node.output)]):
                results[k].append(o)
        for name, items in zip(node.output, results):
            env[name] = Seq(items)
        return em.nodes

    # ------------------------------------------------------------------------------------------ optionals

    def op_Optional(self, node, env):
        x = node.input[0] if node.input else ""
        env[node.output[0]] = Opt(True, env.get(x, x)) if x else Opt(False, None, _attr(node, "type"))
        return []

    def op_OptionalHasElement(self, node, env):
        x = node.input[0] if node.input else ""
        v = env.get(x) if x else Opt(False, None)
        present = v.present if isinstance(v, Opt) else True
        if isinstance(present, str):
            return [onnx.helper.make_node("Identity", [present], [node.output[0]], name=node.name)]
        self.consts[node.output[0]] = np.array(bool(present))
        return []

    def op_OptionalGetElement(self, node, env):
        x = node.input[0]
        v = env.get(x)
        if isinstance(v, Opt):
            if v.value is None:
                raise UnsupportedModelError(
                    f"OptionalGetElement of {x!r}, an optional that is always empty here",
                    where=self.where_n(node),
                    fix="check OptionalHasElement before reading the optional",
                )
            v = v.value
        if isinstance(v, Seq):
            env[node.output[0]] = v
            return []
        return [onnx.helper.make_node("Identity", [v or x], [node.output[0]], name=node.name)]

    # ------------------------------------------------------------------------------------------ outputs

    def flat_output(self, name: str, v, elem: int, outputs: list, nodes: list):
        def tensor(src: str, flat: str) -> str:
            if src != flat:  # an If's flat output already has the name
                nodes.append(onnx.helper.make_node("Identity", [src], [flat], name=f"{flat}/out"))
            outputs.append(onnx.helper.make_tensor_value_info(flat, elem, None))
            return flat

        if isinstance(v, Seq):
            return {"sequence": [tensor(s, f"{name}[{i}]") for i, s in enumerate(v.items)]}
        if isinstance(v, Opt):
            if v.present is False or v.value is None:
                return {"optional": None, "present": False}
            present = v.present
            if isinstance(present, str) and present != f"{name}?":
                nodes.append(onnx.helper.make_node("Identity", [present], [f"{name}?"], name=f"{name}?/out"))
            if isinstance(present, str):
                outputs.append(onnx.helper.make_tensor_value_info(f"{name}?", onnx.TensorProto.BOOL, None))
                present = f"{name}?"
            return {"optional": self.flat_output(f"{name}.value", v.value, elem, outputs, nodes), "present": present}
        return tensor(v, name)
