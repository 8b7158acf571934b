"""Graphs with an op that aot_autograd cannot trace: split around it, compile the rest.

Some ops read a tensor's values while being traced: ``narrow`` with a tensor start,
``tensor_split`` with tensor indices, ops whose output shape depends on the data. Fake
tensors have no values, so aot_autograd's trace of the whole graph fails
(``DataDependentOutputException`` and its kin). Handed that error back, Dynamo retries a
shorter graph that fails the same way, and in the end runs the whole frame eagerly, with
Inductor as with tritonfuse.

Instead, the graph is cut into three parts in its own order: the nodes before the first
such op, the op alone, and the nodes after it. The op runs as its FX code (aten, eagerly,
its values real); the parts before and after are compiled by the backend at their first
call, from the real tensors that reach them. A part after may hold another such op: its
own compile splits it again. Gradients flow between the parts as between any functions
(each compiled part is an autograd function of its own).
"""
import logging

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

log = logging.getLogger("tritonfuse")


def traced_failures() -> tuple:
    """The fake-tensor errors of an op whose trace needs its inputs' values (Dynamo's own
    list of errors it may turn into a graph break)."""
    from torch._dynamo import exc
    return tuple(getattr(exc, "exceptions_allowed_to_be_fallback", ()))


def first_untraceable_node(gm: torch.fx.GraphModule, example_inputs):
    """The first node whose fake-tensor run raises one of ``traced_failures()``, or None."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    failures = traced_failures()

    class Finder(torch.fx.Interpreter):
        found = None

        def run_node(self, node):
            try:
                return super().run_node(node)
            except failures:
                Finder.found = node
                raise

    with fake_mode:
        fake_inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        try:
            Finder(gm).run(*fake_inputs)
        except failures:
            return Finder.found
        except Exception:   # noqa: BLE001 - another failure: not this module's case
            return None
    return None


class CompiledOnFirstCall(torch.nn.Module):
    """A part of a split graph, compiled by ``compile_part(gm, inputs)`` with the real
    tensors of its first call."""

    def __init__(self, gm: torch.fx.GraphModule, compile_part):
        super().__init__()
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self._single = not isinstance(output.args[0], (tuple, list))
        if self._single:   # aot_autograd takes graphs that return a tuple
            output.args = ((output.args[0],),)
            gm.recompile()
        self.part = gm
        self._compile_part = compile_part
        self._compiled = {}   # the inputs' signature -> the part compiled for it

    def forward(self, *args):
        # a compiled part has no guards of its own: the frame around it may be symbolic,
        # and the op's result may differ in size from call to call
        key = (torch.is_grad_enabled(),) + tuple(_signature(a) for a in args)
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile_part(self.part, list(args))
        outputs = compiled(*args)
        return outputs[0] if self._single else outputs


def _signature(value):
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device,
                value.requires_grad)
    return value


def split_around(gm: torch.fx.GraphModule, node: torch.fx.Node, compile_part) -> torch.fx.GraphModule:
    """``gm`` in three parts (before ``node``, ``node`` alone, after it); the parts without
    it are compiled at their first call by ``compile_part``."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    cut = order[node]

    def part_of(n):
        return 0 if order[n] < cut else 1 if n is node else 2

    for n in gm.graph.nodes:   # Dynamo's values name symbols no part defines (the op's data-dependent sizes):
        n.meta.pop("example_value", None)   # split_module would thread them between the parts
    split = split_module(gm, None, part_of, keep_original_order=True)
    for name, module in list(split.named_children()):
        if name != "submod_1":   # (split_module names each part after its number)
            setattr(split, name, CompiledOnFirstCall(module, compile_part))
    log.info("tritonfuse: %s needs its inputs' values to be traced; it runs eagerly between two compiled parts",
             node.format_node())
    return split
