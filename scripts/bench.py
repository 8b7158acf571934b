#!/usr/bin/env python
"""Time eager, Inductor and tritonfuse side by side, in one run, on one device.

    python scripts/bench.py                                   # all workloads, best device
    python scripts/bench.py --device cpu --backends eager,inductor
    python scripts/bench.py --workloads softmax,norm --repeat 50 --out /tmp/bench
    python scripts/bench.py --workloads mm_ --backends eager,inductor,inductor-max-autotune,tritonfuse-max-autotune

A backend name may end in "-max-autotune": it is compiled with torch.compile(mode="max-autotune").

For every workload of scripts/models.py the same inputs go to every backend. Eager runs
first and is the reference: each compiled backend's first call (which compiles it) is
checked against eager with the workload's tolerance, and a mismatch shows as FAIL in the
table. Then each backend is warmed up and timed:

  GPU  CUDA events around one call each, L2 flushed before each call (the method of
       triton.testing.do_bench), median of --repeat calls, taken in 5 interleaved rounds
  CPU  time.perf_counter around loops of calls (each loop >= 10 ms), median of --repeat loops;
       the loops of all backends are interleaved round by round, so a change in the load of
       a shared machine during the run weighs on every backend alike
  Either way a cell samples for at most ~3 s: a very slow backend gets fewer samples (>= 3).
       (Inductor compiles in-process here: its background compile workers would otherwise
       steal the cores being timed; on a machine shared with other jobs, --stat min helps)

Speed-ups are ratios of times: "X vs eager" = eager_ms / X_ms, "tritonfuse vs inductor" =
inductor_ms / tritonfuse_ms (above 1 means tritonfuse is faster). GB/s is the workload's
ideal traffic (inputs read once, outputs written once) over the measured time.

Writes bench.json (machine info + every cell), bench.md (the tables) and bench.png
(speed-ups vs eager, log scale) to --out. A backend that fails to compile a workload shows
as an error in that cell and the run goes on. Exit status: 0 when every compiled result
matched eager, 1 when any cell is FAIL or error.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `python scripts/bench.py` from a checkout, not installed
    sys.path.insert(0, str(_REPO))
# Inductor compiles in a pool of worker processes that keeps warming up in the background
# after the first compile; on a small CPU machine they steal the cores being timed (a
# 0.1 ms kernel measured 7 ms). Compile in-process instead (set before torch is imported).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

from scripts.models import Workload, describe_inputs, select_workloads, WORKLOADS  # noqa: E402

DEFAULT_BACKENDS = "eager,inductor,tritonfuse"
DEFAULT_REPEAT = {"cpu": 15, "cuda": 50}
MIN_CPU_SAMPLE_S = 0.010
# Seconds of sampling per cell at most: a very slow backend gets fewer samples (3 at least).
TIMING_BUDGET_S = 3.0
L2_FLUSH_BYTES = 256 * 1024 * 1024


# ----------------------------------------------------------------------------------------
# Backends and devices
# ----------------------------------------------------------------------------------------


class BackendUnavailable(RuntimeError):
    """The backend cannot be used in this environment (e.g. tritonfuse fails to import)."""


def resolve_backend(name: str) -> str | Callable:
    """What ``torch.compile(backend=...)`` takes for ``name``.

    "tritonfuse" is registered through the package's entry point when it is installed;
    from a plain checkout the entry point is missing, so the function itself is passed.
    Raises BackendUnavailable when ``tritonfuse.backend`` cannot be imported.
    """
    if name != "tritonfuse":
        return name
    try:
        import tritonfuse.backend as tritonfuse_backend
    except Exception as exc:  # an import error, or any error raised while importing it
        raise BackendUnavailable(
            f"`import tritonfuse.backend` failed ({type(exc).__name__}: {exc})") from exc
    if "tritonfuse" in torch._dynamo.list_backends(exclude_tags=()):
        return "tritonfuse"
    return tritonfuse_backend.tritonfuse_backend


def pick_device(arg: str) -> torch.device:
    if arg == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if arg == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here")
    return torch.device(arg)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------


def _warm_up(fn: Callable[[], Any], device: torch.device, min_calls: int) -> float:
    """Call ``fn`` at least ``min_calls`` times and for 50 ms (fewer calls when one is slower
    than a quarter of the budget); returns the seconds per call."""
    synchronize(device)
    start = time.perf_counter()
    calls = 0
    while True:
        fn()
        synchronize(device)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed > TIMING_BUDGET_S / 4 or (calls >= min_calls and elapsed >= 0.05):
            return elapsed / calls


def _affordable(repeat: int, seconds_per_sample: float) -> int:
    """``repeat``, cut so that sampling stays within TIMING_BUDGET_S (but at least 3)."""
    return max(3, min(repeat, int(TIMING_BUDGET_S / max(seconds_per_sample, 1e-9))))


def _cpu_loop_length(fn: Callable[[], Any]) -> tuple[int, float]:
    """After a warm-up: (calls per timed loop so that a loop lasts >= 10 ms, s per call)."""
    per_call = _warm_up(fn, torch.device("cpu"), min_calls=3)
    return max(1, math.ceil(MIN_CPU_SAMPLE_S / max(per_call, 1e-9))), per_call


def _cpu_loop_sample(fn: Callable[[], Any], calls: int) -> float:
    """ms per call, averaged over one loop of ``calls`` calls."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def time_cpu_samples(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Per-call times in ms, each the mean over a loop of calls lasting >= 10 ms."""
    calls, per_call = _cpu_loop_length(fn)
    return [_cpu_loop_sample(fn, calls) for _ in range(_affordable(repeat, calls * per_call))]


