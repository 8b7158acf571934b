"""DynamicTritonLauncher: launches a Triton kernel generated for symbolic sizes.

    launcher = DynamicTritonLauncher(name="triton_poi_fused_add_0", source=SOURCE, kind="pointwise",
                                     numels=None, mutated_arg_indices=[1], device_type="cuda")
    launcher.run(in_ptr0, out_ptr0, s0, 128 * s0)   # size symbols, then the numels

The kernel takes its sizes as arguments, so one source serves every size. Launch configs
are chosen per size bucket (each numel's next power of two: the sizes of a bucket are
within 2x of each other); each bucket is a `TritonLauncher` of its own (candidates,
tuning, binaries) sharing the one loaded kernel.

Compiled (CUDA) kernels: binaries come from the compile pool (async_compile.py), keyed by
the source, the config and the arguments' classes, so buckets that choose the same config
share them. After a bucket's first launch, a launch is a dictionary lookup by its numels,
the tensor checks (the size arguments are checked, and the grid computed, once per
distinct set of them), then the binary's own launcher (direct_launch.py): no JIT
dispatch. Sizes of another class (say, not divisible by 16 where the first were) get the
binary for theirs, compiled once, and are launched the same way.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from .. import config as tf_config
from . import async_compile, triton_launcher
from .direct_launch import MAX_REMEMBERED_SIZES, GridFromSizes, make_direct_launch
from .heuristics import NUMEL_ARGS, Config, candidate_configs, is_persistent_reduction_ok, size_bucket
from .triton_launcher import TritonLauncher


class DynamicTritonLauncher:
    """Launches a kernel generated for symbolic sizes: its sizes arrive with each call
    (the trailing numel arguments of ``run``). Arguments as TritonLauncher's, but: numels
    and configs are None (they follow the sizes of each launch); persistent_source: a
    looped reduction's persistent form, run where the rows fit in registers;
    pointer_dtypes, device_index and example_scalars (run()'s trailing integer arguments
    at the sizes the graph was compiled with): the bucket of those sizes starts compiling
    in the background when the launcher is made; max_xblock: the widest XBLOCK the kernel
    allows (its rows, static, are unmasked: every XBLOCK up to it divides them)."""

    def __init__(self, name: str, source: str, kind: str, numels=None, mutated_arg_indices: Sequence[int] = (),
                 device_type: str = "cuda", configs=None, *, reduction_hint: str | None = None,
                 persistent_source: str | None = None, pointer_dtypes: Sequence[Any] | None = None,
                 device_index: int | None = None, example_scalars: Sequence[Any] | None = None,
                 max_xblock: int | None = None):
        self.name = name
        self.max_xblock = max_xblock
        self.source = source
        self.kind = kind
        self.persistent_source = persistent_source
        self.mutated_arg_indices = list(mutated_arg_indices)
        self.device_type = device_type
        self.reduction_hint = reduction_hint
        self.numel_names = NUMEL_ARGS[kind]
        self._n_numels = len(self.numel_names)
        self.by_bucket: dict[tuple, _BucketLauncher] = {}
        # numels seen -> their bucket's launch: a later launch at them is one lookup
        self._launch_by_sizes: dict[tuple, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self.precompiled = False      # whether the example bucket's binaries existed already
        if device_type == "cuda" and None not in (pointer_dtypes, device_index, example_scalars):
            numels = dict(zip(self.numel_names, example_scalars[-self._n_numels:]))
            if 0 not in numels.values():
                example = self._bucket(numels, (pointer_dtypes, device_index, example_scalars))
                self.precompiled = example.precompiled

    def __repr__(self) -> str:
        return f"DynamicTritonLauncher({self.name}, {self.kind}, buckets={list(self.by_bucket)})"

    def run(self, *args: Any) -> None:
        launch = self._launch_by_sizes.get(args[-self._n_numels:])
        if launch is not None:
            return launch(*args)
        return self._run_new_sizes(args)

    def _run_new_sizes(self, args: Sequence[Any]) -> None:
        """A launch at numels not in `_launch_by_sizes`: through their bucket's launcher,
        made (and its config chosen) if new; its launch is remembered for these numels."""
        sizes = tuple(args[-self._n_numels:])
        if 0 in sizes:
            return None
        numels = dict(zip(self.numel_names, sizes))
        launcher = self.by_bucket.get(tuple((n - 1).bit_length() for n in sizes))
        if launcher is None:
            launcher = self._bucket(numels)
        result = launcher.run_sized(numels, args)
        if launcher.sized_launch is not None and len(self._launch_by_sizes) < MAX_REMEMBERED_SIZES:
            self._launch_by_sizes[sizes] = launcher.sized_launch
        return result

    def _bucket(self, numels: dict[str, int], compile_for: tuple | None = None) -> "_BucketLauncher":
        """The launcher of `numels`' bucket, made if new; compile_for: (pointer_dtypes,
        device_index, scalars) of a launch to compile its candidates for now."""
        bucket = tuple((n - 1).bit_length() for n in numels.values())
        with self._lock:
            launcher = self.by_bucket.get(bucket)
            if launcher is None:
                kind, source = self.kind, self.source
                if self.persistent_source is not None and is_persistent_reduction_ok(numels, self.reduction_hint):
                    kind, source = "persistent_reduction", self.persistent_source
                pointer_dtypes, device_index, scalars = compile_for or (None, None, None)
                configs = candidate_configs(kind, numels, tf_config.autotune, hint=self.reduction_hint,
                                            max_xblock=self.max_xblock)
                launcher = _BucketLauncher(self.name, source, kind, numels, self.mutated_arg_indices,
                                           self.device_type, configs, reduction_hint=self.reduction_hint,
                                           pointer_dtypes=pointer_dtypes, device_index=device_index,
                                           example_scalars=scalars)
                self.by_bucket[bucket] = launcher
            return launcher


class _BucketLauncher(TritonLauncher):
    """The launcher of one size bucket: configs chosen for the first sizes seen in it,
    the grid computed at every launch, through `sized_launch` once the first is done."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sized_launch: Callable[..., Any] | None = None
        self._by_spec: dict[tuple, Callable[..., Any]] = {}

    def tuning_sizes(self) -> tuple:
        return size_bucket(self.kind, self.numels)

    def run_sized(self, numels: dict[str, int], args: Sequence[Any]) -> None:
        launch = self.sized_launch
        if launch is None:
            with triton_launcher.first_runs:
                launch = self.sized_launch
                if launch is None:
                    self.numels = {k: int(v) for k, v in numels.items()}   # the first run's grid
                    self._first_run(args)
                    self.sized_launch = self._sized(self.chosen_config)
                    return None
        return launch(*args)

    def _numels_of(self, args: Sequence[Any]) -> dict[str, int]:
        return dict(zip(NUMEL_ARGS[self.kind], args[len(args) - len(NUMEL_ARGS[self.kind]):]))

    def _general(self, cfg: Config) -> Callable[..., Any]:
        """Launches through the JIT's dispatch, at each launch's sizes."""
        return lambda *args: self._bind(cfg, self._numels_of(args))(*args)

    def _grid(self, n_args: int) -> GridFromSizes:
        first = n_args - len(NUMEL_ARGS[self.kind])
        at = {axis: first + i for i, axis in enumerate(NUMEL_ARGS[self.kind])}
        return GridFromSizes(at["x"], at.get("y"))

    def _sized(self, cfg: Config) -> Callable[..., Any]:
        """The launch for every later call of this bucket."""
        general = self._general(cfg)
        if self._interpreted or self._binaries is None:
            return general
        argspec, _, futures = self._binaries
        try:
            kernel = futures[cfg].result()
        except async_compile.CompileInterrupted:
            return general
        return make_direct_launch(self._fn, kernel, argspec, cfg, self._launch_other, self._grid(len(argspec.args))) \
            or general

    def _launch_other(self, *args: Any) -> None:
        """A launch that the first binary does not fit (sizes of another class, a
        misaligned tensor, another device, launch hooks): the binary for its arguments,
        compiled once through the pool, launched directly; under hooks, the general path."""
        from triton.runtime.driver import driver
        cfg = self.chosen_config
        device = driver.active.get_current_device()
        argspec = async_compile.ArgSpec.of_args(args)
        launch = self._by_spec.get((argspec, device))
        if launch is None:
            kernel = async_compile.KernelSource(self.name, self.source)
            futures, _ = async_compile.submit(kernel, [cfg], argspec, async_compile.cuda_target(device), device)
            general = self._general(cfg)
            launch = make_direct_launch(self._fn, futures[cfg].result(), argspec, cfg, general,
                                        self._grid(len(args))) or general
            self._by_spec[(argspec, device)] = launch
        return launch(*args)
