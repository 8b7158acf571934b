"""Compile generated Triton kernels in a worker pool, once per unique kernel.

    binaries, _ = async_compile.submit(kernel, configs, argspec, target)  # {Config: Future}
    ...lowering and code generation of the rest of the graph go on...
    compiled = binaries[config].result()       # the launcher, at the kernel's first launch

Code generation hands each kernel over as soon as it is rendered (`precompile`); every
candidate config of it compiles concurrently with the others and with the rest of the
compile, and a launcher waits only for the binaries it needs at its first launch.
Triton's on-disk cache (TRITON_CACHE_DIR) keeps every binary for later processes.

The pool is threads, or threads that each hand their compiles to a worker process
(compile_workers.py). A compile holds the GIL about 30% of its time (measured with
py-spy on sm_90 compiles of GPT-2's kernels: the Python front end and the glue between
MLIR passes, LLVM and ptxas, which themselves run without it), so threads alone stop
scaling at 3-4 busy cores; "auto" takes processes from PROCESSES_MIN_CPUS cores on, started
at the first compile that misses Triton's cache (a warm start only loads binaries).
scripts/compile_bench.py times serial, threads and processes on a model's kernels.

One compile per unique kernel: the key is the kernel's source with its name blanked
(`source_key`), the launch config, the argument specialization, the target and the
device, so the same kernel in every transformer layer, or in the forward and the
backward graph, is compiled once per process whatever each copy is named.

The argument specialization is Triton's own (the function its JIT applies at a launch),
computed from stand-ins that `ArgSpec` describes: each pointer's dtype and whether it is
16-byte aligned, each integer's class (1, or its type and whether 16 divides it: one
binary serves every size of a class). A launch may use the binary only for arguments
that `ArgSpec.matches`; the launchers check that at every call.

Compiles in threads of one process parse kernels with Python's `ast` module, whose
C-level recursion counter CPython (3.11, 3.12) shares between threads: two parses at once
can fail with "SystemError: AST constructor recursion depth mismatch". Triton parses
through `JITFunction.parse` only, so the pool makes that take a process-wide lock
(`_serialize_kernel_parsing`); parsing is a small part of a compile.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import queue
import sys
import threading
from typing import Any, Callable, Sequence

from .. import config as tf_config
from .. import metrics
from .heuristics import Config

log = logging.getLogger("tritonfuse.compile")

# What a kernel's name becomes in `kernel_template`.
_NAME_BLANK = "KERNEL_NAME"


def kernel_template(source: str, name: str) -> str:
    """`source` with its kernel's name `name` blanked: equal for identical kernels."""
    return source.replace(name, _NAME_BLANK)


def source_key(source: str, name: str) -> str:
    """sha256 of `kernel_template(source, name)`: the kernel's identity."""
    return hashlib.sha256(kernel_template(source, name).encode("utf-8")).hexdigest()


# --- what a binary assumes about run()'s arguments -------------------------------------

@dataclasses.dataclass(frozen=True)
class Pointer:
    """A tensor argument as a binary sees it: its dtype, and whether the binary assumes
    its address is a multiple of 16 bytes."""
    dtype: Any
    aligned: bool

    def data_ptr(self) -> int:   # stands in for the tensor in Triton's specialization
        return 0 if self.aligned else 8


_I32, _I64 = 1 << 31, 1 << 63


def scalar_class(value: Any) -> Any:
    """A representative of the values that Triton's JIT specializes like `value` (one
    binary serves them all): 1 (a constant), else by type (i32, i64, u64) and whether
    divisible by 16; any float. The same on triton 3.6 and 3.9."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float):
        return 0.5
    if value == 1:
        return 1
    odd = 1 if value % 16 else 0
    if -_I32 <= value < _I32:
        return 16 + odd
    if -_I64 <= value < _I64:
        return (1 << 32) + odd
    return _I64 + odd


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """run()'s arguments as a compiled binary sees them, in order: a `Pointer` for each
    tensor, the `scalar_class` of each number."""

    args: tuple

    @classmethod
    def aligned(cls, dtypes: Sequence[Any], scalars: Sequence[Any]) -> "ArgSpec":
        """What generated code passes: tensors of `dtypes` (aligned), then `scalars`
        (sizes, numels)."""
        return cls(tuple(Pointer(dtype, True) for dtype in dtypes) + tuple(scalar_class(s) for s in scalars))

    @classmethod
    def of_args(cls, args: Sequence[Any]) -> "ArgSpec":
        """The spec of actual run() arguments."""
        return cls(tuple(Pointer(a.dtype, a.data_ptr() % 16 == 0) if hasattr(a, "data_ptr") else scalar_class(a)
                         for a in args))

    def pointers(self) -> list[tuple[int, Any, bool]]:
        """(position, dtype, aligned) of each tensor argument."""
        return [(i, a.dtype, a.aligned) for i, a in enumerate(self.args) if isinstance(a, Pointer)]

    def scalars(self) -> list[tuple[int, Any]]:
        """(position, class) of each other argument."""
        return [(i, a) for i, a in enumerate(self.args) if not isinstance(a, Pointer)]

    def matches(self, args: Sequence[Any]) -> bool:
        """True if a binary built for this spec is valid for `args`."""
        if len(args) != len(self.args):
            return False
        for arg, spec in zip(args, self.args):
            if isinstance(spec, Pointer):
                if getattr(arg, "dtype", None) is not spec.dtype or (spec.aligned and arg.data_ptr() % 16):
                    return False
            elif hasattr(arg, "data_ptr") or scalar_class(arg) != spec:
                return False
        return True


@functools.lru_cache(None)
def cuda_target(device_index: int):
    """The GPUTarget Triton's driver reports for CUDA device `device_index`."""
    import torch
    from triton.backends.compiler import GPUTarget
    major, minor = torch.cuda.get_device_capability(device_index)
    return GPUTarget("cuda", major * 10 + minor, 32)