def time_cuda_samples(fn: Callable[[], Any], repeat: int, device: torch.device) -> list[float]:
    """Single-call times in ms, by CUDA events, with L2 flushed before each call."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    per_call = _warm_up(fn, device, min_calls=5)
    count = _affordable(repeat, per_call)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(count)]
    for i in range(count):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_samples(fn: Callable[[], Any], repeat: int, device: torch.device) -> list[float]:
    if device.type == "cuda":
        return time_cuda_samples(fn, repeat, device)
    return time_cpu_samples(fn, repeat)


# ----------------------------------------------------------------------------------------
# Correctness
# ----------------------------------------------------------------------------------------


def _flatten(obj: Any) -> list:
    if isinstance(obj, (tuple, list)):
        return [leaf for item in obj for leaf in _flatten(item)]
    return [obj]


def compare(expected: Any, actual: Any, atol: float, rtol: float) -> tuple[bool, float, str]:
    """(matches, max abs error, what differs) for two nested outputs."""
    exp_leaves, act_leaves = _flatten(expected), _flatten(actual)
    if len(exp_leaves) != len(act_leaves):
        return False, math.inf, f"{len(act_leaves)} outputs, eager has {len(exp_leaves)}"
    max_err = 0.0
    for i, (e, a) in enumerate(zip(exp_leaves, act_leaves)):
        if not isinstance(e, torch.Tensor):
            if e != a:
                return False, math.inf, f"output {i}: {a!r} != eager's {e!r}"
            continue
        if not isinstance(a, torch.Tensor):
            return False, math.inf, f"output {i}: got {type(a).__name__}, eager has a tensor"
        if a.shape != e.shape or a.dtype != e.dtype:
            return False, math.inf, (f"output {i}: {tuple(a.shape)} {a.dtype}, "
                                     f"eager has {tuple(e.shape)} {e.dtype}")
        e64, a64 = e.detach().double(), a.detach().double()
        close = torch.isclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True)
        diff = (a64 - e64).abs().nan_to_num(nan=math.inf)
        both_nan = e64.isnan() & a64.isnan()
        err = float(diff.masked_fill(both_nan, 0).max()) if diff.numel() else 0.0
        max_err = max(max_err, err)
        if not bool(close.all()):
            bad = int((~close).sum())
            return False, max_err, (f"output {i}: {bad} of {close.numel()} elements differ, "
                                    f"max abs error {err:.3g} (atol {atol:g}, rtol {rtol:g})")
    return True, max_err, ""


# ----------------------------------------------------------------------------------------
# Running one workload on every backend
# ----------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One (workload, backend) result. status: ok | FAIL (wrong result) | error | skipped."""

    backend: str
    status: str
    ms: float | None = None  # the --stat of the samples (median by default)
    ms_median: float | None = None
    ms_min: float | None = None
    samples: int = 0
    gbps: float | None = None
    compile_s: float | None = None
    max_abs_err: float | None = None
    message: str = ""
    traceback: str = ""
    metrics: dict = field(default_factory=dict)  # tritonfuse.metrics after the compile


