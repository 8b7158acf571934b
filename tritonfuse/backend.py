"""The torch.compile entry point: ``torch.compile(fn, backend="tritonfuse")``.

Dynamo hands over an FX graph of torch ops; aot_autograd (with tritonfuse's explicit
decomposition table) functionalizes it into aten graphs (forward, and backward when
gradients are needed) and each goes through ``compile_fx.compile_graph``. Mutated inputs
that need no gradient stay in the graph (``keep_inference_input_mutations``): the kernel
computing an input's new value writes it there (lowering/input_mutation.py); other
mutations (of metadata, of inputs that require grad) are written back by aot_autograd's
runtime wrapper, as eager would. An inference graph that needs none of that wrapper's work
is called directly (``direct_inference``).

torch.compile's ``mode`` and ``options`` become one ``CompileOptions`` per call
(compile_options.py): with ``mode="max-autotune"`` (or ``options={"max_autotune": True}``,
or ``TRITONFUSE_MAX_AUTOTUNE=1``) matmuls may run as Triton GEMM templates with their
epilogues fused; with ``mode="reduce-overhead"`` or ``"max-autotune"`` (or
``options={"cudagraphs": True}``, or ``TRITONFUSE_CUDAGRAPHS=1``) each compiled graph is
replayed from a CUDA graph where it can be (runtime/cudagraphs.py).

A graph with symbolic sizes (``dynamic=True``, or Dynamo's recompile after a shape
changed) is compiled once with its sizes as runtime values; if that fails, once per input
shape it meets (specialize.py). Compiles that start at call time (those, and the backward
graph aot_autograd compiles at the first backward) hold the process-wide compile lock
(compile_lock.py).

Never crash the user's model: if tritonfuse or aot_autograd fails on a graph (an op it
cannot decompose or trace, a data-dependent value from ``.item()``, a bug), it logs why
once for that graph and runs the graph eagerly (aten), which is always correct.
"""
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging

import torch

from . import aot_cache, config  # noqa: F401  (the knobs live in config)
from .compile_lock import compiling
from .compile_options import CompileOptions
from .direct_inference import InferenceShortcut

log = logging.getLogger("tritonfuse")
_graph_counter = itertools.count()


def _runs_eagerly(what: str, error: Exception) -> None:
    """Count and log (once per graph) a graph that tritonfuse gives up on."""
    from . import metrics
    metrics.record_eager_graph(what, error)
    log.warning("tritonfuse: could not compile %s (%s: %s); running it eagerly", what, type(error).__name__,
                error, exc_info=log.isEnabledFor(logging.DEBUG))


def _dynamo_control_flow() -> tuple:
    """Exceptions Dynamo expects back from a backend (a request to restart its analysis):
    never swallowed."""
    from torch._dynamo import exc
    return tuple(getattr(exc, name) for name in ("RestartAnalysis", "ShortenTraceback", "SkipFrame")
                 if hasattr(exc, name))


def _dynamo_breaks_the_graph_for(error: Exception) -> bool:
    """Whether Dynamo turns ``error`` into a graph break: a fake-tensor error (an op whose
    output depends on data, as narrow with a tensor start) splits the graph around the
    op rather than running all of it eagerly. Dynamo raises instead when the user marked
    functions allow_in_graph: then, and whenever in doubt, tritonfuse runs the graph
    eagerly itself."""
    from torch._dynamo import exc
    if not isinstance(error, getattr(exc, "exceptions_allowed_to_be_fallback", ())):
        return False
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        return not InstructionTranslator.current_tx().output.has_user_defined_allowed_in_graph
    except Exception:   # another torch version: no way to tell
        return False


def _effect_tokens_in_graph():
    """Ops with side effects (linalg's error checks) are threaded through effect tokens;
    made and consumed inside the graph (``prims._make_token``, ``_sink_tokens``), as
    Inductor has them, they need no graph input that aot_autograd would pass as None."""
    from torch._functorch import config as functorch_config
    if not hasattr(functorch_config, "unlift_effect_tokens"):
        return contextlib.nullcontext()
    return functorch_config.patch(unlift_effect_tokens=True)


