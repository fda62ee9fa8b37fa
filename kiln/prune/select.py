"""Which channels `kiln prune` removes. Each layer's output channels are scored by a criterion and
divided by the layer's mean score, so layers of different scales compare. Channels tied together
(a residual add ties the channel in every branch and in the stream; a depthwise conv ties its
input and output) form one class, scored by the mean over the layers in it, and go together.
Classes go lowest score first while every tensor they touch stays within its budget: at most
floor(ratio * C) of its C channels, so no layer loses all of them, and where `multiple` divides C,
a count that leaves a multiple of it (blocked layouts run whole blocks of 8 or 16 channels).

  l1        mean |w| of the channel's weights (Li et al., 2017)
  l2        root mean square of the channel's weights
  bn-scale  |gamma| of the BatchNormalization right after the layer (network slimming); layers
            without one fall back to l1 (listed in the report)"""

from __future__ import annotations

import math

import numpy as np

from .graph import ChannelGraph, Layer

CRITERIA = ("l1", "l2", "bn-scale")


def layer_scores(graph: ChannelGraph, layer: Layer, criterion: str) -> tuple[np.ndarray, str]:
    """(score per output channel, normalized to mean 1; the criterion used)."""
    w = graph.inits[layer.weight].astype(np.float64)
    rows = np.moveaxis(w, layer.out_axis, 0).reshape(w.shape[layer.out_axis], -1)
    used = criterion
    if criterion == "bn-scale" and layer.bn_scale is not None:
        s = np.abs(graph.inits[layer.bn_scale].astype(np.float64))
    elif criterion == "l2":
        s = np.sqrt((rows**2).mean(axis=1))
    else:
        s, used = np.abs(rows).mean(axis=1), "l1"
    return s / max(float(s.mean()), 1e-30), used


def _budget(c: int, ratio: float, multiple: int) -> int:
    """How many of c channels may go: floor(ratio * c); where `multiple` divides c, as many as
    leave a multiple of it, at most that many (64 at 0.3 and 8: 16 go, 48 stay)."""
    if multiple > 1 and c % multiple == 0:
        return c - math.ceil((1 - ratio) * c / multiple) * multiple
    return math.floor(ratio * c)


def choose(graph: ChannelGraph, ratio: float, criterion: str, keep=(), multiple: int = 1) -> tuple[dict, dict]:
    """(tensor -> sorted channel indices removed, {"classes": n, "criterion_fallback": [layers]}).
    multiple: channel counts it divides stay multiples of it (Kiln's blocked layouts need them)."""
    for name in keep:
        graph.ties.block(graph.layers[name].y)
    ok = graph.ties.removable(keep_one=False)
    scores, fallback = {}, []
    for layer in graph.layers.values():
        scores[layer.y], used = layer_scores(graph, layer, criterion)
        if used != criterion:
            fallback.append(layer.name)
    ranked = []
    for members in graph.ties.classes(ok):
        s = [scores[t][c] for t, c in members if t in scores]
        if s:
            ranked.append((float(np.mean(s)), members))
    ranked.sort(key=lambda sm: sm[0])
    budget = {t: _budget(len(v), ratio, multiple) for t, v in ok.items()}
    removed: dict[str, list[int]] = {}
    for _, members in ranked:
        count: dict[str, int] = {}
        for t, _c in members:
            count[t] = count.get(t, 0) + 1
        if all(len(removed.get(t, ())) + n <= budget[t] for t, n in count.items()):
            for t, c in members:
                removed.setdefault(t, []).append(c)
    masks = {t: np.zeros(len(v), bool) for t, v in ok.items()}
    for t, c in removed.items():
        masks[t][c] = True
    masks = graph.ties.in_blocks(masks, multiple, scores)  # a class blocked by another tensor's budget
    gone = {t: np.flatnonzero(m) for t, m in masks.items() if m.any()}
    return gone, {"classes": len(graph.ties.classes(masks)), "criterion_fallback": fallback}
