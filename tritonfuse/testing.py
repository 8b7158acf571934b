"""Helpers for tests and for people debugging generated code."""
from . import compile_fx


def run_and_get_code(fn, *args, **kwargs):
    """Run ``fn`` (typically a torch.compile'd function) and return ``(result, sources)``:
    the generated wrapper and kernel sources of every graph compiled during the call."""
    with compile_fx.capture_sources() as captured:
        result = fn(*args, **kwargs)
    return result, [source for group in captured for source in group]


def peak_memory(fn, *args, **kwargs):
    """``(result, bytes)``: ``fn(*args, **kwargs)`` and the most CUDA memory it held at
    once beyond what was allocated when it started (``torch.cuda.max_memory_allocated``)."""
    import torch
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn(*args, **kwargs)
    torch.cuda.synchronize()
    return result, torch.cuda.max_memory_allocated() - before
