"""Benchmark candidate launch configs and pick the fastest, within a time budget.

`select_best` times every candidate on the real arguments, then puts back the contents of
the tensors the kernel writes, so the call that follows sees exactly what it would have
seen without tuning. Candidates that fail to compile or launch are skipped.

On CUDA the "default" mode races the candidates: rounds of one launch each (L2 flushed
before each, CUDA events around it, queued behind a sleep so the launch's host time is not
timed), interleaved so clock changes hit all alike, until
each has BENCH_SAMPLES timings or BENCH_BUDGET_S has passed; the median wins. "max"
keeps the full search: triton's do_bench per candidate, CUDA_BENCH_ROUNDS times.

Results are remembered for the process (`recall` / `remember`, keyed like the autotune
cache), so identical kernels (the same layer's kernels in every transformer block, the
same kernel in forward and backward) are tuned once.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any, Callable, Sequence

import torch

from .heuristics import Config

log = logging.getLogger("tritonfuse.autotune")

# The "default" budget on CUDA: timings per candidate, and the wall time after which a
# kernel's race stops (once every candidate has BENCH_MIN_SAMPLES).
BENCH_SAMPLES = 15
BENCH_MIN_SAMPLES = 3
BENCH_BUDGET_S = 0.05
# GPU clock cycles (~50 us) that the stream sleeps before each raced launch, covering the
# host's time to record the start event and launch the kernel.
HOST_LAUNCH_COVER_CYCLES = 100_000
# "max": triton.testing.do_bench budgets in ms (both arguments exist in triton 3.6 and 3.9).
BENCH_WARMUP_MS = 5
BENCH_REP_MS = 20
# Rounds over all candidates on CUDA, keeping each one's best: the GPU idles (and its
# clocks drop) while a candidate compiles, which would otherwise penalize whichever
# candidate is measured first after a compile.
CUDA_BENCH_ROUNDS = 2
# perf_counter loop (CPU / interpreter): time budget and bounds on repetitions.
CPU_BENCH_BUDGET_S = 0.02
CPU_BENCH_MAX_REPS = 10

Timer = Callable[[Callable[[], Any]], float]


class AutotuneStats:
    """Process-wide counters, read by scripts/warmup_autotune.py."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.tuned = 0            # kernels benchmarked by select_best
        self.cache_hits = 0       # kernels whose config came from the autotune cache
        self.tuning_seconds = 0.0  # wall time spent in select_best

    def __repr__(self) -> str:
        return (f"AutotuneStats(tuned={self.tuned}, cache_hits={self.cache_hits}, "
                f"tuning_seconds={self.tuning_seconds:.3f})")


stats = AutotuneStats()

_results: dict[str, tuple[Config, dict[str, float]]] = {}   # tuning key -> (config, timings)
_results_lock = threading.Lock()


def tuning_source(kernel_template: str, sizes: tuple) -> str:
    """What a tuning result is keyed by (with the candidates, device and versions): the
    kernel's source with its name blanked, and the sizes it was tuned for
    (heuristics.size_key)."""
    return f"{kernel_template}\n# tuned for sizes {sizes!r}\n"


def recall(key: str) -> tuple[Config, dict[str, float]] | None:
    """(config, timings) tuned earlier in this process under `key`, or None."""
    with _results_lock:
        return _results.get(key)


def remember(key: str, config: Config, timings: dict[str, float]) -> None:
    with _results_lock:
        _results[key] = (config, dict(timings))


def forget_all() -> None:
    """Drop this process's tuning results (tests)."""
    with _results_lock:
        _results.clear()


class AutotuneError(RuntimeError):
    """Every candidate config failed."""


def _cuda_benchmark(fn: Callable[[], Any]) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS,
                                         return_mode="median"))


