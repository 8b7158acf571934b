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


def allocation_levels(prof, device_type=None):
    """``[(time_ns, bytes)]``: the bytes allocated since a profile began (``torch.autograd.
    profiler.profile(profile_memory=True)``), after each of its memory events on
    ``device_type`` (CPU by default), in time order."""
    import torch
    device_type = torch.autograd.DeviceType.CPU if device_type is None else device_type
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == device_type)
    levels, current = [], 0
    for time, nbytes in events:
        current += nbytes
        levels.append((time, current))
    return levels


def peak_cpu_memory(fn, *args, **kwargs):
    """``(result, bytes)``: ``fn(*args, **kwargs)`` and the most CPU memory it held at once
    beyond what was allocated when it started (from the profiler's memory events: every
    allocation of the CPU allocator, whoever makes it)."""
    from torch.autograd.profiler import profile
    with profile(profile_memory=True, use_kineto=True) as prof:
        result = fn(*args, **kwargs)
    return result, max([0] + [level for _, level in allocation_levels(prof)])