def _tritonfuse_metrics() -> dict:
    import tritonfuse.metrics  # read as module attributes: they are rebound

    return {
        # kernels of the compiled graphs, whether generated now or loaded from the cache
        "generated_kernel_count": (tritonfuse.metrics.generated_kernel_count
                                   + len(tritonfuse.metrics.cached_kernels)),
        "generated_kernels": list(tritonfuse.metrics.generated_kernels) + list(tritonfuse.metrics.cached_kernels),
        "fused_node_count": tritonfuse.metrics.fused_node_count,
        "fallbacks": dict(tritonfuse.metrics.fallbacks),
        "outer_loop_fusions": len(tritonfuse.metrics.outer_loop_fusions),
        "graph_cache_hits": tritonfuse.metrics.graph_cache_hits,
    }


def _short(exc: BaseException) -> str:
    """The exception's type and first lines, on one line (the traceback goes to the JSON)."""
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    text = " / ".join(lines[:3])
    return text if len(text) <= 300 else text[:297] + "..."


def _fresh_function(fn: Callable) -> Callable:
    """A copy of ``fn`` with its own code object, so each backend gets its own Dynamo cache
    entry and the compiled functions of all backends can live side by side."""
    import types

    if not isinstance(fn, types.FunctionType):
        return fn
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def split_mode(backend: str) -> tuple[str, str | None]:
    """"inductor-max-autotune" -> ("inductor", "max-autotune"): a backend name may end in a
    torch.compile mode."""
    for mode in ("max-autotune",):
        if backend.endswith("-" + mode):
            return backend[:-len(mode) - 1], mode
    return backend, None


def compile_backend(workload: Workload, backend: str, inputs: tuple, expected: Any,
                    device: torch.device) -> tuple[Callable | None, Cell]:
    """Compile ``workload`` with ``backend`` and check its first result against eager.
    Returns (the compiled function, its cell so far) or (None, an error cell)."""
    atol, rtol = workload.tolerance
    base, mode = split_mode(backend)
    try:
        if base == "tritonfuse":
            import tritonfuse.metrics
            tritonfuse.metrics.reset()
        compiled = torch.compile(_fresh_function(workload.fn), backend=resolve_backend(base), mode=mode)
        t0 = time.perf_counter()
        actual = compiled(*inputs)
        synchronize(device)
        compile_s = time.perf_counter() - t0
        metrics = _tritonfuse_metrics() if base == "tritonfuse" else {}
        ok, max_err, why = compare(expected, actual, atol, rtol)
        del actual
    except Exception as exc:
        return None, Cell(backend, "error", message=_short(exc), traceback=traceback.format_exc())
    return compiled, Cell(backend, "ok" if ok else "FAIL", compile_s=compile_s, max_abs_err=max_err,
                          message=why, metrics=metrics)


CUDA_ROUNDS = 5


