"""Helpers for tests and for people debugging generated code."""
from . import compile_fx


def run_and_get_code(fn, *args, **kwargs):
    """Run ``fn`` (typically a torch.compile'd function) and return ``(result, sources)``:
    the generated wrapper and kernel sources of every graph compiled during the call."""
    start = len(compile_fx.recent_sources)
    result = fn(*args, **kwargs)
    sources = [s for group in compile_fx.recent_sources[start:] for s in group]
    return result, sources
