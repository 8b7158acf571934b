"""The torch.compile entry point: ``torch.compile(fn, backend="tritonfuse")``.

Dynamo hands over an FX graph of torch ops; aot_autograd (with tritonfuse's explicit
decomposition table) functionalizes it into aten graphs (forward, and backward when
gradients are needed) and each goes through ``compile_fx.compile_graph``. Mutated inputs
are written back by aot_autograd's runtime wrapper, as eager would; an inference graph
that needs none of that wrapper's work is called directly (``direct_inference``).

With ``mode="reduce-overhead"`` (or ``options={"cudagraphs": True}``, or
``TRITONFUSE_CUDAGRAPHS=1``) each compiled graph is replayed from a CUDA graph where it can
be (runtime/cudagraphs.py).

A graph with symbolic sizes (``dynamic=True``, or Dynamo's recompile after a shape
changed) is compiled once with its sizes as runtime values; if that fails, once per input
shape it meets (specialize.py). Compiles that start at call time (those, and the backward
graph aot_autograd compiles at the first backward) hold the process-wide compile lock
(compile_lock.py).

Never crash the user's model: if tritonfuse fails on a graph it logs why and runs that
graph eagerly (aten), which is always correct.
"""
import functools
import itertools
import logging

import torch

from . import config  # noqa: F401  (the knobs live there)
from .compile_lock import compiling
from .direct_inference import InferenceShortcut

log = logging.getLogger("tritonfuse")
_graph_counter = itertools.count()


def _compiler(kind, cudagraphs=None):
    """``cudagraphs``: None, or the BackwardTracker that the CUDA-graph runners of one
    compiled function share."""
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        graph_id = f"{kind}_{next(_graph_counter)}"
        compiled = _compile_or_fall_back(kind, graph_id, gm, example_inputs)
        if cudagraphs is not None:
            from .runtime.cudagraphs import wrap
            compiled = wrap(compiled, gm, example_inputs, graph_id, kind, cudagraphs)
        return compiled
    return compile_fn


def _compile_or_fall_back(kind, graph_id, gm, example_inputs):
    """The compiled graph; if compiling fails, the per-shape or the eager fallback."""
    from .compile_fx import _is_symbolic, compile_graph
    try:
        with compiling():
            return compile_graph(gm, example_inputs, graph_id, allow_guards=kind != "backward")
    except Exception as error:  # never crash the user's model
        reason = f"{type(error).__name__}: {error}"
        if any(_is_symbolic(value) for value in example_inputs):
            from .specialize import PerShapeGraph
            log.debug("tritonfuse: symbolic compile of %s failed", graph_id, exc_info=True)
            return PerShapeGraph(gm, graph_id, reason)
        from . import metrics
        metrics.eager_graphs += 1
        log.warning("tritonfuse: could not compile %s (%s); running it eagerly", graph_id, reason,
                    exc_info=log.isEnabledFor(logging.DEBUG))
        from torch._functorch.aot_autograd import make_boxed_func
        return make_boxed_func(gm.forward)


def tritonfuse_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None, **kwargs):
    """The Dynamo backend (registered as "tritonfuse" by the package's entry point).
    ``mode`` and ``options`` come from ``torch.compile``: "reduce-overhead" or
    ``{"cudagraphs": True}`` turn CUDA graphs on."""
    from torch._dynamo.backends.common import aot_autograd
    from .decompositions import decomposition_table
    from .runtime.cudagraphs import BackwardTracker, requested
    cudagraphs = BackwardTracker() if requested(mode, options) else None
    unknown = sorted(set(options or {}) - {"cudagraphs"})
    if unknown:
        log.warning("tritonfuse: ignoring unknown options %s", unknown)
    shortcut = InferenceShortcut(gm, example_inputs)
    backend = aot_autograd(
        fw_compiler=_compiler("forward", cudagraphs),
        bw_compiler=_compiler("backward", cudagraphs),
        inference_compiler=shortcut.wrap(_compiler("inference", cudagraphs)),
        decompositions=decomposition_table(),
        keep_inference_input_mutations=False,
    )
    return shortcut.callable_or(backend(gm, example_inputs))


@functools.lru_cache(None)
def _register_with_dynamo():
    """Make backend="tritonfuse" work even when the package's entry point is not installed."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "tritonfuse" not in _BACKENDS or _BACKENDS.get("tritonfuse") is None:
        register_backend(name="tritonfuse")(tritonfuse_backend)
