"""One kernel for a whole LSTM/GRU/RNN layer: every time step of every direction in one call.

The ONNX recurrences were unrolled into ops (frontends/decompose/rnn.py): per step a Gather of the
step's input projection, a [B, H] x [H, G*H] MatMul and the gate math, 4-6 kernels a step. On small
hidden sizes each kernel is a few hundred FLOPs and the calls cost more than the work: kws_conv_gru
(2 GRU layers, 49 steps, hidden 64) ran ~390 kernel calls, far behind onnxruntime (timings in
benchmarks/history.md). Here the input projection of all steps stays one MatMul (the frontend emits it, batched over
directions), and the recurrence is one PrimFunc: a serial loop over the steps, directions in parallel (a
bidirectional layer takes both cores), per step the matrix-vector product with the recurrent weights on vector
accumulators and the gates with a polynomial exp (the one topi.fast_exp uses), all in registers.

The kernel is generated as TVMScript text from a Recurrence (its shape and cell) and the target's
vector lanes and registers (caps.f32_block, caps.vector_registers): the frontend emits it with
AVX2's (8 lanes, 16 registers), which run everywhere x86-64, and ApplyDefaultSchedules generates it
again for the target's own caps (`specialize`). It is written scheduled (no blocks), so MetaSchedule
and the rules leave it alone.

Semantics are ONNX's (default activations: LSTM sigmoid/tanh/tanh, gates i, o, f, c; GRU sigmoid/tanh,
gates z, r, h, either linear_before_reset; RNN tanh): the caller folds the biases into the input
projection (LSTM/RNN: Wb + Rb; GRU: Wb and the recurrent biases of z and r) and passes GRU's recurrent
h-gate bias as rbh, which the kernel adds to (r * h) R_h, or inside r * (h R_h + rbh) with
linear_before_reset. The kernel runs on CPU targets only (no thread binding): GPU imports keep the steps."""

from __future__ import annotations

import dataclasses
import json
import re

GATES = {"lstm": 4, "gru": 3, "rnn": 1}
ATTR = "kiln.recurrence"  # the PrimFunc attribute holding the Recurrence as JSON
DEFAULT_LANES, DEFAULT_REGISTERS = 8, 16  # AVX2's, for the kernel the frontend emits


@dataclasses.dataclass(frozen=True)
class Recurrence:
    cell: str  # lstm | gru | rnn
    steps: int
    batch: int
    hidden: int
    reverse: tuple[bool, ...]  # per direction
    linear_before_reset: bool = False  # GRU only
    quantized_h: bool = False  # LSTM/RNN: h quantized to uint8 every step, integer-valued rt times scales rs

    def __post_init__(self):
        if self.quantized_h and self.cell == "gru":  # _gru_step's second product would miss the scales
            raise ValueError("a GRU recurrence has no quantized-h form (DynamicQuantizeLSTM is the only one)")

    @property
    def gates(self) -> int:
        return GATES[self.cell]

    @property
    def directions(self) -> int:
        return len(self.reverse)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Recurrence:
        d = json.loads(text)
        return cls(**{**d, "reverse": tuple(d["reverse"])})

    def flops(self) -> int:
        """Multiply-adds of the recurrent products, twice: what the profile's GFLOP/s count."""
        return 2 * self.directions * self.steps * self.batch * self.hidden * self.gates * self.hidden


def _exp(out: str, x: str, ind: str) -> list[str]:
    """Lines binding `out` to exp(x) (x an expression), float32, as topi.fast_exp computes it: clamp,
    split off the power of two, a degree-7 polynomial on the rest."""
    out = f"${out}" if not out.startswith("$") else out
    p = f"{out}_r"
    poly = "T.float32(1.9875691500e-4)"
    for c in ("1.3981999507e-3", "8.3334519073e-3", "4.1665795894e-2", "1.6666665459e-1", "5.0000001201e-1"):
        poly = f"({poly} * {p} + T.float32({c}))"
    poly = f"({poly} * {p} * {p} + {p} + T.float32(1))"
    return [
        f"{ind}{out}_x = T.max(T.min({x}, T.float32(88.3762626647949)), T.float32(-88.3762626647949))",
        f"{ind}{out}_n = T.floor({out}_x * T.float32(1.44269504088896341) + T.float32(0.5))",
        f"{ind}{p} = {out}_x - {out}_n * T.float32(0.693359375) + {out}_n * T.float32(2.12194440e-4)",
        f'{ind}{out} = {poly} * T.reinterpret("float32", T.shift_left(T.Cast("int32", {out}_n) + 127, 23))',
    ]


