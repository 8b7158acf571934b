"""Compile one aten graph: the pipeline of DESIGN.md as a flat list of named passes.

    lower      GraphLowering: aten ops -> IR buffers, views, fallbacks
    schedule   Scheduler: nodes, dependencies, fusion, order
    codegen    the memory plan (in-place writes, reuse of dead buffers); each fused group ->
               the backend registered for its device; fallbacks and buffer frees -> the wrapper
    load       write the module (cached on disk by graph key) and import it
"""
import contextlib
import json
import logging
import os
import tempfile
import time

import torch

from . import code_cache, config, metrics, sym
from .codegen.memory_planning import plan_memory
from .codegen.registry import get_scheduling_class
from .codegen.wrapper import WrapperCodeGen
from .graph import GraphLowering
from .runtime.integer_errors import IntegerDivisionByZero
from .scheduler import FallbackNode, Scheduler

log = logging.getLogger("tritonfuse")

# Lists collecting the sources of the graphs compiled (or loaded) while they are open, for
# tritonfuse.testing.run_and_get_code; nothing is kept when nobody listens.
_source_listeners = []


@contextlib.contextmanager
def capture_sources():
    """Yields a list that receives ``[wrapper, kernel, ...]`` for every graph compiled or
    loaded from the cache, in any thread, until the block ends."""
    captured = []
    _source_listeners.append(captured)
    try:
        yield captured
    finally:
        _source_listeners.remove(captured)


def _record_sources(sources) -> None:
    for captured in list(_source_listeners):
        captured.append(sources)


class CompiledGraph:
    """The callable handed back to aot_autograd (boxed: takes the list of inputs).

    Triton compiles kernels at their first launch: if the first call fails inside
    generated code, the graph runs eagerly from then on (logged), so a compiler bug
    never crashes the user's model."""
    def __init__(self, module, path, eager_fn=None):
        self._boxed_call = True   # an instance attribute: wrappers copy __dict__
        self.module = module
        self.path = path
        self.call = module.call
        self.eager_fn = eager_fn
        self.first_call = True

    def __call__(self, args):
        if not self.first_call:
            return list(self.call(args))
        saved = list(args)
        try:
            result = list(self.call(args))
        except IntegerDivisionByZero:   # eager's own error for these inputs, not a compiler bug
            raise
        except Exception as error:
            if self.eager_fn is None:
                raise
            log.warning("tritonfuse: generated code %s failed on its first call (%s: %s); running the graph "
                        "eagerly", self.path, type(error).__name__, error)
            metrics.add("eager_graphs")
            self.call = lambda inputs: self.eager_fn(*inputs)
            result = list(self.call(saved))
        self.first_call = False
        return result


def compile_graph(gm: torch.fx.GraphModule, example_inputs, graph_id="graph", sizevars=None,
                  allow_guards=False) -> CompiledGraph:
    """Compile one aten graph. Its sizes are symbolic when Dynamo made them dynamic: the
    code then takes them as runtime values and serves every size (``sizevars``: the
    symbols' example values and guards; ``specialize`` compiles for the examples' shapes).
    ``allow_guards``: Dynamo still builds the guards of this graph's frame (forward and
    inference graphs), so the compile may add guards on the sizes."""
    if sizevars is None:
        sizevars = sizevars_for(example_inputs)
        sizevars.allow_guards = allow_guards
    with sym.using_sizevars(sizevars):
        return _compile_graph(gm, example_inputs, graph_id, sizevars)


def sizevars_for(example_inputs) -> sym.SizeVars:
    from torch._guards import detect_fake_mode
    if not any(_is_symbolic(value) for value in example_inputs):
        return sym.SizeVars()
    fake_mode = detect_fake_mode(example_inputs)
    return sym.SizeVars(fake_mode.shape_env if fake_mode is not None else None)


def _is_symbolic(value) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))


