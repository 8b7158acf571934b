"""Linear layers that read the same input, merged into one matmul before aot_autograd.

A transformer layer applies several linear layers to one input: the query, key and value
projections of attention, the gate and up projections of a gated MLP. Each is a matmul of
its own, in the forward and twice more in the backward (the weight's gradient and the
input's). This pass rewrites, in the Dynamo graph, ::

    q = linear(x, Wq, bq); k = linear(x, Wk, bk); v = linear(x, Wv, bv)

into ::

    qkv = linear(x, cat([Wq, Wk, Wv]), cat([bq, bk, bv]))
    q, k, v = split(qkv, [nq, nk, nv], -1)

and aot_autograd derives the backward from it: one matmul for the three weights'
gradients (split into three views of it) and one for the input's, whose sum of three
products becomes one product over the concatenated dimension. A step makes a third as many
of these matmuls, each wider, and fewer launches: what counts where a step is host-bound.

The price is a copy of the weights (the ``cat``) at each call. A training step's matmuls
read those weights several times over and their inputs are many rows, so the copy is
small beside them; an inference call at a few rows reads each weight once, and there the
copy could double its matmul's traffic. So ``config.merge_linears`` merges in graphs that
need gradients ("train", the default), in every graph ("all"), or nowhere ("off").

Merged: ``torch._C._nn.linear`` calls (what Dynamo records for nn.Linear and F.linear) on
the same input node, with weights and biases that are graph inputs or attributes (the
parameters, not values computed in the graph) of one dtype and device and plain tensors
(no subclass), the same in_features, and all with a bias or none; and an input of static
sizes. Under symbolic sizes a saved activation keeps eager's strides (graph.py copies a
small saved view out only where it reports static strides), so attention's saved value
would keep the whole q/k/v output alive until the backward; and the merge's speed there
is not measured yet.

The new nodes' example values are computed as Dynamo computes its own, under the Python
dispatcher. Without it (torch 2.11), the fake ``linear`` read a symbolic input's sizes as
ints and so pinned the length: every new length compiled a static graph and the 9th ran
eagerly.
"""
from __future__ import annotations

import logging
import operator
from collections import defaultdict

import torch

from . import config, metrics

log = logging.getLogger("tritonfuse.merge_linears")

_LINEAR = torch._C._nn.linear
_LEAF_OPS = ("placeholder", "get_attr")


def merge_linears(gm: torch.fx.GraphModule) -> int:
    """Merge ``gm``'s groups of linears on a shared input in place, as ``config.merge_linears``
    says; returns how many groups were merged."""
    policy = config.merge_linears
    if policy == "off":
        return 0
    groups = [group for group in _groups(gm.graph)
              if (policy == "all" or _needs_grad(group)) and _static_input(group)]
    merged = []
    for group in groups:
        names = ",".join(node.name for node in group)   # before _merge erases the nodes
        try:   # each step leaves a valid graph: new nodes, then the uses moved, then erasures
            _merge(gm.graph, group)
            merged.append(names)
        except Exception:  # noqa: BLE001 - an optimization only: the group stays as it was
            log.warning("tritonfuse: linears %s left unmerged after an error", names, exc_info=True)
    if merged:
        gm.graph.lint()
        gm.recompile()
        metrics.add("merged_linear_groups", len(merged))
        log.debug("merged %d groups of linears: %s", len(merged), "; ".join(merged))
    return len(merged)


def _example(node):
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _operands(node: torch.fx.Node):
    """(input, weight, bias) of a linear call, bias None when absent."""
    args = list(node.args) + [None] * (3 - len(node.args))
    return (node.kwargs.get("input", args[0]), node.kwargs.get("weight", args[1]),
            node.kwargs.get("bias", args[2]))


def _plain_leaf(value, ndim: int) -> bool:
    """A graph input or attribute holding a plain tensor of ``ndim`` dims."""
    if not isinstance(value, torch.fx.Node) or value.op not in _LEAF_OPS:
        return False
    example = _example(value)
    if example is None or example.dim() != ndim:
        return False
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    return not is_traceable_wrapper_subclass(example) and not example.is_sparse