def sample_interleaved(fns: dict[str, Callable[[], Any]], repeat: int,
                       device: torch.device) -> tuple[dict[str, list[float]], dict[str, BaseException]]:
    """Samples of every function, taken in rounds that visit each function once (in a
    rotating order), so a slow spell of the machine during the run (a busy host CPU, a
    stalled launch) hits all backends alike instead of whichever one was being timed.
    CPU: one >= 10 ms loop per function per round. CUDA: a batch of event-timed calls
    per function per round (CUDA_ROUNDS rounds). Returns (samples, errors): a function
    that raises is dropped and its error kept."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    errors: dict[str, BaseException] = {}
    if device.type == "cuda":
        per_round = max(1, math.ceil(repeat / CUDA_ROUNDS))
        rounds, measure = CUDA_ROUNDS, (lambda name: time_cuda_samples(fns[name], per_round, device))
    else:
        loops = {}
        for name, fn in fns.items():
            try:
                loops[name] = _cpu_loop_length(fn)
            except Exception as exc:
                errors[name] = exc
        round_s = sum(calls * per_call for calls, per_call in loops.values())
        rounds = max(3, min(repeat, int(TIMING_BUDGET_S * max(len(loops), 1) / max(round_s, 1e-9))))

        def measure(name):
            return [_cpu_loop_sample(fns[name], loops[name][0])]
    names = [name for name in fns if name not in errors]
    for r in range(rounds if names else 0):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if name in errors:
                continue
            try:
                samples[name].extend(measure(name))
            except Exception as exc:
                errors[name] = exc
    for name in errors:
        samples.pop(name, None)
    return samples, errors


def run_workload(workload: Workload, device: torch.device, backends: list[str], repeat: int,
                 stat: str, unavailable: dict[str, str]) -> dict:
    """Compile every backend, check each against eager, then time them all together."""
    inputs = workload.make_inputs(device)
    expected = workload.fn(*inputs)
    synchronize(device)
    ideal = workload.ideal_bytes(inputs, expected)
    torch.compiler.reset()
    cells = {"eager": Cell("eager", "ok", max_abs_err=0.0)}
    to_time = {"eager": lambda: workload.fn(*inputs)}
    for backend in backends:
        if backend == "eager":
            continue
        if backend in unavailable:
            cells[backend] = Cell(backend, "skipped", message=unavailable[backend])
            continue
        compiled, cells[backend] = compile_backend(workload, backend, inputs, expected, device)
        if compiled is not None:
            to_time[backend] = (lambda c: lambda: c(*inputs))(compiled)
    try:
        samples, errors = sample_interleaved(to_time, repeat, device)
    finally:
        torch.compiler.reset()
    for backend, exc in errors.items():  # worked once, then failed
        cells[backend] = Cell(backend, "error", message=_short(exc),
                              traceback="".join(traceback.format_exception(exc)))
    for backend, values in samples.items():
        cell = cells[backend]
        cell.ms = min(values) if stat == "min" else statistics.median(values)
        cell.ms_median, cell.ms_min, cell.samples = statistics.median(values), min(values), len(values)
        cell.gbps = ideal / (cell.ms * 1e-3) / 1e9
    result = {"workload": workload.name, "size": describe_inputs(inputs), "ideal_bytes": ideal,
              "tolerance": list(workload.tolerance),
              "cells": {b: asdict(c) for b, c in cells.items() if b in backends}}
    del inputs, expected, to_time
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# ----------------------------------------------------------------------------------------
# Ratios, tables, files
# ----------------------------------------------------------------------------------------


def speedup(result: dict, slower: str, faster: str) -> float | None:
    """slower_ms / faster_ms when both cells are correct and timed, else None."""
    cells = result["cells"]
    a, b = cells.get(slower), cells.get(faster)
    if not a or not b or a["status"] != "ok" or b["status"] != "ok":
        return None
    return a["ms"] / b["ms"]


def ratio_columns(backends: list[str]) -> list[tuple[str, str]]:
    """(baseline, backend) pairs to report: every compiled backend vs eager, and
    tritonfuse vs inductor when both ran."""
    pairs = [("eager", b) for b in backends if b != "eager"] if "eager" in backends else []
    for mode in ("", "-max-autotune"):
        if "tritonfuse" + mode in backends and "inductor" + mode in backends:
            pairs.append(("inductor" + mode, "tritonfuse" + mode))
    if "tritonfuse-max-autotune" in backends and "inductor" in backends:
        pairs.append(("inductor", "tritonfuse-max-autotune"))
    return pairs


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(results: list[dict], backends: list[str]) -> dict:
    summary = {}
    for base, b in ratio_columns(backends):
        ratios = [r for r in (speedup(res, base, b) for res in results) if r is not None]
        summary[f"{b}_vs_{base}"] = {"geomean": geomean(ratios), "workloads": len(ratios)}
    return summary


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def _markdown_table(header: list[str], rows: list[list[str]], align_right_from: int) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            out.append(str(c).rjust(w) if i >= align_right_from else str(c).ljust(w))
        return "| " + " | ".join(out) + " |"

    sep = ["-" * w if i < align_right_from else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
    return [line(header), "|" + "|".join(f" {s} " for s in sep) + "|"] + [line(r) for r in rows]


def render_markdown(report: dict) -> str:
    backends, results, summary = report["backends"], report["results"], report["summary"]
    info = report["machine"]
    pairs = ratio_columns(backends)
    notes: list[str] = []

    def note(text: str) -> int:
        if text not in notes:
            notes.append(text)
        return notes.index(text) + 1

    def time_cell(cell: dict) -> str:
        if cell["status"] in ("error", "skipped"):
            return f"{cell['status']} [{note(cell['backend'] + ': ' + cell['message'])}]"
        if cell["status"] == "FAIL":
            return f"FAIL {_fmt(cell['ms'])}"
        return _fmt(cell["ms"])

    header = (["workload", "size"] + [f"{b} ms" for b in backends] + [f"{b} GB/s" for b in backends]
              + [f"{b} vs {base}" for base, b in pairs] + ["check"])
    rows = []
    for res in results:
        cells = res["cells"]
        row = [res["workload"], res["size"]]
        row += [time_cell(cells[b]) for b in backends]
        row += [_fmt(cells[b]["gbps"], 1) if cells[b]["gbps"] else "-" for b in backends]
        for base, b in pairs:
            ratio = speedup(res, base, b)
            row.append("-" if ratio is None else _fmt(ratio, 2) + "x")
        checks = []
        for b in backends:
            if b == "eager":
                continue
            c = cells[b]
            if c["status"] == "FAIL":
                n = note(f"{b} on {res['workload']} is WRONG: {c['message']}")
                checks.append(f"{b} FAIL [{n}]")
            else:
                checks.append(f"{b} {c['status']}")
        row.append(", ".join(checks) or "reference")
        rows.append(row)
    geo_row = ["geomean", ""] + [""] * (2 * len(backends))
    for base, b in pairs:
        s = summary[f"{b}_vs_{base}"]
        geo_row.append(f"{_fmt(s['geomean'], 2)}x (n={s['workloads']})" if s["geomean"] else "-")
    geo_row.append("")
    rows.append(geo_row)

    lines = [f"# Benchmark: {', '.join(backends)} on {info['device_name']}", ""]
    lines.append(f"torch {info['torch']}, triton {info['triton'] or '-'}, python {info['python']}, "
                 f"{info['cpu_count']} CPUs, {info['torch_threads']} torch threads, "
                 f"{report['timing']}; {info['timestamp']}")
    if info.get("load_avg") and info.get("load_avg_end"):
        lines[-1] += (f"; load average {info['load_avg'][0]:.2f} at start, "
                      f"{info['load_avg_end'][0]:.2f} at end")
    lines.append("")
    lines.append("Times in ms (lower is better); \"X vs Y\" = Y_ms / X_ms (above 1: X is faster); "
                 "GB/s of ideal traffic (inputs read once, outputs written once). Geomeans use "
                 "only workloads where both backends ran and matched eager.")
    lines.append("")
    lines += _markdown_table(header, rows, align_right_from=2)
    if notes:
        lines += ["", "Notes:"] + [f"{i}. {n}" for i, n in enumerate(notes, 1)]

    compiled = [b for b in backends if b != "eager"]
    if compiled:
        lines += ["", "## Compile time (s, first call) and max abs error vs eager", ""]
        header2 = ["workload"] + [f"{b} compile s" for b in compiled] + [f"{b} max err" for b in compiled]
        if "tritonfuse" in compiled:
            header2 += ["tritonfuse kernels", "tritonfuse fallbacks"]
        rows2 = []
        for res in results:
            cells = res["cells"]
            row = [res["workload"]]
            row += [_fmt(cells[b]["compile_s"], 2) for b in compiled]
            row += [f"{cells[b]['max_abs_err']:.2g}" if cells[b]["max_abs_err"] is not None else "-"
                    for b in compiled]
            if "tritonfuse" in compiled:
                m = cells["tritonfuse"]["metrics"]
                row.append(str(m.get("generated_kernel_count", "-")))
                row.append(", ".join(m.get("fallbacks", {})) or "-")
            rows2.append(row)
        lines += _markdown_table(header2, rows2, align_right_from=1)
    return "\n".join(lines) + "\n"


def _minor_tick_label(value: float, _pos) -> str:
    """Label only the 2x, 3x and 5x minor ticks of a log axis, in plain numbers."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
    return f"{value:g}" if mantissa in (2, 3, 5) else ""