def _compile_graph(gm, example_inputs, graph_id, sizevars) -> CompiledGraph:
    has_constants = any(n.op == "get_attr" for n in gm.graph.nodes)
    hints = sorted((str(s), int(v)) for s, v in sizevars.hints.items()) if sizevars.specialize else ()
    key = code_cache.graph_key(gm, example_inputs, extra=hints)
    use_cache = config.graph_cache and not has_constants
    if use_cache:
        compiled = _load_cached(key, gm, sizevars)
        if compiled is not None:
            return compiled

    started = time.perf_counter()
    graph = lower(gm, example_inputs, graph_id)
    scheduler = schedule(graph)
    source, kernel_sources, kernel_names = codegen(graph, scheduler)
    symbolic = bool(graph.symbol_sources) and not sizevars.specialize
    meta = {"kernels": kernel_names, "fallbacks": {k: v for k, v in metrics.fallbacks.items()},
            "symbolic": symbolic, "assumptions": [str(a) for a in sizevars.assumptions]}
    if use_cache:
        path = code_cache.write_module(key, source)
        with open(path[:-3] + ".json", "w") as handle:
            json.dump(meta, handle)
    else:
        fd, path = tempfile.mkstemp(suffix=".py", prefix="tritonfuse_")
        with os.fdopen(fd, "w") as handle:
            handle.write(source)
    module = code_cache.load_module(path, {"CONSTANTS": graph.constants} if graph.constants else None)
    _record_sources([source] + kernel_sources)
    _debug_dump(graph_id, source, kernel_sources, kernel_names)
    metrics.symbolic_graphs += symbolic
    log.debug("tritonfuse: compiled %s in %.2fs (%d kernels)", graph_id, time.perf_counter() - started,
              len(kernel_names))
    return CompiledGraph(module, path, gm.forward)


def lower(gm, example_inputs, graph_id) -> GraphLowering:
    graph = GraphLowering(gm, example_inputs, graph_id)
    graph.run(*example_inputs)
    return graph


def schedule(graph) -> Scheduler:
    wrapper = WrapperCodeGen(graph)
    backends = {}

    def backend_for_device(device):
        if device.type not in backends:
            backends[device.type] = get_scheduling_class(device.type)(None, wrapper, graph)
        return backends[device.type]

    scheduler = Scheduler(graph, backend_for_device)
    for group in scheduler.groups:  # every device with a kernel gets its backend
        if not isinstance(group, FallbackNode):
            backend_for_device(group.device)
    for backend in backends.values():
        backend.scheduler = scheduler
    scheduler.backends = backends
    scheduler.wrapper = wrapper
    return scheduler


def codegen(graph, scheduler):
    wrapper = scheduler.wrapper
    wrapper.memory_plan = plan = plan_memory(graph, scheduler)
    names_before = len(metrics.generated_kernels)
    for i, group in enumerate(scheduler.groups):
        if isinstance(group, FallbackNode):
            wrapper.codegen_fallback(group)
        elif group.is_empty():
            wrapper.allocate_outputs(group, set())
        else:
            scheduler.backends[group.device.type].codegen_node(group)
        wrapper.free(plan.frees_after(i))
    for backend in scheduler.backends.values():
        backend.flush()
    return wrapper.generate(), wrapper.kernel_sources, metrics.generated_kernels[names_before:]


def _load_cached(key, gm, sizevars):
    path = code_cache.module_path(key)
    if not os.path.exists(path):
        return None
    try:
        with open(path[:-3] + ".json") as handle:
            meta = json.load(handle)
        if not sizevars.holds(meta.get("assumptions", [])):
            return None      # compiled for sizes that this compile's guards do not promise
        module = code_cache.load_module(path)
    except Exception as error:  # a corrupt or foreign file: regenerate
        log.warning("tritonfuse: ignoring unreadable cached graph %s (%s)", path, error)
        return None
    metrics.graph_cache_hits += 1
    metrics.cached_kernels.extend(meta.get("kernels", []))
    metrics.fallbacks.update(meta.get("fallbacks", {}))
    metrics.symbolic_graphs += bool(meta.get("symbolic"))
    with open(path) as handle:
        _record_sources([handle.read()])
    return CompiledGraph(module, path, gm.forward)


def _debug_dump(graph_id, source, kernel_sources, kernel_names):
    if not config.debug:
        return
    folder = tempfile.mkdtemp(prefix=f"tritonfuse_debug_{graph_id}_")
    with open(os.path.join(folder, "wrapper.py"), "w") as handle:
        handle.write(source)
    for name, kernel in zip(kernel_names, kernel_sources):
        ext = ".cpp" if kernel.lstrip().startswith(("//", "#include", "extern")) else ".py"
        with open(os.path.join(folder, name + ext), "w") as handle:
            handle.write(kernel)
    print(f"tritonfuse: generated code for {graph_id} written to {folder}")
