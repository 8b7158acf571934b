"""Helpers for tests and for people debugging generated code."""
from . import compile_fx


def run_and_get_code(fn, *args, **kwargs):
    """Run ``fn`` (typically a torch.compile'd function) and return ``(result, sources)``:
    the generated wrapper and kernel sources of every graph compiled during the call."""
    with compile_fx.capture_sources() as captured:
        result = fn(*args, **kwargs)
    return result, [source for group in captured for source in group]
