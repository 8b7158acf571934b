"""Which fusions the scheduler tries, and whether one would close a cycle: the dependency
graph of its groups while they fuse, kept up to date as groups merge.

A graph of N groups has N**2 / 2 pairs; a model whose Python loop Dynamo unrolls (RWKV's
and Mamba's recurrences, a deep stack of layers) has thousands of groups, and scoring every
pair, and rebuilding every group's ancestors after every fusion, made scheduling
quadratic to cubic in N (RWKV's inference graph: 63 s of a 180 s first call on the CPU).
Here:

* ``candidate_pairs`` names only the pairs that can score: groups that share a buffer
  (one writes what the other reads, or both read it), and tiny kernels of one static size
  (fusing them saves a launch) within ``TINY_PAIR_WINDOW`` of each other among the
  groups of their size, as Inductor bounds its pairwise fusion attempts;
* ``FusionGraph`` holds each group's direct predecessors and ancestors (by ``id``) and
  updates them in place when two groups merge: one pass over the groups per fusion.
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable

# Tiny kernels of one size that share nothing pair with this many of their size's next
# groups (in position order), not with all of them.
TINY_PAIR_WINDOW = 64


class FusionGraph:
    """Direct predecessors and ancestors of each group, by ``id``.

    ``preds``: {id(group): ids of the groups it must run after}; ``order``: the groups in
    an order where each comes after its predecessors."""

    def __init__(self, order: Iterable, preds: dict):
        self.preds = {gid: set(p) for gid, p in preds.items()}
        self.ancestors = {}
        for group in order:
            acc = set()
            for pred in self.preds[id(group)]:
                acc.add(pred)
                acc |= self.ancestors[pred]
            self.ancestors[id(group)] = acc

    def _path_through_another(self, x, y) -> bool:
        """Whether some path x -> ... -> y passes through a group other than x and y: its
        last step leaves a direct predecessor of y that has x among its ancestors."""
        ix = id(x)
        return any(pred != ix and ix in self.ancestors[pred] for pred in self.preds[id(y)])

    def fusion_closes_a_cycle(self, a, b) -> bool:
        """Whether one kernel doing ``a`` and ``b`` would both follow and precede another
        group (a path between them through a third)."""
        return self._path_through_another(a, b) or self._path_through_another(b, a)

    def merge(self, a, b, merged) -> None:
        """``a`` and ``b`` became ``merged``: it inherits their edges, and whatever depended
        on either now depends on it, and so on everything it depends on."""
        pair, im = {id(a), id(b)}, id(merged)
        preds = (self.preds.pop(id(a)) | self.preds.pop(id(b))) - pair
        ancestors = (self.ancestors.pop(id(a)) | self.ancestors.pop(id(b))) - pair
        for group_preds in self.preds.values():
            if not pair.isdisjoint(group_preds):
                group_preds -= pair
                group_preds.add(im)
        for group_ancestors in self.ancestors.values():
            if not pair.isdisjoint(group_ancestors):
                group_ancestors -= pair
                group_ancestors.add(im)
                group_ancestors |= ancestors
        self.preds[im], self.ancestors[im] = preds, ancestors


def candidate_pairs(groups: list, score: Callable, tiny_size: Callable) -> list:
    """[(score, a, b)] for the pairs of ``groups`` (a before b by position) that may score
    above 0, best first (ties: earliest first). ``score(a, b)``: the scheduler's;
    ``tiny_size(group)``: a key shared by tiny kernels of one static size, or None."""
    by_position = sorted(groups, key=lambda g: g.position)
    rank = {id(g): i for i, g in enumerate(by_position)}
    sharing = {}
    for group in by_position:
        for name in group.names | group.read_names():
            sharing.setdefault(name, []).append(group)
    pairs = {}
    for members in sharing.values():
        for a, b in itertools.combinations(members, 2):   # (in position order already)
            key = (rank[id(a)], rank[id(b)])
            if key not in pairs:
                pairs[key] = score(a, b) if a.device == b.device else 0
    same_size = {}
    for group in by_position:
        key = tiny_size(group)
        if key is not None:
            same_size.setdefault((group.device, key), []).append(group)
    for members in same_size.values():   # share nothing: a launch saved scores 1
        for i, a in enumerate(members):
            for b in members[i + 1: i + 1 + TINY_PAIR_WINDOW]:
                pairs.setdefault((rank[id(a)], rank[id(b)]), 1)
    ranked = sorted((-value, i, j) for (i, j), value in pairs.items() if value)
    return [(-negative, by_position[i], by_position[j]) for negative, i, j in ranked]