def _sigmoid(out: str, x: str, ind: str) -> list[str]:
    e = f"${out}_e"
    return [*_exp(e, f"T.float32(0) - ({x})", ind), f"{ind}${out} = T.float32(1) / (T.float32(1) + {e})"]


def _tanh(out: str, x: str, ind: str) -> list[str]:
    """1 - 2 / (exp(2x) + 1): exact at the saturated ends, absolute error ~1e-7 near 0."""
    e = f"${out}_e"
    return [*_exp(e, f"T.float32(2) * ({x})", ind), f"{ind}${out} = T.float32(1) - T.float32(2) / ({e} + T.float32(1))"]


class _Text:
    """TVMScript lines with the loop helpers the kernel needs."""

    def __init__(self, lanes: int):
        self.lines: list[str] = []
        self.lanes = lanes
        self.slots: dict[str, int] = {}
        self.lane = "0"  # the lane index of the loop being written: jv in vector loops

    def add(self, ind: int, *lines: str) -> None:
        self.lines += ["    " * ind + self._temps(s) for s in lines]

    def _temps(self, line: str) -> str:
        """$name -> a slot of the scratch buffer `sc` at this loop's lane. TVM 0.27's vectorizer broadcasts
        a Let-bound value's last lane, so temporaries are stores to a small local buffer (LLVM keeps it in
        registers)."""

        def slot(m):
            i = self.slots.setdefault(m.group(1), len(self.slots))
            return f"sc[{i}, {self.lane}]"

        return re.sub(r"\$(\w+)", slot, line)

    def each(self, ind: int, n: int, body) -> None:
        """body(ind, j) for j in range(n): lanes-wide vector loops, then a scalar tail."""
        v, full = self.lanes, n // self.lanes * self.lanes
        if full:
            self.add(ind, f"for jo in range({full // v}):", f"    for jv in T.vectorized({v}):")
            self.lane = "jv"
            body(ind + 2, f"(jo * {v} + jv)")
        if full < n:
            self.add(ind, f"for jt in range({full}, {n}):")
            self.lane = "0"
            body(ind + 1, "jt")
        self.lane = "0"

    def matvec(self, ind: int, cols: tuple[int, int], vec, rec: Recurrence, registers: int, out) -> None:
        """out(ind, j, acc) for j in cols, acc = sum_k vec(k) * rt[d, k, j]: blocks of accumulator vectors
        (half the registers), then lanes-wide blocks, then scalar columns."""
        v, (c0, c1) = self.lanes, cols
        blocks, col = [], c0
        for width in (v * max(1, registers // 2), v):
            while c1 - col >= width:
                blocks.append((col, width))
                col += width
        blocks += [(c, 1) for c in range(col, c1)]
        for start, width in blocks:
            vecs = max(1, width // v)
            w = min(width, v)
            self.add(ind, f"for a in T.unroll({vecs}):", f"    for jv in T.vectorized({w}):")
            self.add(ind + 2, f"acc[a * {w} + jv] = T.float32(0)")
            self.add(ind, f"for k in range({rec.hidden}):", f"    for a in T.unroll({vecs}):")
            self.add(ind + 2, f"for jv in T.vectorized({w}):")
            self.add(ind + 3, f"acc[a * {w} + jv] = acc[a * {w} + jv] + {vec('k')} * rt[d, k, {start} + a * {w} + jv]")
            self.add(ind, f"for a in T.unroll({vecs}):", f"    for jv in T.vectorized({w}):")
            out(ind + 2, f"({start} + a * {w} + jv)", f"acc[a * {w} + jv]")


def source(rec: Recurrence, lanes: int = DEFAULT_LANES, registers: int = DEFAULT_REGISTERS) -> str:
    """The kernel as TVMScript: xw [T, B, D*G*H], rt [D, H, G*H], rbh [D, H] (GRU), h0/c0 [D, B, H] in;
    y [T, D, B, H], yh (and LSTM's yc) [D, B, H] out."""
    T_, B, H, D, G = rec.steps, rec.batch, rec.hidden, rec.directions, rec.gates
    lstm, gru = rec.cell == "lstm", rec.cell == "gru"
    acc = lanes * max(1, registers // 2)
    x = _Text(lanes)
    x.add(0, "@T.prim_func", f"def recurrence({', '.join(_params(rec))}):")
    x.add(1, 'T.func_attr({"global_symbol": "recurrence", "tirx.noalias": True})')
    x.add(1, f"for d in {'T.parallel' if D > 1 else 'range'}({D}):")
    x.add(2, f'h = T.alloc_buffer(({B * H},), "float32", scope="local")')
    x.add(2, f'c = T.alloc_buffer(({B * H},), "float32", scope="local")') if lstm else None
    x.add(2, f'g = T.alloc_buffer(({G * H},), "float32", scope="local")')
    x.add(2, f'acc = T.alloc_buffer(({acc},), "float32", scope="local")')
    x.add(2, "SCRATCH")
    if rec.quantized_h:
        x.add(2, f'hq = T.alloc_buffer(({B * H},), "float32", scope="local")')
        x.add(2, 'qs = T.alloc_buffer((4,), "float32", scope="local")')
    x.add(2, f'rh = T.alloc_buffer(({H},), "float32", scope="local")') if gru and not rec.linear_before_reset else None
    x.add(2, f"for b in range({B}):")
    x.each(3, H, lambda i, j: x.add(i, f"h[b * {H} + {j}] = h0[d, b, {j}]"))
    if lstm:
        x.each(3, H, lambda i, j: x.add(i, f"c[b * {H} + {j}] = c0[d, b, {j}]"))
    x.add(2, f"for s in range({T_}):")
    rev = [bool(r) for r in rec.reverse]
    step = (
        "s"
        if not any(rev)
        else f"{T_ - 1} - s"
        if all(rev)
        else f"T.if_then_else(d == {rev.index(True)}, {T_ - 1} - s, s)"
    )
    x.add(3, f"t = {step}")
    if rec.quantized_h:
        _quantize_h(x, rec)
    x.add(3, f"for b in range({B}):")
    (_gru_step if gru else _step)(x, rec, registers)
    x.add(2, f"for b in range({B}):")
    x.each(3, H, lambda i, j: x.add(i, f"yh[d, b, {j}] = h[b * {H} + {j}]"))
    if lstm:
        x.each(3, H, lambda i, j: x.add(i, f"yc[d, b, {j}] = c[b * {H} + {j}]"))
    scratch = f'sc = T.alloc_buffer(({max(1, len(x.slots))}, {lanes}), "float32", scope="local")'
    return "\n".join(ln.replace("SCRATCH", scratch) for ln in x.lines) + "\n"


def _params(rec: Recurrence) -> list[str]:
    """The kernel's parameters, as TVMScript."""
    T_, B, H, D, G = rec.steps, rec.batch, rec.hidden, rec.directions, rec.gates
    lstm, gru = rec.cell == "lstm", rec.cell == "gru"
    params = [f'xw: T.Buffer(({T_}, {B}, {D * G * H}), "float32")', f'rt: T.Buffer(({D}, {H}, {G * H}), "float32")']
    params += [f'rs: T.Buffer(({D}, {G * H}), "float32")'] if rec.quantized_h else []
    params += [f'rbh: T.Buffer(({D}, {H}), "float32")'] if gru else []
    params += [f'h0: T.Buffer(({D}, {B}, {H}), "float32")']
    params += [f'c0: T.Buffer(({D}, {B}, {H}), "float32")'] if lstm else []
    params += [f'y: T.Buffer(({T_}, {D}, {B}, {H}), "float32")', f'yh: T.Buffer(({D}, {B}, {H}), "float32")']
    params += [f'yc: T.Buffer(({D}, {B}, {H}), "float32")'] if lstm else []
    return params


def _hb(rec: Recurrence):
    if rec.quantized_h:
        return lambda k: f"hq[b * {rec.hidden} + {k}]"
    return lambda k: f"h[b * {rec.hidden} + {k}]"


def _store_g(x, rec: Recurrence):
    base = f"d * {rec.gates * rec.hidden}"
    if rec.quantized_h:  # the integer product times (h's scale x the column's): onnxruntime's order
        return lambda i, j, a: x.add(i, f"g[{j}] = xw[t, b, {base} + {j}] + {a} * (qs[2] * rs[d, {j}])")
    return lambda i, j, a: x.add(i, f"g[{j}] = xw[t, b, {base} + {j}] + {a}")


def _quantize_h(x, rec: Recurrence) -> None:
    """h (every batch row) quantized as onnxruntime's DynamicQuantizeLSTM does each step (uint8, the range widened
    to include 0, scale (max - min) / 255 or 1 for an all-zero h, zero point round(-min / scale)), kept as q - zero
    point: integer values whose products with rt's are exact in float32 (sums below 2^24: H up to 256)."""
    n, f = rec.batch * rec.hidden, "T.float32"
    x.add(3, f"qs[0] = {f}(0)", f"qs[1] = {f}(0)", f"for e in range({n}):")
    x.add(4, "qs[0] = T.max(qs[0], h[e])", "qs[1] = T.min(qs[1], h[e])")
    x.add(3, f"qs[2] = T.if_then_else(qs[0] - qs[1] == {f}(0), {f}(1), (qs[0] - qs[1]) / {f}(255))")
    x.add(3, f"qs[3] = T.round(T.min(T.max({f}(0) - qs[1] / qs[2], {f}(0)), {f}(255)))")
    x.each(
        3,
        n,
        lambda i, j: x.add(i, f"hq[{j}] = T.min(T.max(T.round(h[{j}] / qs[2]) + qs[3], {f}(0)), {f}(255)) - qs[3]"),
    )


def _gru_step(x, rec: Recurrence, registers: int) -> None:
    """One GRU step of batch row b: the gates' recurrent products, then the cell per hidden unit."""
    H, base = rec.hidden, f"d * {rec.gates * rec.hidden}"
    x.matvec(4, (0, 2 * H), _hb(rec), rec, registers, _store_g(x, rec))
    if rec.linear_before_reset:
        store_n = lambda i, j, a: x.add(i, f"g[{j}] = {a} + rbh[d, {j} - {2 * H}]")
        x.matvec(4, (2 * H, 3 * H), _hb(rec), rec, registers, store_n)
    else:
        x.each(4, H, lambda i, j: x.add(i, *_sigmoid("r", f"g[{H} + {j}]", ""), f"rh[{j}] = $r * h[b * {H} + {j}]"))
        x.matvec(
            4,
            (2 * H, 3 * H),
            lambda k: f"rh[{k}]",
            rec,
            registers,
            lambda i, j, a: x.add(i, f"g[{j}] = xw[t, b, {base} + {j}] + {a} + rbh[d, {j} - {2 * H}]"),
        )

    def gru_cell(i, j):
        x.add(i, *_sigmoid("z", f"g[{j}]", ""))
        if rec.linear_before_reset:
            x.add(i, *_sigmoid("r", f"g[{H} + {j}]", ""))
            x.add(i, *_tanh("hh", f"xw[t, b, {base} + {2 * H} + {j}] + $r * g[{2 * H} + {j}]", ""))
        else:
            x.add(i, *_tanh("hh", f"g[{2 * H} + {j}]", ""))
        x.add(i, f"h[b * {H} + {j}] = $hh + $z * (h[b * {H} + {j}] - $hh)", f"y[t, d, b, {j}] = h[b * {H} + {j}]")

    x.each(4, H, gru_cell)


def _step(x, rec: Recurrence, registers: int) -> None:
    """One LSTM or RNN step of batch row b: the gates' recurrent products, then the cell per hidden unit."""
    H, lstm = rec.hidden, rec.cell == "lstm"
    x.matvec(4, (0, rec.gates * H), _hb(rec), rec, registers, _store_g(x, rec))

    def cell(i, j):
        if lstm:
            x.add(i, *_sigmoid("gi", f"g[{j}]", ""), *_sigmoid("go", f"g[{H} + {j}]", ""))
            x.add(i, *_sigmoid("gf", f"g[{2 * H} + {j}]", ""), *_tanh("gc", f"g[{3 * H} + {j}]", ""))
            x.add(i, f"c[b * {H} + {j}] = $gf * c[b * {H} + {j}] + $gi * $gc")
            x.add(i, *_tanh("ct", f"c[b * {H} + {j}]", ""), f"h[b * {H} + {j}] = $go * $ct")
        else:
            x.add(i, *_tanh("hn", f"g[{j}]", ""), f"h[b * {H} + {j}] = $hn")
        x.add(i, f"y[t, d, b, {j}] = h[b * {H} + {j}]")

    x.each(4, H, cell)


def kernel(rec: Recurrence, lanes: int = DEFAULT_LANES, registers: int = DEFAULT_REGISTERS):
    """The kernel as a PrimFunc, marked scheduled and carrying `rec` (ATTR) for `specialize`."""
    import tvm

    from .tvmscript import cheap_stack

    with cheap_stack():
        func = tvm.script.from_source(source(rec, lanes, registers))
    return func.with_attr(ATTR, rec.to_json()).with_attr("tirx.is_scheduled", True).with_attr("kiln.flops", rec.flops())


def specialize(func, lanes: int, registers: int):
    """`func` (a recurrence kernel) generated again for these lanes and registers, with its attributes
    (name, flops, marks) kept; None for any other PrimFunc."""
    text = func.attrs.get(ATTR) if func.attrs is not None else None
    if text is None:
        return None
    out = kernel(Recurrence.from_json(str(text)), lanes, registers).without_attr("global_symbol")
    for key, value in func.attrs.items():
        out = out.with_attr(key, value)
    return out
