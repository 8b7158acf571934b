"""TritonLauncher: the object generated wrapper code makes once per kernel and calls per run.

    launcher = TritonLauncher(name="triton_poi_fused_add_0", source=SOURCE, kind="pointwise",
                              numels={"x": 4096}, mutated_arg_indices=[1], device_type="cuda")
    launcher.run(in_ptr0, out_ptr0, 4096)      # non-constexpr kernel args, in order

Compiled (CUDA) kernels build in the background (runtime/async_compile.py), every
candidate config at once (only the tuning result where the autotune cache holds one for
the kernel, its sizes and the GPU), from when generated code makes the launcher. The first `run`
waits for the binaries it needs, picks a launch config (heuristics, tuning results of
this process or the autotune cache, benchmarking) and launches; later runs go straight to
the chosen binary.
CPU tensors run under Triton's interpreter without TRITON_INTERPRET being set for the
process, so compiled CUDA kernels in the same process stay compiled.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

import triton

from .. import metrics
from .. import config as tf_config
from . import async_compile, autotuner
from .direct_launch import make_direct_launch
from .kernel_modules import load_kernel  # noqa: F401 - where callers have found it
from .heuristics import KINDS, MAX_GRID_YZ, NUMEL_ARGS, Config, candidate_configs, size_key

log = logging.getLogger("tritonfuse.autotune")

# First runs (load, Triton compile, config choice, benchmarks) take turns, process-wide:
# candidates benchmarked by two threads at once on one GPU time each other, not themselves
# (and those timings are stored), and Triton's compiler parses Python ASTs, whose C-level
# state CPython shares between threads. Later runs take no lock.
first_runs = threading.RLock()


def _new_locks_after_fork() -> None:
    """A forked child has only the thread that forked: a first run that another thread
    was making would hold the lock there for ever."""
    global first_runs
    first_runs = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_after_fork)


# --- the interpreter, scoped to one call ------------------------------------------------

class _InterpState:
    """Process-wide: the interpreter keeps global state, so interpreted launches are
    serialized by `lock`, and the patches below are installed once for the outermost one."""
    lock = threading.RLock()
    depth = 0
    device_fns: dict = {}          # raw python fn -> InterpretedFunction
    saved_call = None
    patch_lang = None
    patched_langs: frozenset = frozenset()   # ids of the modules the open patch covers


def _index_of_scalar(self) -> int:
    # triton <= 3.6 does int(ndarray) here, which numpy >= 2.4 refuses for the shape-(1,)
    # arrays that hold scalar kernel arguments (`range(0, rnumel, RBLOCK)`); 3.9 squeezes.
    return int(self.handle.data.squeeze())


class _LangPatch:
    """The scope of one patch of language modules; scopes nest (a launch, then the @jit
    calls inside it), and while open `_InterpState.patched_langs` holds every module
    that an open scope covers."""

    def __init__(self, scope, langs: frozenset) -> None:
        self._scope = scope
        self._outer_langs = _InterpState.patched_langs
        _InterpState.patched_langs = self._outer_langs | langs

    def set_attr(self, obj, name, value) -> None:
        self._scope.set_attr(obj, name, value)

    def restore(self) -> None:
        _InterpState.patched_langs = self._outer_langs
        self._scope.restore()


class _AlreadyPatched:
    """The scope of a patch asked for inside an open one that covers it: nothing to undo."""

    def set_attr(self, obj, name, value) -> None:
        raise RuntimeError("a nested language patch scope cannot patch")

    def restore(self) -> None:
        pass


def _patch_lang_compat(fn):
    """interpreter._patch_lang plus the scalar __index__ fix; returns the restorable scope.

    The interpreter patches the language modules visible from `fn` (triton.language and
    its core: process-wide objects) at every kernel launch and at every call of one
    @jit function from another, which walks those modules member by member. A call made
    inside a launch whose patch already covers the modules `fn` sees is left as it is:
    a reduction with a custom combine function calls it once per element pair, and
    repatching made those calls about 3x slower.
    """
    import triton.language as tl
    langs = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
    if langs and langs <= _InterpState.patched_langs:
        return _AlreadyPatched()
    scope = _LangPatch(_InterpState.patch_lang(fn), langs)
    scope.set_attr(tl.core.tensor, "__index__", _index_of_scalar)
    return scope


@functools.lru_cache(maxsize=None)
def _interpreted_forms() -> dict:
    """Helpers whose compiled form is slow under the interpreter -> the form it runs
    instead (same results: triton_helpers.py says why each exists)."""
    from . import triton_helpers
    return {triton_helpers.max2.fn: triton_helpers.max2_interpreted,
            triton_helpers.min2.fn: triton_helpers.min2_interpreted}


def _interpreted_device_call(jit_fn, *args, **kwargs):
    """JITFunction.__call__ while a kernel is interpreted: run the callee interpreted too.

    Triton's own library (tl.sum, tl.max, tl.sigmoid, ...) is made of @jit functions that
    are JITFunctions unless TRITON_INTERPRET was set when triton was imported.
    """
    from triton.runtime.interpreter import InterpretedFunction
    jit_fn = _interpreted_forms().get(jit_fn.fn, jit_fn)
    interp = _InterpState.device_fns.get(jit_fn.fn)
    if interp is None:
        interp = _InterpState.device_fns[jit_fn.fn] = InterpretedFunction(jit_fn.fn)
    scope = _patch_lang_compat(jit_fn.fn)
    try:
        return interp.rewrite()(*args, **kwargs)
    finally:
        scope.restore()


@contextlib.contextmanager
def _jit_calls_interpreted():
    """While active, calls between @jit functions run through the interpreter.

    Patches (and restores on exit) JITFunction.__call__ and the interpreter's language
    patching; nothing process-wide such as TRITON_INTERPRET is touched.
    """
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction
    with _InterpState.lock:
        if _InterpState.depth == 0:
            _InterpState.saved_call = JITFunction.__call__
            _InterpState.patch_lang = interpreter._patch_lang
            JITFunction.__call__ = _interpreted_device_call
            interpreter._patch_lang = _patch_lang_compat
            _InterpState.patched_langs = frozenset()
        _InterpState.depth += 1
        try:
            yield
        finally:
            _InterpState.depth -= 1
            if _InterpState.depth == 0:
                JITFunction.__call__ = _InterpState.saved_call
                interpreter._patch_lang = _InterpState.patch_lang


def _is_interpreted(fn) -> bool:
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False
    return isinstance(fn, InterpretedFunction)


def _to_interpreted(fn):
    from triton.runtime.interpreter import InterpretedFunction
    return fn if _is_interpreted(fn) else InterpretedFunction(fn.fn)


# --- the launcher ------------------------------------------------------------------------

class TritonLauncher:
    """Launches one generated Triton kernel; see the module docstring for the contract.

    name: the @triton.jit function in `source`; kind: "pointwise" | "pointwise_2d" |
    "reduction" | "persistent_reduction" | "template"; numels: {"x"}, {"y", "x"}, {"x", "r"}
    or {"b", "m", "n"} (ints);
    mutated_arg_indices: run() argument positions the kernel writes; device_type: "cuda"
    (compiled) or "cpu" (Triton interpreter); configs: explicit candidates, else
    heuristics for the `tritonfuse.config.autotune` mode at the first run; reduction_hint:
    optional "inner"/"outer" passed to the heuristics. pointer_dtypes and device_index
    (generated code gives them with configs): the dtypes of the tensor arguments and the
    CUDA device; with them every candidate starts compiling in the background
    (runtime/async_compile.py) when the launcher is made, for aligned tensors.
    After the first run, `chosen_config` holds the config in use.
    """

    # Launch compiled kernels through the CompiledKernel directly (binaries from the
    # compile pool); False: through JITFunction dispatch, which compiles at launch.
    fast_launch = True

    def __init__(self, name: str, source: str, kind: str, numels: dict[str, int] | None,
                 mutated_arg_indices: Sequence[int] = (), device_type: str = "cuda",
                 configs: Sequence[Config] | None = None, *, reduction_hint: str | None = None,
                 pointer_dtypes: Sequence[Any] | None = None, device_index: int | None = None,
                 example_scalars: Sequence[Any] | None = None):
        if numels is None:   # symbolic sizes: one launcher per size bucket (DynamicTritonLauncher)
            raise TypeError("TritonLauncher needs static numels; use DynamicTritonLauncher")
        self.name = name
        self.source = source
        self.kind = kind
        self.numels = {k: int(v) for k, v in numels.items()}
        self.mutated_arg_indices = list(mutated_arg_indices)
        self.device_type = device_type
        self.reduction_hint = reduction_hint
        self._explicit_configs = list(configs) if configs is not None else None
        self._candidates: list[Config] | None = None
        self.chosen_config: Config | None = None
        self.timings_ms: dict[str, float] | None = None
        self._fn = None              # JITFunction, or InterpretedFunction for the interpreter
        self._interpreted = False
        # (ArgSpec, device index, {Config: Future of a CompiledKernel}) from the pool
        self._binaries: tuple | None = None
        self.precompiled = False     # whether every binary compiled ahead existed already
        if (device_type == "cuda" and self.fast_launch and configs is not None
                and pointer_dtypes is not None and device_index is not None):
            scalars = example_scalars if example_scalars is not None else \
                [self.numels[axis] for axis in NUMEL_ARGS[kind]]
            argspec = async_compile.ArgSpec.aligned(pointer_dtypes, scalars)
            futures, self.precompiled = async_compile.precompile(name, source, self._configs_to_precompile(device_index),
                                                                 argspec, device_index)
            self._binaries = (argspec, device_index, futures)

    def _configs_to_precompile(self, device_index: int) -> list[Config]:
        """The candidates to compile ahead: only the tuning result where one is known for
        this kernel, its sizes and the GPU (a warm start then loads one binary per kernel,
        not every candidate's; a candidate needed after all is compiled at its launch)."""
        candidates = self._explicit_configs
        if self._may_take_a_tuning_result(candidates):
            import torch
            known = self._known_config(candidates, torch.cuda.get_device_name(device_index))
            if known is not None:
                return [known[0]]
        return candidates

    def __repr__(self) -> str:
        return (f"TritonLauncher({self.name}, {self.kind}, {self.numels}, "
                f"device={self.device_type}, config={self.chosen_config})")

    def tuning_sizes(self) -> tuple:
        """The sizes a tuning result of this launcher is kept for (heuristics.size_key)."""
        return size_key(self.kind, self.numels)

    @property
    def candidates(self) -> list[Config]:
        """The candidate configs (fixed at the first run; before it, as it would pick now)."""
        if self._candidates is not None:
            return self._candidates
        if self._explicit_configs is not None:
            return list(self._explicit_configs)
        return candidate_configs(self.kind, self.numels, tf_config.autotune,
                                 hint=self.reduction_hint)

    # -- grid and launches -----------------------------------------------------------------

    def grid(self, cfg: Config, numels: dict[str, int] | None = None) -> tuple[int, int, int]:
        """(cdiv(x, XBLOCK), cdiv(y, YBLOCK) or 1, 1): x always on axis 0 (no 65535 limit).
        A GEMM template ("template", numels {"b", "m", "n"}): one program per output tile
        on axis 0, the batch on axis 1. ``numels``: this launch's sizes, when they are not
        the launcher's."""
        numels = self.numels if numels is None else numels
        if self.kind == "template":
            tiles = triton.cdiv(numels["m"], cfg.kwargs["BLOCK_M"]) * triton.cdiv(numels["n"], cfg.kwargs["BLOCK_N"])
            return (tiles, numels["b"], 1)
        x_programs = triton.cdiv(numels["x"], cfg.kwargs.get("XBLOCK", 1))
        y_programs = triton.cdiv(numels["y"], cfg.kwargs["YBLOCK"]) if "y" in numels else 1
        if y_programs > MAX_GRID_YZ:
            raise ValueError(f"{self.name}: {y_programs} programs on grid axis 1 exceed "
                             f"{MAX_GRID_YZ}; use a larger YBLOCK than in {cfg}")
        return (x_programs, y_programs, 1)

    def _bind(self, cfg: Config, numels: dict[str, int] | None = None) -> Callable[..., Any]:
        """A callable taking run()'s args that launches with `cfg` through JITFunction
        dispatch (the general path: it specializes on, and compiles for, what it gets).
        ``numels``: the launch's sizes, when they are not the launcher's."""
        bound = self._fn[self.grid(cfg, numels)]
        kwargs = dict(cfg.kwargs)
        if self._interpreted:
            def launch_interpreted(*args):
                with _jit_calls_interpreted():
                    return bound(*args, **kwargs)
            return launch_interpreted
        kwargs.update(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return lambda *args: bound(*args, **kwargs)

    def _compiled_binaries(self, args: Sequence[Any]) -> None:
        """Make `self._binaries` hold binaries valid for `args` on the current device: the
        ones compiling since the launcher was made if `args` are what they expected, else
        every candidate submitted now (compiling in parallel) for exactly these `args`."""
        from triton.runtime.driver import driver
        device = driver.active.get_current_device()
        if self._binaries is not None:
            argspec, device_index, _ = self._binaries
            if device_index == device and argspec.matches(args):
                return
        self._binaries = (async_compile.ArgSpec.of_args(args), device, {})
        self._submit(self._candidates)

    def _submit(self, configs: Sequence[Config]) -> None:
        argspec, device, futures = self._binaries
        kernel = async_compile.KernelSource(self.name, self.source)
        submitted, _ = async_compile.submit(kernel, configs, argspec, async_compile.cuda_target(device), device)
        futures.update(submitted)

    def _direct(self, cfg: Config) -> Callable[..., Any]:
        """A launch of `cfg`'s binary from the pool through its CompiledKernel (waits for
        the compile; raises its error); other arguments take the general path."""
        argspec, _, futures = self._binaries
        if cfg not in futures:           # a config tuned elsewhere (a full search)
            self._submit([cfg])
        slow = self._bind(cfg)
        try:
            kernel = futures[cfg].result()
        except async_compile.CompileInterrupted:
            return slow
        return make_direct_launch(self._fn, kernel, argspec, cfg, slow, self.grid(cfg)) or slow

    # -- first run ----------------------------------------------------------------------

    def run(self, *args: Any) -> None:
        """Launch the kernel on `args` (tensors, then numels as ints, as in its signature)."""
        with first_runs:
            launch = self.__dict__.get("run")   # another thread's first run may have bound it
            if launch is None:
                self._first_run(args)
                return None
        return launch(*args)

    def _load(self) -> None:
        fn = load_kernel(self.name, self.source, tf_config.cache_dir)
        self._interpreted = self.device_type == "cpu" or _is_interpreted(fn)
        self._fn = _to_interpreted(fn) if self._interpreted else fn

    def _first_run(self, args: Sequence[Any]) -> None:
        started = time.perf_counter()
        try:
            self._first_launch(args)
        finally:
            metrics.add_seconds("first_run", time.perf_counter() - started)

    def _first_launch(self, args: Sequence[Any]) -> None:
        self._load()
        self._candidates = self.candidates
        if not self._candidates:
            raise ValueError(f"{self.name}: no candidate launch configs")
        if self._interpreted or not self.fast_launch:
            bind = self._bind
        else:
            self._compiled_binaries(args)
            bind = self._direct
        self.chosen_config = self._pick_config(args, bind)
        launch = bind(self.chosen_config)
        launch(*args)
        # Later calls find this instance attribute before the class's run().
        self.run = launch

    def _device_name(self, args: Sequence[Any]) -> str:
        if self.device_type == "cpu":
            return "cpu (triton interpreter)"
        import torch
        index = next((a.device.index for a in args if isinstance(a, torch.Tensor) and a.is_cuda),
                     None)
        name = torch.cuda.get_device_name(index)
        return f"{name} (triton interpreter)" if self._interpreted else name

    def _pick_config(self, args: Sequence[Any], bind: Callable[[Config], Callable[..., Any]]) -> Config:
        """The config to run: the only candidate, or a tuning result (this process's, the
        autotune cache's, or benchmarked now with `bind(config)(*args)` launches). In
        "default" mode a result of the full search ("max", as scripts/warmup_autotune.py
        runs it) for the same kernel and sizes is taken first."""
        candidates = self._candidates
        if not self._may_take_a_tuning_result(candidates):
            return candidates[0]
        if self._interpreted and not tf_config.autotune_under_interpreter:
            return candidates[0]
        import autotune_cache
        device = self._device_name(args)
        known = self._known_config(candidates, device)
        if known is not None:
            autotuner.stats.cache_hits += 1
            self.timings_ms = known[1]
            log.debug("autotune %s: known result %s", self.name, known[0])
            return known[0]
        if len(candidates) == 1:
            return candidates[0]
        versions = autotune_cache.current_versions()
        sizes = self.tuning_sizes()
        tuned_as = self._tuning_source()
        key = autotune_cache.make_key(tuned_as, [c.to_dict() for c in candidates], device, versions)
        cache = autotune_cache.AutotuneCache()
        bound: dict[Config, Callable[..., Any]] = {}

        def launch(c: Config) -> None:   # bound once per config: timings exclude binding
            if c not in bound:
                bound[c] = bind(c)
            bound[c](*args)

        cfg, timings = autotuner.select_best(candidates, launch, list(args), self.mutated_arg_indices,
                                             name=self.name, mode=tf_config.autotune)
        self.timings_ms = timings
        autotuner.remember(key, cfg, timings)
        entry = {
            "kernel_name": self.name,
            "config": cfg.to_dict(),
            "device": device,
            "versions": versions,
            "timings_ms": timings,
            "source_sha256": autotune_cache.source_hash(tuned_as),
            "candidates": [c.to_dict() for c in candidates],
            "kind": self.kind,
            "numels": self.numels,
            "sizes": list(sizes),
        }
        try:
            cache.put(key, entry)
        except OSError as e:
            log.warning("autotune %s: could not write the autotune cache: %s", self.name, e)
        return cfg

    def _may_take_a_tuning_result(self, candidates: Sequence[Config]) -> bool:
        """Whether the config may come from tuning: several candidates, or (in "default"
        mode, which tunes some kinds of kernel not at all) a result of the full search."""
        if tf_config.autotune == "none":
            return False
        return len(candidates) > 1 or (tf_config.autotune == "default" and self.kind in KINDS)

    def _tuning_source(self) -> str:
        """What this kernel's tuning results are keyed by: its source with the name
        blanked, and its sizes (autotuner.tuning_source)."""
        return autotuner.tuning_source(async_compile.kernel_template(self.source, self.name), self.tuning_sizes())

    def _known_config(self, candidates: Sequence[Config], device: str) -> tuple[Config, dict] | None:
        """(config, timings) of a tuning result among `candidates` for this kernel, its
        sizes and GPU `device`: this process's, else the autotune cache's; None if there
        is none. In "default" mode a result of the full search ("max", as
        scripts/warmup_autotune.py runs it) is taken first."""
        import autotune_cache
        versions = autotune_cache.current_versions()
        tuned_as = self._tuning_source()
        searches = [candidates]
        if tf_config.autotune == "default":
            searches.insert(0, candidate_configs(self.kind, self.numels, "max", hint=self.reduction_hint))
        cache = None
        for allowed in searches:
            key = autotune_cache.make_key(tuned_as, [c.to_dict() for c in allowed], device, versions)
            known = autotuner.recall(key)
            if known is None:
                cache = cache or autotune_cache.AutotuneCache()
                entry = cache.get(key)
                known = (Config.from_dict(entry["config"]), entry["timings_ms"]) if entry else None
            if known is not None and known[0] in allowed:
                autotuner.remember(key, *known)
                return known
        return None
