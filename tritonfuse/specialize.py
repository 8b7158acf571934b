"""The per-shape fallback for graphs with symbolic sizes.

A graph with symbolic sizes is normally compiled once, with its sizes as runtime values
(compile_fx.py). When that fails (an op whose lowering needs a concrete size, a size the
generated code cannot read from its inputs), ``PerShapeGraph`` stands in for it: at the
first call with a new set of input shapes it compiles the same aten graph with every size
symbol replaced by that call's value, and reuses the compile when those shapes come back.
No tracing happens at call time: the aten graph is lowered as it is, so nothing re-enters
Dynamo or aot_autograd from inside a running compiled frame.

Past ``config.max_shape_specializations`` shapes, new shapes run the graph eagerly (logged
once, each counted in ``metrics.eager_graphs``).

These compiles run at call time, possibly in many threads at once: they hold the
process-wide compile lock that Dynamo's compiles hold too (compile_lock.py), and a shape
is compiled once however many threads meet it together. Known shapes take no lock.
"""
import logging

import sympy
import torch

from . import config, metrics, sym
from .compile_lock import compiling

log = logging.getLogger("tritonfuse")



def _signature(args) -> tuple:
    key = []
    for value in args:
        if isinstance(value, torch.Tensor):
            key.append((tuple(value.shape), value.stride(), value.storage_offset()))
        else:
            key.append((type(value).__name__, value))
    return tuple(key)


class PerShapeGraph:
    """A boxed callable (takes the list of inputs) compiling ``gm`` once per input shape."""

    def __init__(self, gm: torch.fx.GraphModule, graph_id: str, reason: str, options=None):
        self._boxed_call = True   # an instance attribute: wrappers copy __dict__
        self.gm = gm
        self.options = options    # the torch.compile call's CompileOptions
        self.graph_id = graph_id
        self.placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
        self.compiled = {}
        self.warned = False
        log.warning("tritonfuse: %s cannot be compiled for symbolic sizes (%s); it is compiled once per input "
                    "shape instead", graph_id, reason)

    def __call__(self, args):
        key = _signature(args)
        compiled = self.compiled.get(key)
        if compiled is None:
            with compiling():   # with Dynamo's compiles and other threads' (compile_lock.py)
                compiled = self.compiled.get(key)
                if compiled is None:
                    compiled = self._compile(key, args)
        return compiled(args)

    def _compile(self, key, args):
        if len(self.compiled) >= config.max_shape_specializations:
            metrics.record_eager_graph(f"{self.graph_id} {key}", "more than tritonfuse.config.max_shape_specializations "
                                       "input shapes")
            if not self.warned:
                log.warning("tritonfuse: more than %d input shapes for %s; new shapes run eagerly "
                            "(tritonfuse.config.max_shape_specializations)", config.max_shape_specializations,
                            self.graph_id)
                self.warned = True
            compiled = self._eager
        else:
            from .compile_fx import compile_graph
            sizevars = sym.SizeVars(specialize=True, hints=self._hints(args))
            try:
                compiled = compile_graph(self.gm, list(args), f"{self.graph_id}_shape{len(self.compiled)}", sizevars,
                                         options=self.options)
                metrics.static_specializations += 1
            except Exception as error:  # never crash the user's model
                metrics.record_eager_graph(f"{self.graph_id} {key}", error)
                log.warning("tritonfuse: could not compile %s for shapes %s (%s: %s); they run eagerly",
                            self.graph_id, key, type(error).__name__, error)
                compiled = self._eager
        self.compiled[key] = compiled
        return compiled

    def _eager(self, args):
        return list(self.gm.forward(*args))

    def _hints(self, args) -> dict:
        """{size symbol: its value in this call}, read off the placeholders' symbolic metas."""
        hints = {}

        def match(expr, value):
            expr = sym.sint(expr)
            if isinstance(expr, sympy.Symbol):
                hints[expr] = int(value)
        for meta, value in zip(self.placeholders, args):
            if isinstance(meta, torch.Tensor) and isinstance(value, torch.Tensor):
                for size, actual in zip(meta.shape, value.shape):
                    match(size, actual)
                for stride, actual in zip(meta.stride(), value.stride()):
                    match(stride, actual)
            elif isinstance(meta, torch.SymInt) and isinstance(value, int):
                match(meta, value)
        return hints