def _compiler(kind, options: CompileOptions, cudagraphs=None, capture=None):
    """``options``: the torch.compile call's; ``cudagraphs``: None, or the BackwardTracker
    that the CUDA-graph runners of one compiled function share; ``capture``: None, or the
    aot_cache.Capture that keeps this compile's result."""
    def compile_fn(gm: torch.fx.GraphModule, example_inputs):
        graph_id = f"{kind}_{next(_graph_counter)}"
        compiled = _compile_or_fall_back(kind, graph_id, gm, example_inputs, options)
        if capture is not None:
            capture.record_graph(kind, gm, compiled)
        if cudagraphs is not None:
            from .runtime.cudagraphs import wrap
            compiled = wrap(compiled, gm, example_inputs, graph_id, kind, cudagraphs)
        return compiled
    return compile_fn


def _compile_or_fall_back(kind, graph_id, gm, example_inputs, options):
    """The compiled graph; if compiling fails, the per-shape or the eager fallback."""
    from .compile_fx import _is_symbolic, compile_graph
    if kind == "backward" and not options.cudagraphs:
        options = dataclasses.replace(options, donated_inputs=_donated_inputs(example_inputs))
    try:
        with compiling():
            return compile_graph(gm, example_inputs, graph_id, allow_guards=kind != "backward", options=options)
    except Exception as error:  # never crash the user's model
        if any(_is_symbolic(value) for value in example_inputs):
            from .specialize import PerShapeGraph
            log.debug("tritonfuse: symbolic compile of %s failed", graph_id, exc_info=True)
            return PerShapeGraph(gm, graph_id, f"{type(error).__name__}: {error}", options)
        _runs_eagerly(graph_id, error)
        from torch._functorch.aot_autograd import make_boxed_func
        return make_boxed_func(gm.forward)


def _donated_inputs(example_inputs) -> tuple:
    """The backward graph's inputs that aot_autograd donates (``bw_donated_idxs``, the saved
    tensors that alias no forward input or output; aot_autograd refuses a later backward
    with ``retain_graph``), less any whose storage another input shares (two saved views
    of one buffer: writing over one would change the other)."""
    from torch._guards import TracingContext
    from torch.multiprocessing.reductions import StorageWeakRef
    context = TracingContext.try_get()
    donated = getattr(getattr(context, "fw_metadata", None), "bw_donated_idxs", None) or ()
    storage = {i: StorageWeakRef(value.untyped_storage()) for i, value in enumerate(example_inputs)
               if isinstance(value, torch.Tensor) and value.layout == torch.strided}
    counts = collections.Counter(storage.values())
    return tuple(sorted(i for i in donated if i in storage and counts[storage[i]] == 1))


def tritonfuse_backend(gm: torch.fx.GraphModule, example_inputs, mode=None, options=None, **kwargs):
    """The Dynamo backend (registered as "tritonfuse" by the package's entry point).
    ``mode`` and ``options`` come from ``torch.compile`` (compile_options.py):
    "max-autotune" or ``{"max_autotune": True}`` turn the GEMM templates on,
    "reduce-overhead" or ``{"cudagraphs": True}`` CUDA graphs."""
    # Everything a compile uses is imported now, before aot_autograd traces: a module first
    # imported by a decomposition inside the trace runs its top level there, and a tensor it
    # makes (torch.tensor(...)) lands in the user's graph (aot_autograd then refuses it).
    from . import compile_fx, lowering  # noqa: F401
    from .codegen.registry import get_scheduling_class
    device_types = {v.device.type for v in example_inputs if isinstance(v, torch.Tensor)}
    for device_type in device_types:
        with contextlib.suppress(KeyError):   # (an unsupported device: the compile says so)
            get_scheduling_class(device_type)
    if "cuda" in device_types:   # Triton's version key, hashed while aot_autograd traces
        from .runtime.async_compile import hash_triton_in_background
        hash_triton_in_background()
    return _compile(gm, example_inputs, CompileOptions.from_torch_compile(mode, options))


