"""Compile one aten graph: the pipeline of DESIGN.md as a flat list of named passes.

    lower      GraphLowering: aten ops -> IR buffers, views, fallbacks
    schedule   Scheduler: nodes, dependencies, fusion, order
    codegen    the memory plan (in-place writes, reuse of dead buffers); each fused group ->
               the backend registered for its device; fallbacks and buffer frees -> the wrapper
    load       store the module (on disk by graph key, through cache_store) and execute it
"""
import contextlib
import copy
import logging
import operator
import os
import tempfile
import threading
import time

import torch

from . import cache_store, code_cache, config, metrics, sym
from .codegen.memory_planning import plan_memory
from .compile_lock import compiling
from .codegen.registry import get_scheduling_class
from .codegen.wrapper import WrapperCodeGen
from .compile_options import CompileOptions
from .graph import GraphLowering
from .layout_opt import LayoutPlan, plan_layouts, report_output_strides
from .lowering.matmul import cuda_matmul_allows_tf32
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

    Triton compiles kernels at their first launch, so some failures surface only at the
    first call. A graph loaded from the on-disk cache that fails there is deleted from the
    cache and compiled afresh (`rebuild`), then called again: a damaged cache entry never
    sends a graph to eager. A freshly compiled graph that fails on its first call runs
    eagerly from then on (logged), so a compiler bug never crashes the user's model.
    The inputs the graph writes into (``MUTATED_INPUTS``) get their old values back before
    a retry: the eager graph holds the ``copy_`` into them itself, and writes them once."""
    def __init__(self, module, path, eager_fn=None, rebuild=None, output_strides=None, cache_key=None,
                 options=None):
        self._boxed_call = True   # an instance attribute: wrappers copy __dict__
        self.module = module
        self.path = path
        # its graph-cache entry (None: not kept) and the options it was compiled with: what
        # aot_cache.py keeps to load it again
        self.cache_key, self.options = cache_key, options
        self.call = module.call
        self.eager_fn = eager_fn
        self.rebuild = rebuild
        # the strides reported to aot_autograd for the outputs (layout_opt.py), which the
        # backward was compiled for: the eager fallback gives its outputs these too
        self.output_strides = output_strides
        self.first_call = True
        self._failure_lock = threading.Lock()   # threads whose first calls fail together

    def __call__(self, args):
        if not self.first_call:
            return list(self.call(args))
        saved = list(args)
        for i in getattr(self.module, "OVERWRITTEN_INPUTS", ()):   # the retry needs their values
            saved[i] = saved[i].clone()
        # inputs the graph writes into: a failed call may have written some already, and
        # the retry (which writes them itself) must start from their old values
        old_values = [(saved[i], saved[i].clone()) for i in getattr(self.module, "MUTATED_INPUTS", ())]
        call = self.call
        try:
            result = list(call(args))
        except IntegerDivisionByZero:   # eager's own error for these inputs, not a compiler bug
            raise
        except Exception as error:
            for tensor, old in old_values:
                tensor.copy_(old)
            result = self._first_call_failed(call, error, saved)
        self.first_call = False
        self.rebuild = None
        return result

    def _first_call_failed(self, call, error, saved):
        with self._failure_lock:
            if self.call is not call:   # another thread met the failure and replaced the code
                return list(self.call(saved))
            if self.rebuild is not None:
                log.warning("tritonfuse: cached graph %s failed on its first call (%s: %s); compiling it again",
                            self.path, type(error).__name__, error)
                rebuild, self.rebuild = self.rebuild, None
                try:
                    with compiling():      # at call time: with Dynamo's compiles (compile_lock.py)
                        fresh = rebuild(saved)
                    self.module, self.path, self.call = fresh.module, fresh.path, fresh.call
                    return list(self.call(list(saved)))
                except IntegerDivisionByZero:
                    raise
                except Exception as rebuild_error:   # the fresh compile fails too: eager
                    error = rebuild_error
            if self.eager_fn is None:
                raise error
            log.warning("tritonfuse: generated code %s failed on its first call (%s: %s); running the graph "
                        "eagerly", self.path, type(error).__name__, error)
            metrics.record_eager_graph(self.path, error)
            eager_fn, strides = self.eager_fn, self.output_strides
            self.call = lambda inputs: _with_strides(eager_fn(*inputs), strides)
            return list(self.call(saved))


def _with_strides(outputs, strides):
    """``outputs``, each tensor copied into its entry of ``strides`` where it has other ones."""
    if not strides:
        return outputs
    outputs = list(outputs)
    for i, (value, stride) in enumerate(zip(outputs, strides)):
        if stride is not None and isinstance(value, torch.Tensor) and \
                any(size > 1 and have != want for size, have, want in zip(value.shape, value.stride(), stride)):
            outputs[i] = torch.empty_strided(value.shape, stride, dtype=value.dtype, device=value.device).copy_(value)
    return outputs


def compile_graph(gm: torch.fx.GraphModule, example_inputs, graph_id="graph", sizevars=None,
                  allow_guards=False, options: CompileOptions = None) -> CompiledGraph:
    """Compile one aten graph. Its sizes are symbolic when Dynamo made them dynamic: the
    code then takes them as runtime values and serves every size (``sizevars``: the
    symbols' example values and guards; ``specialize`` compiles for the examples' shapes).
    ``allow_guards``: Dynamo still builds the guards of this graph's frame (forward and
    inference graphs), so the compile may add guards on the sizes. ``options``: the
    torch.compile call's (compile_options.py), by default tritonfuse.config's."""
    if sizevars is None:
        sizevars = sizevars_for(example_inputs)
        sizevars.allow_guards = allow_guards
    if options is None:
        options = CompileOptions.from_torch_compile()
    with sym.using_sizevars(sizevars):
        layout_plan = plan_layouts(gm, example_inputs, graph_kind(graph_id))
        compiled = _compile_graph(gm, example_inputs, graph_id, sizevars, options, layout_plan)
    report_output_strides(layout_plan.reported_strides, compiled.output_strides or ())
    return compiled


def graph_kind(graph_id: str) -> str:
    """"forward", "backward" or "inference", from the id backend.py gives the graph."""
    kind = graph_id.split("_")[0]
    return kind if kind in ("forward", "backward") else "inference"


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


def _compile_graph(gm, example_inputs, graph_id, sizevars, options, layout_plan: LayoutPlan,
                   read_cache=True, write_cache=True) -> CompiledGraph:
    constants = code_cache.constants_fingerprint(gm)
    hints = sorted((str(s), int(v)) for s, v in sizevars.hints.items()) if sizevars.specialize else []
    key = code_cache.graph_key(gm, example_inputs, extra=hints + _option_knobs(options, example_inputs)
                               + _layout_knobs(layout_plan) + [("constants", constants)])
    use_cache = config.graph_cache and constants is not None and write_cache
    if use_cache and read_cache:
        compiled = _load_cached(key, gm, example_inputs, graph_id, sizevars, options, layout_plan)
        if compiled is not None:
            return compiled

    started = time.perf_counter()
    cache_store.sweep_once(config.cache_dir)   # the cold path: litter of killed processes
    phase_start = time.perf_counter()
    graph = lower(gm, example_inputs, graph_id, options, layout_plan)
    phase_start = _phase_done("lower", phase_start)
    scheduler = schedule(graph)
    phase_start = _phase_done("schedule", phase_start)
    source, kernel_sources, kernel_names = codegen(graph, scheduler)
    phase_start = _phase_done("codegen", phase_start)
    symbolic = bool(graph.symbol_sources) and not sizevars.specialize
    output_strides = _output_strides(graph) if layout_plan.reported_strides is not None else None
    meta = {"kernels": kernel_names, "fallbacks": {k: v for k, v in metrics.fallbacks.items()},
            "symbolic": symbolic, "assumptions": [str(a) for a in sizevars.assumptions],
            "output_strides": output_strides, "constants": graph.constant_targets}
    if use_cache:
        path = code_cache.write_entry(key, source, meta)
    else:
        path = f"<tritonfuse {graph_id} {key[:16]}>"
    module = code_cache.load_module(source, path, {"CONSTANTS": graph.constants} if graph.constants else None)
    _phase_done("load", phase_start)
    _record_sources([source] + kernel_sources)
    _debug_dump(graph_id, source, kernel_sources, kernel_names)
    metrics.symbolic_graphs += symbolic
    log.debug("tritonfuse: compiled %s in %.2fs (%d kernels)", graph_id, time.perf_counter() - started,
              len(kernel_names))
    return CompiledGraph(module, path, gm.forward, output_strides=output_strides,
                         cache_key=key if use_cache else None, options=options)


def _layout_knobs(layout_plan) -> list:
    """What layout optimization adds to the graph cache key (nothing where it is off)."""
    if not layout_plan.enabled:
        return []
    return [("layout_opt", sorted(layout_plan.free_outputs), layout_plan.reported_strides is not None)]


def _output_strides(graph) -> list:
    """The strides of the graph's outputs as ints (None: not a tensor, or symbolic)."""
    strides = []
    for value in graph.outputs:
        layout = getattr(value, "layout", None)
        strides.append(list(layout.int_stride()) if layout is not None and layout.is_static() else None)
    return strides


