"""Generated Triton kernel sources, imported as modules: `load_kernel(name, source)`.

Imports neither torch nor the launcher, so that the compile pool's worker processes
(compile_workers.py), which need only this and the compiler, start in a fraction of a
second: importing torch there cost each worker ~2 s of CPU at every pool start, on
every core at once, while the compiling process still lowered its graph.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from typing import Any

from .. import cache_store
from .. import config as tf_config

_modules_lock = threading.Lock()
_loaded_kernels: dict[tuple[str, str], Any] = {}   # (source sha, name) -> JIT function


def _new_lock_after_fork() -> None:
    """A forked child has only the thread that forked: a lock that a compile pool thread
    held while loading a kernel would stay held there for ever."""
    global _modules_lock
    _modules_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def load_kernel(name: str, source: str, cache_dir: str | None = None):
    """The @triton.jit function `name` defined in `source` (a full module as text).

    The source is written to <cache_dir>/kernels/<sha-prefix>/<name>.py, because
    triton.jit reads a function's source through inspect, and imported once per process.
    The file is checked against `source` and rewritten when it differs (cache_store.ensure),
    so a damaged kernel file never reaches the importer.
    """
    sha = hashlib.sha256(source.encode("utf-8")).hexdigest()
    root = cache_dir if cache_dir is not None else tf_config.cache_dir
    path = os.path.join(root, "kernels", sha[:16], f"{name}.py")
    with _modules_lock:
        fn = _loaded_kernels.get((sha, name))
        if fn is not None:
            # Same kernel already imported: keep its file (read by the interpreter and
            # tracebacks) holding its source where the module says it is.
            cache_store.ensure(fn.fn.__code__.co_filename, source)
            return fn
        path = cache_store.ensure(path, source)
        module_name = f"tritonfuse_kernel_{sha[:16]}_{name}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        if not hasattr(module, name):
            raise AttributeError(f"kernel source {path} defines no function {name!r}")
        fn = _loaded_kernels[(sha, name)] = getattr(module, name)
        return fn
