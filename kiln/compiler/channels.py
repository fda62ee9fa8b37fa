"""Channel ties: which channels of which tensors stand or fall together. An elementwise op ties
channel c of each input to channel c of its output, a residual add ties both branches, Concat ties
each input to its slice of the output, a flatten ties a channel to its block of features. Removing
a channel from one tensor removes every channel tied to it, so a channel can go only if all of its
ties can. Shared by the RemoveZeroChannels pass (Relax vars, `removable`) and `kiln prune` (ONNX
tensor names, `classes`); keys are any hashable tensor names."""

from __future__ import annotations

import numpy as np


class ChannelTies:
    def __init__(self):
        self.ok: dict = {}  # tensor -> bool[C]: the channels that may go, as far as this tensor knows
        self.edges: list[tuple] = []  # (a, index array into a, b, index array into b): a[i[k]] ~ b[j[k]]

    def add(self, key, ok) -> None:
        self.ok[key] = np.asarray(ok, dtype=bool).copy()

    def channels(self, key) -> int:
        return len(self.ok[key])

    def block(self, key, idx=None) -> None:
        """These channels (all when idx is None) must stay."""
        if key in self.ok:
            if idx is None:
                self.ok[key][:] = False
            else:
                self.ok[key][idx] = False

    def tie(self, a, ia, b, ib) -> None:
        self.edges.append((a, np.asarray(ia, dtype=np.int64), b, np.asarray(ib, dtype=np.int64)))

    def identity(self, a, b) -> None:
        c = self.channels(a)
        self.tie(a, np.arange(c), b, np.arange(c))

    def removable(self, keep_one: bool = True) -> dict:
        """Tensor -> bool[C]: the channels that can go with everything tied to them. With keep_one,
        no tensor loses all its channels (a tensor that would, keeps them all, and so do its ties);
        without, the caller caps what goes (kiln prune, where every channel is a candidate)."""
        ok = {k: v.copy() for k, v in self.ok.items()}
        while True:
            self._settle(ok)
            emptied = [k for k, v in ok.items() if len(v) and v.all()] if keep_one else []
            if not emptied:
                return ok
            for k in emptied:
                ok[k][:] = False

    def in_blocks(self, masks: dict, multiple: int, scores: dict | None = None) -> dict:
        """`masks` (tensor -> bool[C], what goes) with channels given back, and with them their ties,
        until every tensor whose channel count `multiple` divides keeps a multiple of it: blocked
        layouts (NCHW16c) need whole blocks, and a conv left with 45 channels would run unblocked
        and slower than before. Channels with the highest `scores` (tensor -> float[C]) come back
        first; without scores, the last ones."""
        masks = {k: v.copy() for k, v in masks.items()}
        changed = multiple > 1
        while changed:
            changed = False
            for t, m in masks.items():
                c, gone = len(m), int(m.sum())
                if c % multiple or not (c - gone) % multiple:
                    continue
                idx = np.flatnonzero(m)
                back = gone % multiple
                if scores is not None and t in scores:
                    idx = idx[np.argsort(-scores[t][idx], kind="stable")]
                    m[idx[:back]] = False
                else:
                    m[idx[-back:]] = False
                changed = True
            self._settle(masks)
        return masks

    def _settle(self, ok: dict) -> None:
        changed = True
        while changed:  # forward then backward sweeps: ties are listed in graph order
            changed = False
            for a, ia, b, ib in self.edges + self.edges[::-1]:
                both = ok[a][ia] & ok[b][ib]
                for key, idx in ((a, ia), (b, ib)):
                    new = ok[key].copy()
                    np.logical_and.at(new, idx, both)
                    if not np.array_equal(new, ok[key]):
                        ok[key], changed = new, True

    def classes(self, only: dict | None = None) -> list[list[tuple]]:
        """The tie classes, each a list of (tensor, channel), in first-seen order (union-find); with
        `only` (tensor -> bool[C], e.g. what removable() gives), just the channels it marks."""
        parent: dict = {}
        mark = only or {k: np.ones(len(v), bool) for k, v in self.ok.items()}

        def find(x):
            root = x
            while parent.setdefault(root, root) != root:
                root = parent[root]
            while parent[x] != root:
                parent[x], x = root, parent[x]
            return root

        for key, v in mark.items():
            for c in np.flatnonzero(v).tolist():
                find((key, c))
        for a, ia, b, ib in self.edges:
            both = mark[a][ia] & mark[b][ib]
            for i, j in zip(ia[both].tolist(), ib[both].tolist()):
                ra, rb = find((a, i)), find((b, j))
                if ra != rb:
                    parent[rb] = ra
        groups: dict = {}
        for node in parent:
            groups.setdefault(find(node), []).append(node)
        return list(groups.values())
