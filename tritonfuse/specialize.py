"""Graphs with symbolic sizes: one static compile per distinct input shape.

tritonfuse generates code for static shapes. When Dynamo hands over a graph with symbolic
sizes (``dynamic=True``, or a recompile after a shape changed), ``ShapeSpecializer``
stands in for it: at the first call with a new set of input shapes it traces and compiles
the same FX graph for those concrete shapes (forward, and backward when gradients are
needed), then reuses that compile whenever those shapes come back. Past
``config.max_shape_specializations`` shapes, new ones run the graph eagerly (logged once).
A graph that cannot be traced for concrete shapes at all (a Python float argument that
Dynamo passes as a tensor and reads with ``.item()``) runs eagerly from then on (logged).

These compiles happen at call time, inside a running compiled frame and possibly in many
threads at once: each runs under the process-wide compile lock (compile_lock.py), and a
shape is compiled once however many threads meet it together. Calls with shapes already
compiled take no lock.
"""
import logging

import torch

from . import config
from .compile_lock import compiling

log = logging.getLogger("tritonfuse")


def _signature(args) -> tuple:
    key = []
    for value in args:
        if isinstance(value, torch.Tensor):
            key.append((tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad,
                        value.storage_offset()))
        else:
            key.append((type(value).__name__, value))
    return tuple(key)


class ShapeSpecializer:
    def __init__(self, gm: torch.fx.GraphModule, compile_static):
        self.gm = gm
        self.compile_static = compile_static    # (gm, real example inputs) -> callable
        self.compiled = {}
        self.warned = False
        self.eager = False        # tracing for concrete shapes failed: run every call eagerly
        log.info("tritonfuse: a graph with dynamic shapes is compiled once per input shape")

    def __call__(self, *args):
        key = _signature(args)
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self._compile(key, args)
        return compiled(*args)

    def _compile(self, key, args):
        with compiling():
            compiled = self.compiled.get(key)   # another thread may have compiled it meanwhile
            if compiled is None:
                compiled = self._compile_locked(key, args)
            return compiled

    def _compile_locked(self, key, args):
        if self.eager:
            return self.gm.forward
        if len(self.compiled) >= config.max_shape_specializations:
            if not self.warned:
                log.warning("tritonfuse: more than %d input shapes for one graph; new shapes run eagerly "
                            "(tritonfuse.config.max_shape_specializations)", config.max_shape_specializations)
                self.warned = True
            return self.gm.forward
        try:
            compiled = self.compile_static(self.gm, list(args))
        except Exception as error:  # never crash the user's model
            from . import metrics
            metrics.eager_graphs += 1
            log.warning("tritonfuse: could not compile a dynamic-shape graph for concrete shapes (%s: %s); "
                        "it runs eagerly", type(error).__name__, str(error).splitlines()[0] if str(error) else "",
                        exc_info=log.isEnabledFor(logging.DEBUG))
            self.eager = True
            return self.gm.forward
        self.compiled[key] = compiled
        return compiled