def _group_key(node: torch.fx.Node):
    """What linears must share to be merged, or None if this one can't be."""
    if node.op != "call_function" or node.target is not _LINEAR or len(node.args) > 3:
        return None
    x, weight, bias = _operands(node)
    if not isinstance(x, torch.fx.Node) or not _plain_leaf(weight, 2):
        return None
    if bias is not None and not _plain_leaf(bias, 1):
        return None
    w, example = _example(weight), _example(x)
    if example is None or _example(node) is None:
        return None
    if not all(isinstance(size, int) for size in w.shape):
        return None
    return (x, w.dtype, w.device, w.shape[1], bias is None)


def _groups(graph: torch.fx.Graph) -> list[list[torch.fx.Node]]:
    by_key: dict[tuple, list[torch.fx.Node]] = defaultdict(list)
    for node in graph.nodes:
        key = _group_key(node)
        if key is not None:
            by_key[key].append(node)
    groups = []
    for nodes in by_key.values():
        unique, seen = [], set()
        for node in nodes:               # the same weight twice: keep the first
            weight = _operands(node)[1]
            if weight not in seen:
                seen.add(weight)
                unique.append(node)
        if len(unique) >= 2:
            groups.append(unique)
    return groups


def _static_input(group) -> bool:
    return all(isinstance(size, int) for size in _example(_operands(group[0])[0]).shape)


def _needs_grad(group) -> bool:
    return any(_example(node).requires_grad for node in group)


def _merge(graph: torch.fx.Graph, group: list[torch.fx.Node]) -> None:
    x = _operands(group[0])[0]
    weights = [_operands(node)[1] for node in group]
    biases = [_operands(node)[2] for node in group]
    sizes = [_example(w).shape[0] for w in weights]
    with graph.inserting_before(group[0]):
        weight = _recomputed(_call(graph, torch.cat, (weights, 0)))
        bias = None if biases[0] is None else _recomputed(_call(graph, torch.cat, (biases, 0)))
        merged = _call(graph, _LINEAR, (x, weight, bias))
        parts = _call(graph, torch.split, (merged, sizes, -1))
        pieces = [_call(graph, operator.getitem, (parts, i)) for i in range(len(group))]
    for node, piece in zip(group, pieces):
        node.replace_all_uses_with(piece)
    for node in group:
        graph.erase_node(node)


def _recomputed(node: torch.fx.Node) -> torch.fx.Node:
    """Tag a concatenation of parameters for the partitioner to recompute in the backward
    (aot_autograd's trace keeps the tag on the aten node): the parameters are alive there
    anyway, and a saved copy would hold their size again from the forward to the backward."""
    from torch.utils.checkpoint import CheckpointPolicy
    node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
    return node


def _call(graph: torch.fx.Graph, target, args) -> torch.fx.Node:
    """A new call node, with the example value Dynamo's nodes carry (computed on the
    fake tensors of its arguments)."""
    node = graph.call_function(target, args)
    fake_args = torch.fx.node.map_arg(args, _example_or_value)
    fake_mode = _fake_mode(fake_args)
    if fake_mode is not None:
        from torch._dispatch.python import enable_python_dispatcher
        try:   # as Dynamo computes its example values: composite ops (linear) decompose in
            # Python, on SymInts; in C++ they read sizes as ints, which pins symbolic sizes
            with fake_mode, enable_python_dispatcher():
                node.meta["example_value"] = target(*fake_args)
        except Exception:  # noqa: BLE001 - aot_autograd traces again; the meta is a courtesy
            log.debug("no example value for %s", node.name, exc_info=True)
    return node


def _example_or_value(node):
    return node.meta.get("example_value")


def _fake_mode(values):
    """The fake mode of the example values (not the tracing context's, which may be another)."""
    for value in torch.utils._pytree.tree_leaves(values):
        if isinstance(value, torch.Tensor):
            return getattr(value, "fake_mode", None)
    return None