def compile_request(fn, config: Config, argspec: ArgSpec, target) -> tuple:
    """What triton.compile needs besides `fn` and the target, as plain data (no torch
    objects, so that a worker process can take it without importing torch): the
    signature, constexprs and attributes that Triton's JIT would specialize `fn` to on
    arguments matching `argspec`, and the compile options of `config`."""
    from triton._C.libtriton import native_specialize_impl
    from triton.compiler import make_backend
    backend = make_backend(target)
    plain = iter(argspec.args)
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(i,)] = config.kwargs[param.name]
            continue
        kind, key = native_specialize_impl(backend, next(plain), False, True, True)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = key
        elif isinstance(key, str):
            attrs[(i,)] = backend.parse_attr(key)
    return signature, constexprs, attrs, {"num_warps": config.num_warps, "num_stages": config.num_stages}


def compile_requested(fn, request: tuple, target):
    """triton.compile of the @triton.jit `fn` as `compile_request` describes."""
    import triton
    from triton.compiler import ASTSource
    signature, constexprs, attrs, options = request
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)


def compile_kernel(fn, config: Config, argspec: ArgSpec, target):
    """triton.compile of the @triton.jit `fn` for `config`, specialized as the JIT would
    be on arguments matching `argspec`; returns the CompiledKernel (not yet loaded)."""
    return compile_requested(fn, compile_request(fn, config, argspec, target), target)


_parse_lock = threading.RLock()


def _serialize_kernel_parsing() -> None:
    """Make Triton's `JITFunction.parse` (every kernel and library function it compiles)
    take `_parse_lock`, once per process: see the module docstring."""
    from triton.runtime.jit import JITFunction
    parse = JITFunction.parse
    if getattr(parse, "tritonfuse_serialized", False):
        return

    @functools.wraps(parse)
    def serialized_parse(self):
        with _parse_lock:
            return parse(self)

    serialized_parse.tritonfuse_serialized = True
    JITFunction.parse = serialized_parse


_triton_key_lock = threading.Lock()
_triton_hashed = False

# Signatures whose host launcher a pool thread has built or is building: set when built.
_launchers_built: dict[tuple, threading.Event] = {}
_launchers_lock = threading.Lock()
# How long a pool thread waits for another's build of the same launcher.
LAUNCHER_BUILD_WAIT_S = 60


@functools.lru_cache(None)
def _per_signature_launcher():
    """The CUDA launcher class where this Triton builds a C launcher for each kernel
    signature when a binary is first loaded (3.6: a gcc run of 0.2-0.5 s, kept in Triton's
    cache), else None (3.9 launches every signature through one generic launcher)."""
    try:
        from triton.backends import backends
        module = sys.modules[backends["nvidia"].driver.__module__]
    except (ImportError, KeyError, AttributeError):
        return None
    return getattr(module, "CudaLauncher", None) if hasattr(module, "make_launcher") else None


def build_launcher(compiled) -> None:
    """Build the C launcher of the CompiledKernel `compiled`'s signature now, once per
    signature and process, so that loading the binary at its first launch (in the thread
    that runs the graph) finds it in Triton's cache. Without this, the launchers of a
    transformer's training graphs cost seconds of gcc on that thread, one after another,
    after the pool has compiled every binary. A thread whose signature another one is
    building waits for that build (its binary's first load would otherwise build it too).
    A failure only leaves the build to the load."""
    launcher_cls = _per_signature_launcher()
    src = getattr(compiled, "src", None)
    signature = getattr(src, "signature", None)
    if launcher_cls is None or not isinstance(signature, dict):
        return
    key = tuple(signature.values())
    with _launchers_lock:
        built = _launchers_built.get(key)
        builder = built is None
        if builder:
            built = _launchers_built[key] = threading.Event()
    if not builder:
        built.wait(LAUNCHER_BUILD_WAIT_S)
        return
    try:
        launcher_cls(src, compiled.metadata)
    except Exception as error:  # noqa: BLE001 - an optimisation only
        log.debug("building the launcher of %s ahead failed: %s", getattr(compiled, "name", "?"), error)
    finally:
        built.set()