def _compile(gm, example_inputs, options: CompileOptions):
    """One Dynamo graph (or a part of a split one) through aot_autograd."""
    from torch._dynamo.backends.common import aot_autograd
    from .decompositions import decomposition_table
    from .runtime.cudagraphs import BackwardTracker
    cudagraphs = BackwardTracker() if options.cudagraphs else None
    with compiling():   # aot_autograd's make_fx trace too: see compile_lock.py
        return _compile_with_aot_autograd(gm, example_inputs, aot_autograd, decomposition_table, options,
                                          cudagraphs)


def _compile_with_aot_autograd(gm, example_inputs, aot_autograd, decomposition_table, options, cudagraphs):
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    from .merge_linears import merge_linears
    merge_linears(gm)   # before the cache key and the trace: both see the merged graph
    shortcut = InferenceShortcut(gm, example_inputs)
    key = aot_cache.key_for(gm, example_inputs, options)
    if key is not None:   # a warm start: aot_autograd's result from the disk
        with _effect_tokens_in_graph():
            cached = aot_cache.load(key, example_inputs, shortcut)
        if cached is not None:
            return cached
    capture = aot_cache.Capture(key) if key is not None else None
    backend = aot_autograd(
        fw_compiler=_compiler("forward", options, cudagraphs, capture),
        bw_compiler=_compiler("backward", options, cudagraphs, capture),
        inference_compiler=shortcut.wrap(_compiler("inference", options, cudagraphs, capture)),
        decompositions=decomposition_table(),
        # mutations of inputs that need no gradient stay in the graph as copy_(input, value)
        # (batch norm's running statistics, x.add_(1)): the kernel that computes the value
        # writes it into the input (lowering/input_mutation.py), no eager copy_ after the graph
        keep_inference_input_mutations=True,
        # the forward saves what is cheapest to keep: cheap pointwise work (casts, masks,
        # activations) is recomputed in the backward's kernels instead of written out and
        # read back (the bf16 logits of a language model rather than their float32 copy)
        partition_fn=(min_cut_rematerialization_partition if config.partitioner == "min_cut"
                      else default_partition),
    )
    try:
        with _effect_tokens_in_graph(), aot_cache.capturing(capture):
            compiled = backend(gm, example_inputs)
    except _dynamo_control_flow():
        raise
    except Exception as error:  # aot_autograd could not trace or decompose the graph
        split = _split_around_untraceable(gm, example_inputs, error, options)
        if split is not None:
            return split
        if _dynamo_breaks_the_graph_for(error):
            raise   # Dynamo runs the failing op eagerly and compiles the ops around it
        _runs_eagerly(f"a graph through aot_autograd ({len(gm.graph.nodes)} nodes)", error)
        return gm.forward
    return shortcut.callable_or(compiled)


def _split_around_untraceable(gm, example_inputs, error, options):
    """For an op whose trace needs its inputs' values (split_data_dependent.py): the graph
    split around it, the other parts compiled at their first call; else None."""
    from .split_data_dependent import first_untraceable_node, split_around, traced_failures
    if not isinstance(error, traced_failures()):
        return None
    node = first_untraceable_node(gm, example_inputs)
    if node is None:
        return None
    return split_around(gm, node, lambda part, inputs: _compile(part, inputs, options)).forward


@functools.lru_cache(None)
def _register_with_dynamo():
    """Make backend="tritonfuse" work even when the package's entry point is not installed."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "tritonfuse" not in _BACKENDS or _BACKENDS.get("tritonfuse") is None:
        register_backend(name="tritonfuse")(tritonfuse_backend)