def _cpu_benchmark(fn: Callable[[], Any]) -> float:
    fn()  # warm-up: compilation, first-touch of memory
    times: list[float] = []
    deadline = time.perf_counter() + CPU_BENCH_BUDGET_S
    while not times or (len(times) < CPU_BENCH_MAX_REPS and time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def benchmark(fn: Callable[[], Any], timer: Timer | None = None, *,
              device_type: str | None = None) -> float:
    """Milliseconds one call of `fn` takes (median).

    timer: a callable taking `fn` and returning ms (tests pass a fake one). Otherwise
    CUDA work is timed by `triton.testing.do_bench` and anything else by a perf_counter
    loop. device_type: "cuda" or "cpu"; None means cuda if torch sees a GPU.
    """
    if timer is not None:
        return float(timer(fn))
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return _cuda_benchmark(fn) if device_type == "cuda" else _cpu_benchmark(fn)


def _device_type_of(args: Sequence[Any]) -> str:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return "cuda" if arg.is_cuda else "cpu"
    return "cpu"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def select_best(candidates: Sequence[Config], launch: Callable[[Config], None],
                args: Sequence[Any], mutated_arg_indices: Sequence[int],
                timer: Timer | None = None, *, name: str = "kernel", mode: str = "max"
                ) -> tuple[Config, dict[str, float]]:
    """Benchmark every candidate with `launch(config)` and return (fastest, timings).

    args are the kernel's run() arguments that `launch` uses; the tensors at
    `mutated_arg_indices` are snapshotted first and their contents restored before each
    candidate and at the end, so in-place and accumulating kernels are left untouched.
    A candidate that raises (compile error, out of resources, ...) is skipped with one
    log line; if all fail, AutotuneError is raised. timings maps str(config) -> ms.
    mode: "max" (the full search) or "default" (the race within a budget, on CUDA).
    """
    if not candidates:
        raise ValueError(f"autotune {name}: no candidate configs")
    start = time.perf_counter()
    device_type = _device_type_of(args)
    saved = [(args[i], args[i].clone()) for i in mutated_arg_indices
             if isinstance(args[i], torch.Tensor)]

    def restore() -> None:
        for tensor, copy in saved:
            tensor.copy_(copy)

    errors: list[str] = []
    live = list(candidates)

    def disqualify(config: Config, error: Exception) -> None:
        log.info("autotune %s: skipping %s: %s", name, config, _first_line(error))
        errors.append(f"{config}: {_first_line(error)}")
        live.remove(config)

    try:
        if timer is None and device_type == "cuda" and mode != "max":
            timings = _cuda_race(live, launch, restore, disqualify)
        else:
            timings = _one_at_a_time(live, launch, restore, disqualify, timer, device_type)
    finally:
        restore()
        if device_type == "cuda":
            torch.cuda.synchronize()
        stats.tuning_seconds += time.perf_counter() - start
    if not live:
        raise AutotuneError(f"autotune {name}: all {len(candidates)} candidate configs failed:\n  "
                            + "\n  ".join(errors))
    best = min(live, key=lambda c: timings[str(c)])   # ties: the earlier (heuristic) one
    stats.tuned += 1
    log.debug("autotune %s: picked %s (%.4f ms) from %s", name, best, timings[str(best)], timings)
    return best, timings


def _one_at_a_time(live: list[Config], launch, restore, disqualify, timer, device_type: str
                   ) -> dict[str, float]:
    """benchmark() each candidate in turn (CUDA_BENCH_ROUNDS times on CUDA, keeping each
    one's best); failing candidates are disqualified."""
    timings: dict[str, float] = {}
    rounds = CUDA_BENCH_ROUNDS if timer is None and device_type == "cuda" else 1
    for _ in range(rounds):
        for config in list(live):
            restore()
            try:
                ms = benchmark(lambda: launch(config), timer, device_type=device_type)
            except Exception as e:  # noqa: BLE001 - any failure disqualifies the config
                disqualify(config, e)
                timings.pop(str(config), None)
                continue
            timings[str(config)] = min(ms, timings.get(str(config), ms))
    return timings


def _cuda_race(live: list[Config], launch, restore, disqualify) -> dict[str, float]:
    """Median ms of single launches of each candidate, interleaved round by round, the L2
    cache flushed before each; stops at BENCH_SAMPLES rounds, or after BENCH_BUDGET_S
    once every candidate has BENCH_MIN_SAMPLES."""
    for config in list(live):   # the first launch loads each binary and reveals failures
        restore()
        try:
            launch(config)
        except Exception as e:  # noqa: BLE001 - any failure disqualifies the config
            disqualify(config, e)
    torch.cuda.synchronize()
    restore()
    device = torch.cuda.current_device()
    l2_bytes = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
    flush = torch.empty(2 * l2_bytes, dtype=torch.int8, device="cuda")
    samples: dict[Config, list[float]] = {config: [] for config in live}
    deadline = time.perf_counter() + BENCH_BUDGET_S
    for round_index in range(BENCH_SAMPLES):
        pending = []
        for config in live:
            flush.zero_()
            # the GPU waits here while the host records the events and launches: without
            # it a kernel shorter than its launch (tens of microseconds of Python) is timed
            # with the host's latency, and the race picks by noise
            torch.cuda._sleep(HOST_LAUNCH_COVER_CYCLES)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            launch(config)
            end.record()
            pending.append((config, begin, end))
        torch.cuda.synchronize()
        for config, begin, end in pending:
            samples[config].append(begin.elapsed_time(end))
        if round_index + 1 >= BENCH_MIN_SAMPLES and time.perf_counter() > deadline:
            break
    return {str(config): statistics.median(times) for config, times in samples.items()}