def _hash_triton_once() -> None:
    """Compute Triton's own version key (`triton.runtime.cache.triton_key`: hashes of its
    compiler sources and of libtriton, hundreds of MB) in one thread: it is memoized but
    not locked, and pool threads starting at once would each hash it, competing with the
    compiling process for the CPU."""
    global _triton_hashed
    if _triton_hashed:
        return
    with _triton_key_lock:
        from triton.runtime import cache
        key = getattr(cache, "triton_key", None)
        if key is not None:
            key()
        _triton_hashed = True


_hash_thread: threading.Thread | None = None


def hash_triton_in_background() -> None:
    """Start `_hash_triton_once` in a daemon thread, once per process. A GPU compile needs
    the key for its first kernel (a hit in Triton's cache too); hashed while aot_autograd
    traces the graph (the large file is hashed without the GIL), it is off the first call's
    path: 0.4 to 0.75 s of a warm start. Errors are left to the compile that needs the key."""
    global _hash_thread
    if _triton_hashed or _hash_thread is not None:
        return

    def hash_quietly():
        with contextlib.suppress(Exception):
            _hash_triton_once()

    _hash_thread = threading.Thread(target=hash_quietly, name="tritonfuse-triton-key", daemon=True)
    _hash_thread.start()


# --- the pool ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: `name` is the @triton.jit function that `source` defines."""
    name: str
    source: str

    @property
    def key(self) -> str:
        return source_key(self.source, self.name)


def default_workers() -> int:
    """How many compile at once: one per CPU core, leaving one for the compiling thread."""
    return max(1, min(32, (os.cpu_count() or 2) - 1))


# From this many CPU cores on, "auto" compiles in worker processes: threads alone stop
# scaling at 3-4 busy cores (a compile holds the GIL ~30% of its time).
PROCESSES_MIN_CPUS = 8

# An in-process compile still running after this long compiles for real (a binary found
# in Triton's cache loads in milliseconds): the pool's worker processes start then.
SLOW_COMPILE_S = 0.5


