"""One lock for all compile work in the process, shared with Dynamo.

Compiles share process-wide state that is not thread-safe: torch's FX-tracing flag
(``torch.fx._symbolic_trace._is_fx_tracing_flag``, set by every make_fx trace that
aot_autograd runs), torch's "a compile is in progress" flag, the graph being lowered and
tritonfuse's metrics. Dynamo serializes its own compiles with
``torch._dynamo.convert_frame.compile_lock`` (a reentrant lock). Work that tritonfuse does
at call time instead, like the per-shape compiles of ``ShapeSpecializer``, runs outside
Dynamo; ``compiling()`` takes the same lock, so it never overlaps a Dynamo compile or
another call-time compile, and holds torch's compile-session flag while it runs, as Dynamo
does. That flag is what tells a thread calling an already-compiled function "this FX
trace is a compiler's, not yours": without it, any thread calling a ``torch.compile``'d
function while a make_fx trace runs elsewhere raises "Detected that you are using FX to
symbolically trace a dynamo-optimized function". Both flags are put back on the way out,
also when the compile raises.

Launch-time work that is not a graph compile (Triton compiles and autotuning at a
kernel's first run, C++ builds, cache loads) keeps its own finer locks and never takes
this one, so no thread holding a kernel's lock waits for a compile (no lock cycles).
"""
import contextlib
import threading

import torch


def _shared_lock():
    try:
        from torch._dynamo.convert_frame import compile_lock
    except ImportError:     # Dynamo moved it: our own lock still serializes tritonfuse's compiles
        return threading.RLock()
    return compile_lock


_lock = _shared_lock()


def _compile_session():
    """torch's "a compile is in progress" context (torch >= 2.13), or its flag (older)."""
    compiler = torch.compiler
    session = getattr(compiler, "_compile_session_context", None)
    if session is not None:
        return session()
    if hasattr(compiler, "_is_compiling_flag"):
        return _set_compiling_flag(compiler)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _set_compiling_flag(compiler):
    saved = compiler._is_compiling_flag
    compiler._is_compiling_flag = True
    try:
        yield
    finally:
        compiler._is_compiling_flag = saved


@contextlib.contextmanager
def compiling():
    """Hold the process-wide compile lock (reentrant) for compile work started at call time."""
    from torch.fx import _symbolic_trace
    with _lock:
        fx_tracing = _symbolic_trace._is_fx_tracing_flag
        try:
            with _compile_session():
                yield
        finally:
            _symbolic_trace._is_fx_tracing_flag = fx_tracing