def _phase_done(phase: str, start: float) -> float:
    """Record the seconds since ``start`` as compile phase ``phase``; the time now."""
    now = time.perf_counter()
    metrics.add_seconds(phase, now - start)
    return now


def _option_knobs(options, example_inputs) -> list:
    """What the options add to the graph cache key: under max-autotune the generated code
    holds the GEMM choices made on this GPU with this TF32 setting and autotune mode
    (``none`` takes the template untimed), and its prologues or not; a backward's code may write over the inputs
    aot_autograd donates."""
    donated = [("donated_inputs", options.donated_inputs)] if options.donated_inputs else []
    if not options.max_autotune:
        return donated
    gpus = sorted({torch.cuda.get_device_name(t.device) for t in example_inputs
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"})
    return [("max_autotune", True), ("gemm_backends", config.gemm_backends), ("autotune", config.autotune),
            ("gemm_prologue_fusion", config.gemm_prologue_fusion), ("allow_tf32", cuda_matmul_allows_tf32()),
            ("gpus", gpus)] + donated


def lower(gm, example_inputs, graph_id, options=None, layout_plan=None) -> GraphLowering:
    graph = GraphLowering(gm, example_inputs, graph_id, options, layout_plan)
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
    return wrapper.generate(), wrapper.kernel_sources, wrapper.kernel_names


def _load_cached(key, gm, example_inputs, graph_id, sizevars, options, layout_plan):
    """The compiled graph stored under `key`, or None: absent, compiled for sizes this
    compile's guards do not promise (then compiled again), or damaged or not loading
    (then the entry is deleted by cache_store and the graph compiled again)."""
    entry = code_cache.read_entry(key)
    if entry is None:
        return None
    try:
        if not sizevars.holds(entry[1].get("assumptions", [])):
            return None
    except Exception as error:  # noqa: BLE001 - verified, yet not assumptions this version reads
        code_cache.discard_entry(key, f"unusable assumptions in its meta ({type(error).__name__}: {error})")
        return None

    def rebuild(_inputs):
        """Compile the graph afresh at call time: Dynamo's guards are built by now, so the
        compile adds none (the loaded entry's assumptions are guards already)."""
        code_cache.discard_entry(key, "failed on its first call")
        fresh_sizevars = copy.copy(sizevars)
        fresh_sizevars.allow_guards, fresh_sizevars.assumptions = False, []
        with sym.using_sizevars(fresh_sizevars):
            return _compile_graph(gm, example_inputs, graph_id, fresh_sizevars, options, layout_plan,
                                  read_cache=False)

    return _compiled_from_entry(key, entry, gm, rebuild, options)


def load_compiled_graph(key, gm, graph_id, options, discard_owner):
    """The static graph stored under `key` (for aot_cache.py: ``gm``, its aten graph,
    without node metadata), or None. If it fails on its first call, it and the entry that
    loaded it (``discard_owner()``) are deleted, and it is compiled afresh for the inputs of
    that call, for this process only: outside aot_autograd's compile, the layout choices
    that the other graphs of the entry were compiled for are unknown (layout_opt.py), so
    its outputs are copied into the strides recorded for them. The next process compiles
    the whole Dynamo graph again."""
    entry = code_cache.read_entry(key)
    if entry is None or entry[1].get("assumptions"):
        return None
    strides = entry[1].get("output_strides")

    def rebuild(inputs):
        code_cache.discard_entry(key, "failed on its first call")
        discard_owner()
        fresh = _compile_for_inputs(gm, inputs, graph_id, options)
        if strides:
            call = fresh.call
            fresh.call = lambda args: _with_strides(call(args), strides)
        return fresh

    return _compiled_from_entry(key, entry, gm, rebuild, options)


def _compile_for_inputs(gm, inputs, graph_id, options):
    """Compile ``gm`` (no node metadata) for real, static ``inputs``, kept out of the graph
    cache: their fake twins are propagated through it first, as the compile reads every
    node's value."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(value) if isinstance(value, torch.Tensor) else value for value in inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    sizevars = sizevars_for(fakes)
    with sym.using_sizevars(sizevars):
        layout_plan = plan_layouts(gm, fakes, graph_kind(graph_id))
        return _compile_graph(gm, fakes, graph_id, sizevars, options, layout_plan, read_cache=False,
                              write_cache=False)


def _compiled_from_entry(key, entry, gm, rebuild, options):
    """The CompiledGraph of a cache entry: its module loaded, with the constants it reads
    taken from ``gm`` (the key holds their contents)."""
    source, meta, path = entry
    try:
        targets = meta.get("constants") or {}
        constants = {name: operator.attrgetter(target)(gm) for name, target in targets.items()}
        module = code_cache.load_module(source, path, {"CONSTANTS": constants} if constants else None)
        compiled = CompiledGraph(module, path, gm.forward, rebuild, meta.get("output_strides"), cache_key=key,
                                 options=options)
    except Exception as error:  # e.g. a kernel library of the entry cannot be built any more
        code_cache.discard_entry(key, f"{type(error).__name__}: {error}")
        return None
    metrics.graph_cache_hits += 1
    metrics.cached_kernels.extend(meta.get("kernels", []))
    metrics.fallbacks.update(meta.get("fallbacks", {}))
    metrics.symbolic_graphs += bool(meta.get("symbolic"))
    _record_sources([source])
    return compiled


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
