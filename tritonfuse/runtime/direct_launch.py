"""Launches of compiled Triton kernels that skip the JIT's dispatch.

`JITFunction.run` (what `kernel[grid](*args)` calls) binds the arguments, specializes
each one and looks the binary up at every launch. The launchers know their binary
already (runtime/async_compile.py compiled it for an `ArgSpec`), so a launch only has to
check that its arguments still fit that spec and call the binary's launcher
(`CompiledKernel.run`, the same call on triton 3.6 and 3.9).

    launch = make_direct_launch(jit_fn, compiled, argspec, cfg, slow, grid=(64, 1, 1))
    launch(*args)     # the binary; `slow(*args)` for arguments it does not fit

A fixed `grid` serves kernels of static sizes; `GridFromSizes` computes it from the
numel arguments, for kernels of symbolic sizes. The integer arguments are checked (their
Triton class) and the grid computed once per distinct set of them: a launch with sizes
seen before looks both up (`MAX_REMEMBERED_SIZES` sets per launch).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from .async_compile import ArgSpec, scalar_class
from .heuristics import MAX_GRID_YZ, Config

log = logging.getLogger("tritonfuse.autotune")

# How many sets of size arguments a launch remembers as checked, with their grid.
MAX_REMEMBERED_SIZES = 64
_NO_FIT = ()   # remembered for numbers that the binary does not fit


class GridFromSizes:
    """Where a launch's grid comes from: x programs over run()'s argument at `x_position`
    (XBLOCK each), y programs (YBLOCK each) over the one at `y_position`, if any."""

    def __init__(self, x_position: int, y_position: int | None = None) -> None:
        self.x_position = x_position
        self.y_position = y_position


def make_direct_launch(jit_fn, kernel, argspec: ArgSpec, cfg: Config, slow: Callable[..., Any],
                       grid: tuple[int, int, int] | GridFromSizes) -> Callable[..., Any] | None:
    """A launch that calls the CompiledKernel `kernel`'s launcher directly.

    `kernel` was compiled for `cfg` and arguments matching `argspec` (dtypes, 16-byte
    alignment of tensor pointers, integer classes) and is loaded on the current device.
    Each call checks those cheaply and takes `slow` when anything differs, when launch
    hooks (profilers) are installed, or on another device. Returns None (use `slow`
    always) if this triton does not look as expected.
    """
    try:
        from triton import knobs
        from triton.runtime.driver import driver
        if hasattr(kernel, "result"):          # a future on some versions
            kernel = kernel.result()
        params = jit_fn.params
        constexpr_names = [p.name for p in params if p.is_constexpr]
        n_plain = len(params) - len(constexpr_names)
        # Only the layout the code generator emits: plain args first, then the blocks.
        if any(p.is_constexpr for p in params[:n_plain]) or len(argspec.args) != n_plain:
            return None
        if any(name not in cfg.kwargs for name in constexpr_names):
            return None
        tail = tuple(cfg.kwargs[name] for name in constexpr_names)
        run = kernel.run                       # loads the binary (raises if it cannot run)
        function, packed = kernel.function, kernel.packed_metadata
        get_stream = driver.active.get_current_stream
        get_device = _current_device_reader(driver.active.get_current_device)
        device = get_device()
        runtime_knobs = knobs.runtime
    except (AttributeError, ImportError, TypeError) as e:  # an optimisation only
        log.debug("direct launch unavailable for %s: %s", getattr(jit_fn, "__name__", jit_fn), e)
        return None
    tensors = tuple(argspec.pointers())        # (position, dtype, specialized on alignment)
    scalars = tuple(argspec.scalars())         # (position, class)
    n_tensors = len(tensors)
    # Only the order generated code passes: tensors, then numbers (sizes, numels).
    if any(i != position for position, (i, _, _) in enumerate(tensors)):
        return None
    launch_grid = _grid_of_scalars(scalars, n_tensors, cfg, grid)
    grids: dict[tuple, tuple[int, int]] = {}   # numbers that fit the binary -> their grid

    def fast_launch(*call_args):
        # Launch hooks need the metadata only the general path builds. They are
        # HookChain objects (no-ops while `.calls` is empty) or plain callables.
        enter, exit_ = runtime_knobs.launch_enter_hook, runtime_knobs.launch_exit_hook
        if ((enter is not None and getattr(enter, "calls", True))
                or (exit_ is not None and getattr(exit_, "calls", True))
                or len(call_args) != n_plain or get_device() != device):
            return slow(*call_args)
        for i, dtype, aligned in tensors:
            t = call_args[i]
            if t.dtype is not dtype or (aligned and t.data_ptr() & 15):
                return slow(*call_args)
        numbers = call_args[n_tensors:]
        grid01 = grids.get(numbers)
        if grid01 is None:                     # numbers not seen yet: check and keep them
            grid01 = launch_grid(numbers) or _NO_FIT
            if len(grids) < MAX_REMEMBERED_SIZES:
                grids[numbers] = grid01
        if grid01 is _NO_FIT:
            return slow(*call_args)              # which says why it cannot launch
        run(grid01[0], grid01[1], 1, get_stream(device), function, packed, None, None, None, *call_args, *tail)

    return fast_launch


def _current_device_reader(get_current_device: Callable[[], int]) -> Callable[[], int]:
    """The driver's current-device function, or torch's C function under it where it is
    torch.cuda.current_device (which first checks that CUDA is initialized: a loaded
    binary means it is): one launch asks for the device once."""
    import torch
    if get_current_device is torch.cuda.current_device and hasattr(torch._C, "_cuda_getDevice"):
        return torch._C._cuda_getDevice
    return get_current_device


def _grid_of_scalars(scalars, n_tensors: int, cfg: Config, grid) -> Callable[[tuple], tuple[int, int] | None]:
    """grid_of(numbers): the launch grid's (x, y) for run()'s trailing non-tensor arguments
    `numbers`, or None if they do not fit the binary (another integer class: `scalars` has
    each one's class) or the grid cannot launch."""
    checks = tuple((i - n_tensors, expected) for i, expected in scalars)
    if isinstance(grid, GridFromSizes):
        x_at = grid.x_position - n_tensors
        y_at = None if grid.y_position is None else grid.y_position - n_tensors
        x_block, y_block = cfg.kwargs.get("XBLOCK", 1), cfg.kwargs.get("YBLOCK", 1)
    else:
        fixed = (grid[0], grid[1])

    def grid_of(numbers: tuple) -> tuple[int, int] | None:
        for i, expected in checks:
            value = numbers[i]
            if value != expected and scalar_class(value) != expected:
                return None
        if not isinstance(grid, GridFromSizes):
            return fixed
        grid1 = 1 if y_at is None else -(-numbers[y_at] // y_block)
        if grid1 > MAX_GRID_YZ:
            return None
        return (-(-numbers[x_at] // x_block), grid1)

    return grid_of
