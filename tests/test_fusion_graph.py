"""The scheduler's fusion bookkeeping (tritonfuse/fusion_graph.py): the dependency graph
kept up to date as groups merge agrees with one rebuilt from scratch, and the pairs it
tries grow linearly, not quadratically, with the tiny kernels of an unrolled loop; and such
a loop compiles to the same values as eager."""
import random

import torch

from tritonfuse.fusion_graph import TINY_PAIR_WINDOW, FusionGraph, candidate_pairs


class Group:
    """A stand-in for the scheduler's FusedNode: what fusion_graph reads of one."""

    def __init__(self, position, names, reads, device="cpu", size=None):
        self.position, self.names, self.reads, self.device, self.size = position, set(names), frozenset(reads), device, size

    def read_names(self):
        return self.reads


def closure(groups, preds):
    """Every group's ancestors, by brute force."""
    ancestors = {}
    for group in groups:
        seen, stack = set(), list(preds[id(group)])
        while stack:
            gid = stack.pop()
            if gid not in seen:
                seen.add(gid)
                stack.extend(preds[gid])
        ancestors[id(group)] = seen
    return ancestors


def inverse(groups, edges):
    """{id: the ids whose ``edges`` hold it}, by brute force."""
    return {id(g): {gid for gid, targets in edges.items() if id(g) in targets} for g in groups}


def closes_a_cycle(a, b, groups, ancestors):
    """Whether some third group lies on a path between ``a`` and ``b``, by brute force."""
    return any(id(a) in ancestors[id(m)] and id(m) in ancestors[id(b)]
               or id(b) in ancestors[id(m)] and id(m) in ancestors[id(a)]
               for m in groups if m is not a and m is not b)


def test_graph_kept_up_to_date_matches_a_rebuild():
    """After every merge, preds, ancestors, and their inverses (succs, descendants) match a
    rebuild from scratch, and so does fusion_closes_a_cycle for random pairs; graphs sparse
    and dense, groups merged again and again."""
    rng = random.Random(0)
    for trial in range(40):
        n, fan_in = rng.choice([(12, 2), (40, 3), (60, 6)])
        groups = [Group(i, [f"b{i}"], []) for i in range(n)]
        preds = {id(g): {id(p) for p in rng.sample(groups[:i], min(i, rng.randint(0, fan_in)))}
                 for i, g in enumerate(groups)}
        graph = FusionGraph(groups, preds)
        alive = list(groups)
        for _ in range(n):
            if len(alive) < 2:
                break
            ancestors = closure(alive, preds)
            for x, y in (rng.sample(alive, 2) for _ in range(10)):
                expected = closes_a_cycle(x, y, alive, ancestors)
                assert graph.fusion_closes_a_cycle(x, y) == expected, trial
            a, b = rng.sample(alive, 2)
            if graph.fusion_closes_a_cycle(a, b):
                assert closes_a_cycle(a, b, alive, ancestors), trial
                continue
            merged = Group(min(a.position, b.position), a.names | b.names, [])
            new_preds = (preds[id(a)] | preds[id(b)]) - {id(a), id(b)}
            for gid in preds:
                if id(a) in preds[gid] or id(b) in preds[gid]:
                    preds[gid] = (preds[gid] - {id(a), id(b)}) | {id(merged)}
            del preds[id(a)], preds[id(b)]
            preds[id(merged)] = new_preds
            alive = [g for g in alive if g is not a and g is not b] + [merged]
            graph.merge(a, b, merged)
            ancestors = closure(alive, preds)
            assert graph.preds == preds, trial
            assert graph.succs == inverse(alive, preds), trial
            assert graph.ancestors == ancestors, trial
            assert graph.descendants == inverse(alive, ancestors), trial


def test_tiny_kernels_of_one_size_pair_within_a_window_and_sharers_always():
    n = 500
    groups = [Group(i, [f"b{i}"], [], size=(128, 1)) for i in range(n)]
    # the first and the last share a buffer: that pair is tried whatever the distance
    groups[-1].reads = frozenset(["b0"])
    pairs = candidate_pairs(groups, score=lambda a, b: 4096, tiny_size=lambda g: g.size)
    assert len(pairs) <= n * TINY_PAIR_WINDOW
    assert (groups[0], groups[-1]) == pairs[0][1:] and pairs[0][0] == 4096
    assert all(a.position < b.position for _, a, b in pairs)
    assert all(b.position - a.position <= TINY_PAIR_WINDOW for score, a, b in pairs[1:])


def test_an_unrolled_recurrence_compiles_like_eager(device):
    """RWKV's and Mamba's reference paths: a Python loop over the sequence that Dynamo
    unrolls into hundreds of small kernels of one size."""
    def recurrence(x, decay, w):
        state = torch.zeros_like(x[:, 0])
        outs = []
        for t in range(x.shape[1]):
            state = state * torch.sigmoid(decay) + torch.tanh(x[:, t] @ w)
            outs.append(state * 2.0)
        return torch.stack(outs, 1).sum(-1)

    torch.manual_seed(0)
    x = torch.randn(2, 24, 16, device=device)
    decay, w = torch.randn(16, device=device), torch.randn(16, 16, device=device) * 0.3
    compiled = torch.compile(recurrence, backend="tritonfuse")
    torch.testing.assert_close(compiled(x, decay, w), recurrence(x, decay, w), rtol=1e-5, atol=1e-5)
