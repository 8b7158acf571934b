"""Worker processes of the compile pool: each compiles Triton kernels into Triton's on-disk
cache, where the compiling process then finds every binary (async_compile.py).

A compile holds the GIL for about 30% of its time (the Python front end turning the
kernel into IR, and glue between MLIR, LLVM and ptxas), so threads alone stop scaling
at 3-4 busy cores; a process per core scales with the machine.

    worker = WorkerProcess()           # starts `python compile_workers.py` (not -m: no
                                       # tritonfuse/__init__, no Dynamo in the worker)
    if worker.ready():                 # False while it still imports Triton
        worker.compile(name, source, kernel_dir, compile_request(fn, config, argspec, target), target)

A worker imports Triton and the kernel modules, not torch: it is ready in a fraction of a
second (with torch, ~2 s of CPU per worker, on every core at once while the compiling
process still lowers its graph). Requests are plain data for the same reason.

Messages are pickled frames (4-byte length, then the pickle) on the worker's stdin and on
a copy of its stdout; its own stdout goes to stderr, so stray prints cannot corrupt them.
The worker exits when its stdin closes. Workers are started with subprocess, not
multiprocessing, which would import the user's __main__ module in every worker.
"""
from __future__ import annotations

import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from typing import Any

log = logging.getLogger("tritonfuse.compile")

_READY = "ready"


class WorkerLost(RuntimeError):
    """The worker process exited or its pipe broke."""


def _write_frame(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


_MAX_FRAME = 1 << 24   # anything longer is not one of our messages


def _read_frame(stream) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        raise EOFError
    (size,) = struct.unpack("<I", header)
    if size > _MAX_FRAME:
        raise ValueError(f"not a compile worker message ({size} bytes announced)")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class WorkerProcess:
    """One worker process, used by one thread at a time."""

    def __init__(self) -> None:
        self._ready = False
        self._lost = False
        self._lock = threading.Lock()
        # A new interpreter (fork + exec: safe with CUDA initialised here) that sees no GPU:
        # compiles for a given target need none, and a CUDA context per worker would cost
        # each hundreds of MB of GPU memory.
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES=""), close_fds=True)

    def ready(self) -> bool:
        """True once the worker has imported what it needs (never blocks)."""
        if self._ready or self._lost:
            return self._ready and not self._lost
        with self._lock:
            try:
                readable, _, _ = select.select([self.process.stdout], [], [], 0)
                if readable and not self._ready:
                    self._ready = _read_frame(self.process.stdout) == _READY
            except (OSError, EOFError, ValueError, pickle.UnpicklingError):
                self._lose("it did not start")
        return self._ready and not self._lost

    def compile(self, name: str, source: str, kernel_dir: str, request: tuple, target) -> str | None:
        """Compile kernel `name` of `source` as `request` (async_compile.compile_request)
        says, into Triton's cache; None on success, else the error's text.
        Raises WorkerLost if the process died (the caller compiles itself then)."""
        from triton import knobs
        message = (name, source, kernel_dir, knobs.cache.dir, request, target)
        with self._lock:
            try:
                _write_frame(self.process.stdin, message)
                return _read_frame(self.process.stdout)
            except (OSError, EOFError, ValueError, pickle.UnpicklingError) as error:
                self._lose(f"{type(error).__name__}: {error}")
                raise WorkerLost(f"compile worker {self.process.pid} exited") from error

    def _lose(self, why: str) -> None:
        if not self._lost:
            log.warning("tritonfuse: compile worker %s lost (%s); compiling in-process instead",
                        self.process.pid, why)
        self._lost = True

    def close(self) -> None:
        """Let the worker exit (it finishes the compile in hand first)."""
        try:
            self.process.stdin.close()
        except OSError:
            pass


# --- the worker's side -----------------------------------------------------------------------

def _import_without_package_init() -> None:
    """Make `tritonfuse` and `tritonfuse.runtime` importable as bare packages: their
    modules load, their __init__ (torch.compile registration, Dynamo) does not run."""
    import types
    runtime = os.path.dirname(os.path.abspath(__file__))
    for name, path in (("tritonfuse", os.path.dirname(runtime)), ("tritonfuse.runtime", runtime)):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    sys.path[0] = os.path.dirname(os.path.dirname(runtime))   # not this folder: the script's own


def _compiler():
    """What a worker compiles with: (compile_requested, load_kernel), imported without torch
    (only Triton), so that a worker is ready in a fraction of a second."""
    _import_without_package_init()
    from tritonfuse.runtime.async_compile import compile_requested
    from tritonfuse.runtime.kernel_modules import load_kernel
    return compile_requested, load_kernel


def _serve() -> None:
    import warnings
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # print() in the worker goes to stderr
    warnings.simplefilter("ignore")    # the compiling process shows Triton's warnings once
    requests = sys.stdin.buffer
    compile_requested, load_kernel = _compiler()
    _write_frame(replies, _READY)
    while True:
        try:
            name, source, kernel_dir, triton_cache, request, target = _read_frame(requests)
        except EOFError:
            return
        os.environ["TRITON_CACHE_DIR"] = triton_cache
        try:
            compile_requested(load_kernel(name, source, kernel_dir), request, target)
            reply = None
        except Exception as error:  # noqa: BLE001 - reported to the parent, which recompiles
            reply = f"{type(error).__name__}: {error}"
        _write_frame(replies, reply)


if __name__ == "__main__":
    try:
        _serve()
    except (BrokenPipeError, KeyboardInterrupt):   # the compiling process exited first
        os._exit(0)                                  # no flush of the closed pipe at exit