def _grouped_bars(ax, results: list[dict], backends: list[str], colors: dict, value,
                  geomeans=None, base: float = 0.0) -> None:
    """One group of bars per workload (and a last "geomean" group when given), one bar per
    backend; ``value(result, cell)`` gives a bar's top, ``base`` its foot (1 for ratios, so
    slow-downs hang below the line). Wrong results are hatched red, cells that did not run
    are labelled instead of drawn. Log y axis with plain tick labels."""
    from matplotlib.ticker import FuncFormatter

    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        offset = (i - (len(backends) - 1) / 2) * width
        xs, ys, wrong = [], [], []
        for j, res in enumerate(results):
            cell = res["cells"][b]
            if cell["status"] in ("ok", "FAIL") and cell["ms"]:
                xs.append(j + offset)
                ys.append(value(res, cell))
                wrong.append(cell["status"] == "FAIL")
            else:
                ax.text(j + offset, 0.5, cell["status"], rotation=90, ha="center", va="center",
                        fontsize=7, transform=ax.get_xaxis_transform())
        if geomeans and geomeans.get(b):
            xs.append(len(results) + offset)
            ys.append(geomeans[b])
            wrong.append(False)
        bars = ax.bar(xs, [y - base for y in ys], width, bottom=base, label=b, color=colors[b])
        for bar, is_wrong in zip(bars, wrong):
            if is_wrong:
                bar.set_hatch("//")
                bar.set_edgecolor("red")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_tick_label))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.legend(fontsize=8)


