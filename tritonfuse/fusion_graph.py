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
* ``FusionGraph`` holds each group's direct predecessors and ancestors (by ``id``), and
  their inverses (direct successors, descendants), and updates them in place when two
  groups merge: only the groups that depend on the pair, or that it depends on, are
  touched (a pass over every group per fusion was 10 s of RWKV's 43 s training schedule
  on the CPU, 3 s now).
"""
from __future__ import annotations

import itertools
from typing import Callable, Iterable

# Tiny kernels of one size that share nothing pair with this many of their size's next
# groups (in position order), not with all of them.
TINY_PAIR_WINDOW = 64


class FusionGraph:
    """Direct predecessors and ancestors of each group, by ``id``, and their inverses.

    ``preds``: {id(group): ids of the groups it must run after}; ``order``: the groups in
    an order where each comes after its predecessors. ``succs`` and ``descendants``: {id:
    ids of the groups that have it among their ``preds`` / ``ancestors``}, so that a merge
    finds the groups it changes without a pass over all of them."""

    def __init__(self, order: Iterable, preds: dict):
        order = list(order)
        self.preds = {gid: set(p) for gid, p in preds.items()}
        self.succs = {gid: set() for gid in self.preds}
        for gid, group_preds in self.preds.items():
            for pred in group_preds:
                self.succs[pred].add(gid)
        self.ancestors = self._closure(order, self.preds)
        self.descendants = self._closure(reversed(order), self.succs)

    @staticmethod
    def _closure(order, edges) -> dict:
        """{id: every id reached from it along ``edges``}, ``order`` having each group
        after those its edges lead to."""
        reached = {}
        for group in order:
            acc = set()
            for other in edges[id(group)]:
                acc.add(other)
                acc |= reached[other]
            reached[id(group)] = acc
        return reached

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
        on either now depends on it, and so on everything it depends on. The fusion must
        not close a cycle (``fusion_closes_a_cycle(a, b)`` false), as the scheduler checks.
        Only the groups linked to ``a`` or ``b`` change."""
        pair, im = {id(a), id(b)}, id(merged)
        preds = (self.preds.pop(id(a)) | self.preds.pop(id(b))) - pair
        succs = (self.succs.pop(id(a)) | self.succs.pop(id(b))) - pair
        for gid in preds:
            self.succs[gid] -= pair
            self.succs[gid].add(im)
        for gid in succs:
            self.preds[gid] -= pair
            self.preds[gid].add(im)
        ancestors_a, ancestors_b = self.ancestors.pop(id(a)), self.ancestors.pop(id(b))
        descendants_a, descendants_b = self.descendants.pop(id(a)), self.descendants.pop(id(b))
        # what follows either now follows all that precedes either, and the other way round
        self._join(self.ancestors, descendants_a, descendants_b, ancestors_a, ancestors_b,
                   pair, im)
        self._join(self.descendants, ancestors_a, ancestors_b, descendants_a, descendants_b,
                   pair, im)
        self.preds[im], self.succs[im] = preds, succs
        self.ancestors[im] = (ancestors_a | ancestors_b) - pair
        self.descendants[im] = (descendants_a | descendants_b) - pair

    @staticmethod
    def _join(reached: dict, side_a: set, side_b: set, reach_a: set, reach_b: set,
              pair: set, im: int) -> None:
        """One direction of a merge. ``reached``: {id: ids it reaches} (ancestors, or
        descendants); ``side_a`` / ``side_b``: the groups that reach ``a`` / ``b``;
        ``reach_a`` / ``reach_b``: what ``a`` / ``b`` reach. Every group that reaches
        either now reaches the merged group and all that either reaches: a group that
        reaches ``a`` reaches all ``a`` does already (reaching is transitive), so it
        gains only what ``b`` reaches beyond that, and the same way round."""
        gain_side_a, gain_side_b = reach_b - reach_a - pair, reach_a - reach_b - pair
        for gid in (side_a | side_b) - pair:
            ids = reached[gid]
            ids -= pair
            ids.add(im)
            if gid not in side_b:
                ids |= gain_side_a
            elif gid not in side_a:
                ids |= gain_side_b


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