class CompilePool:
    """Binaries by (source key, config, argspec, target, device), each compiled once.

    workers: how many compile at once (0: each in the thread that submits it, for
    debugging and as the serial baseline); processes: each worker thread hands its
    compiles to a worker process (compile_workers.py) and then loads the binary from
    Triton's cache. Until its process has started (it imports Triton, not torch: a few
    tenths of a second), a worker thread compiles in-process: no compile waits for a start.
    The processes start when an in-process compile has run for SLOW_COMPILE_S, a real
    one: binaries that Triton's cache holds load in milliseconds, and a warm start that
    only loads them needs no process per core.
    kernel_dir: where kernel sources are written (default: tritonfuse.config.cache_dir).
    """

    def __init__(self, workers: int | None = None, processes: bool = False,
                 kernel_dir: Callable[[], str] | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        self.processes = processes and self.workers > 0
        self._kernel_dir = kernel_dir or (lambda: tf_config.cache_dir)
        self._lock = threading.Lock()
        self._jobs: dict[tuple, concurrent.futures.Future] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._worker_processes: list = []
        self._started = False
        self._processes_started = False

    def submit(self, kernel: KernelSource, configs: Sequence[Config], argspec: ArgSpec, target,
               device_index: int | None = None) -> tuple[dict[Config, concurrent.futures.Future], bool]:
        """Futures of `kernel`'s binaries for `configs` and a GPUTarget; True if all existed
        already. device_index: the CUDA device that will load them (a loaded binary
        belongs to one device), None for binaries that are only compiled."""
        key = kernel.key
        futures, new = {}, []
        with self._lock:
            for cfg in configs:
                job_key = (key, cfg, argspec, target, device_index)
                future = self._jobs.get(job_key)
                if future is None:
                    future = self._jobs[job_key] = concurrent.futures.Future()
                    new.append((future, kernel, cfg, argspec, target, device_index is not None))
                futures[cfg] = future
        metrics.add("triton_compilations", len(new))
        if new and self.workers > 0:
            self.start()
        for job in new:
            if self.workers > 0:
                self._queue.put(job)
            else:
                self._run(*job)
        return futures, not new

    def start(self, with_processes: bool = False) -> None:
        """Start the worker threads now, before the first kernel; with_processes: their
        worker processes too (else they start at the first slow compile)."""
        with self._lock:
            if not self._started and self.workers > 0:
                self._started = True
                for i in range(self.workers):
                    threading.Thread(target=self._serve, args=(i,), name=f"tritonfuse-compile-{i}",
                                     daemon=True).start()
        if with_processes:
            self._start_processes()

    def _start_processes(self) -> None:
        """Give each worker thread its worker process (once; none if `processes` is off)."""
        with self._lock:
            if self._processes_started or not self.processes:
                return
            self._processes_started = True
        from .compile_workers import WorkerProcess
        for _ in range(self.workers):
            try:
                self._worker_processes.append(WorkerProcess())
            except OSError as error:   # no interpreter to start: threads only
                log.warning("tritonfuse: cannot start a compile worker process (%s); compiling in threads", error)
                self.processes = False
                return

    def _serve(self, index: int) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            workers = self._worker_processes
            self._run(*job, worker=workers[index] if index < len(workers) else None)

    def _run(self, future, kernel: KernelSource, cfg: Config, argspec: ArgSpec, target, will_launch: bool,
             worker=None) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            _serialize_kernel_parsing()
            _hash_triton_once()
            from .kernel_modules import load_kernel
            kernel_dir = self._kernel_dir()
            fn = load_kernel(kernel.name, kernel.source, kernel_dir)
            in_worker = worker is not None and worker.ready()
            if in_worker:
                from .compile_workers import WorkerLost
                with contextlib.suppress(WorkerLost):
                    worker.compile(kernel.name, kernel.source, kernel_dir, compile_request(fn, cfg, argspec, target),
                                   target)
            # After the worker: a hit in Triton's cache (its error, if any, is raised here).
            # In-process, a compile still running after SLOW_COMPILE_S starts the processes.
            watch = None
            if not in_worker and self.processes and not self._processes_started:
                watch = threading.Timer(SLOW_COMPILE_S, self._start_processes)
                watch.daemon = True
                watch.start()
            try:
                compiled = compile_kernel(fn, cfg, argspec, target)
            finally:
                if watch is not None:
                    watch.cancel()
            if will_launch:
                build_launcher(compiled)
            future.set_result(compiled)
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits
            log.debug("compile of %s for %s failed: %s", kernel.name, cfg, error)
            future.set_exception(error)

    def close(self) -> None:
        """Stop the threads and processes once the queued compiles are done."""
        for _ in range(self.workers if self._started else 0):
            self._queue.put(None)
        for worker in self._worker_processes:
            worker.close()


class CompileInterrupted(RuntimeError):
    """The process forked while this compile ran: the child has no pool threads to finish it."""


_pool: CompilePool | None = None
_pool_lock = threading.Lock()


def pool() -> CompilePool:
    """The process-wide pool, as tritonfuse.config.compile_workers / compile_pool say."""
    global _pool
    workers = default_workers() if tf_config.compile_workers is None else tf_config.compile_workers
    mode = tf_config.compile_pool
    processes = mode == "processes" or (mode == "auto" and (os.cpu_count() or 1) >= PROCESSES_MIN_CPUS)
    with _pool_lock:
        if _pool is None or (_pool.workers, _pool.processes) != (workers, processes and workers > 0):
            if _pool is not None:
                _pool.close()
            _pool = CompilePool(workers, processes)
        return _pool


def _after_fork_in_child() -> None:
    """A forked child starts with no pool: its threads and worker processes stayed with
    the parent. Compiles that were unfinished fail with CompileInterrupted (the launcher
    then compiles through Triton's JIT); finished binaries stay usable. Locks that a pool
    thread may have held at the fork are made anew."""
    global _pool, _pool_lock, _parse_lock, _triton_key_lock, _launchers_lock, _launchers_built
    old, _pool, _pool_lock, _parse_lock = _pool, None, threading.Lock(), threading.RLock()
    _triton_key_lock, _launchers_lock = threading.Lock(), threading.Lock()
    # a launcher that a parent's thread was building will not be finished here
    _launchers_built = {key: built for key, built in _launchers_built.items() if built.is_set()}
    if old is not None:
        for future in list(old._jobs.values()):
            if not future.done():
                future.set_exception(CompileInterrupted("the process forked while this kernel compiled"))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def submit(kernel: KernelSource, configs: Sequence[Config], argspec: ArgSpec, target,
           device_index: int | None = None):
    """`pool().submit(...)`: see CompilePool.submit."""
    return pool().submit(kernel, configs, argspec, target, device_index)


def precompile(name: str, source: str, configs: Sequence[Config], argspec: ArgSpec, device_index: int):
    """Start compiling a generated kernel's `configs` for launches matching `argspec` on
    CUDA device `device_index`: ({Config: Future}, whether all were compiled or compiling)."""
    return submit(KernelSource(name, source), configs, argspec, cuda_target(device_index), device_index)