def write_png(report: dict, path: Path) -> str:
    """Bar charts, log scale: speed-ups vs eager per compiled backend (with geomeans), and
    GB/s of ideal traffic per backend. Returns a note for the user ("" when written)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no bench.png (pip install matplotlib)"
    results, backends = report["results"], report["backends"]
    compiled = [b for b in backends if b != "eager"]
    labels = [r["workload"] for r in results]
    colors = {b: f"C{i}" for i, b in enumerate(backends)}  # one colour per backend, both panels
    panels = 2 if compiled else 1
    fig, axes = plt.subplots(panels, 1, squeeze=False,
                             figsize=(max(8.0, 0.45 * (len(labels) + 1) * len(backends)), 4.5 * panels))
    if compiled:
        ax = axes[0][0]
        geomeans = {b: report["summary"].get(f"{b}_vs_eager", {}).get("geomean") for b in compiled}
        _grouped_bars(ax, results, compiled, colors,
                      lambda res, cell: res["cells"]["eager"]["ms"] / cell["ms"], geomeans, base=1.0)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("speed-up vs eager\n(eager_ms / backend_ms)")
        ax.set_xticks(range(len(labels) + 1))
        ax.set_xticklabels(labels + ["geomean"], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{report['machine']['device_name']} ({report['device']}); "
                     "hatched red: wrong result")
    ax = axes[-1][0]
    _grouped_bars(ax, results, backends, colors, lambda res, cell: cell["gbps"])
    ax.set_ylabel("GB/s of ideal traffic")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_REPO, text=True,
                                capture_output=True, timeout=5).stdout.strip() or None
    except Exception:
        commit = None
    info = {
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "cpu_name": _cpu_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git_commit": commit,
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu_memory_gb"] = round(props.total_memory / 1e9, 1)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
    return info


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where tensors live (auto: cuda if available, else cpu)")
    p.add_argument("--backends", default=DEFAULT_BACKENDS,
                   help=f"comma-separated backends (default {DEFAULT_BACKENDS}); eager is "
                        "always run as the reference")
    p.add_argument("--workloads", default=None,
                   help="comma-separated substrings; run workloads whose name contains one")
    p.add_argument("--repeat", type=int, default=None,
                   help="timed samples per cell (default: cpu "
                        f"{DEFAULT_REPEAT['cpu']}, cuda {DEFAULT_REPEAT['cuda']})")
    p.add_argument("--stat", choices=["median", "min"], default="median",
                   help="statistic of the samples reported as a cell's time (default median; "
                        "min is steadier on a shared, busy machine)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads(N) before compiling (default: torch's choice)")
    p.add_argument("--out", default="bench_results", help="output folder (default bench_results/)")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for w in WORKLOADS:
            print(f"{w.name:20s} tolerance atol={w.tolerance[0]:g} rtol={w.tolerance[1]:g}")
        return 0
    device = pick_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "eager" not in backends:
        backends.insert(0, "eager")  # the reference every result is checked against
    workloads = select_workloads(args.workloads)
    if not workloads:
        print(f"no workload matches --workloads {args.workloads!r}; see --list", file=sys.stderr)
        return 2
    repeat = args.repeat or DEFAULT_REPEAT["cuda" if device.type == "cuda" else "cpu"]

    unavailable: dict[str, str] = {}
    for b in backends:
        if b == "eager":
            continue
        try:
            resolve_backend(split_mode(b)[0])
        except BackendUnavailable as exc:
            unavailable[b] = str(exc)
            print(f"NOTE: backend {b!r} is skipped: {exc}", file=sys.stderr)

    timing = (f"CUDA events, L2 flushed, {args.stat} of {repeat}" if device.type == "cuda"
              else f"perf_counter loops >= {MIN_CPU_SAMPLE_S * 1e3:.0f} ms, {args.stat} of {repeat}")
    info = machine_info(device)
    print(f"bench: {len(workloads)} workloads x {backends} on {device.type} "
          f"({info['device_name']}); {timing}")
    busy = info["load_avg"] and info["load_avg"][0] > 0.5
    if device.type == "cpu" and busy:
        print(f"WARNING: the machine is busy (1-min load average {info['load_avg'][0]:.2f} on "
              f"{info['cpu_count']} CPUs): CPU timings will be noisy (--threads 1 suffers least)",
              file=sys.stderr)
    results = []
    started = time.perf_counter()
    with torch.no_grad():
        for i, w in enumerate(workloads, 1):
            t0 = time.perf_counter()
            res = run_workload(w, device, backends, repeat, args.stat, unavailable)
            results.append(res)
            parts = []
            for b in backends:
                c = res["cells"][b]
                if c["status"] in ("ok", "FAIL"):
                    extra = "" if b == "eager" else f" {c['status']}, compile {c['compile_s']:.1f} s"
                    parts.append(f"{b} {c['ms']:.3f} ms{extra}")
                else:
                    parts.append(f"{b} {c['status']}")
            print(f"[{i:2d}/{len(workloads)}] {w.name:18s} {res['size']:16s} " + " | ".join(parts)
                  + f"  ({time.perf_counter() - t0:.1f} s)", flush=True)

    info["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report = {"machine": info, "device": device.type, "backends": backends, "repeat": repeat,
              "timing": timing, "wall_s": round(time.perf_counter() - started, 1),
              "results": results, "summary": summarize(results, backends)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    markdown = render_markdown(report)
    (out / "bench.md").write_text(markdown)
    png_note = write_png(report, out / "bench.png")
    print()
    print(markdown)
    if png_note:
        print(f"NOTE: {png_note}")
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'}"
          + ("" if png_note else f", {out / 'bench.png'}") + f"  (total {report['wall_s']} s)")

    bad = [(r["workload"], b, c["status"]) for r in results for b, c in r["cells"].items()
           if c["status"] in ("FAIL", "error")]
    if bad:
        print("NOT CLEAN: " + "; ".join(f"{b} {s} on {w}" for w, b, s in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
