"""What the benchmark suites share: backends and devices, timing, machine facts, tables,
bar charts and the report files.

scripts/bench.py (the kernel suite and the `--suite` dispatch), scripts/bench_models.py and
scripts/bench_dynamic.py import from here; nothing here knows a suite's results.

Import this module before torch: it sets TORCHINDUCTOR_COMPILE_THREADS=1 (unless the
user set it) so that Inductor compiles in-process. Its background compile workers would
otherwise steal the cores being timed on a small CPU machine (a 0.1 ms kernel measured
7 ms).
"""
from __future__ import annotations

import datetime
import functools
import importlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `python scripts/<suite>.py` from a checkout, not installed
    sys.path.insert(0, str(REPO))

# True when this module chose Inductor's compile threads (not the user): suites that want
# Inductor's default parallel compile in their worker processes take the setting out again.
INDUCTOR_THREADS_SET_HERE = "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402

MIN_CPU_SAMPLE_S = 0.010
# Seconds of sampling per cell at most: a very slow backend gets fewer samples (3 at least).
TIMING_BUDGET_S = 3.0
L2_FLUSH_BYTES = 256 * 1024 * 1024
CUDA_ROUNDS = 5


# ----------------------------------------------------------------------------------------
# Backends and devices
# ----------------------------------------------------------------------------------------


class BackendUnavailable(RuntimeError):
    """The backend cannot be used in this environment (e.g. tritonfuse fails to import)."""


# A backend name may end in a torch.compile mode: "inductor-max-autotune" and
# "tritonfuse-max-autotune" compile with mode="max-autotune", "-reduce-overhead" with
# mode="reduce-overhead" (CUDA graphs).
MODE_SUFFIXES = ("max-autotune", "reduce-overhead")


def split_backend(name: str) -> tuple[str, str | None]:
    """"inductor-max-autotune" -> ("inductor", "max-autotune"); ("tritonfuse", None)."""
    for mode in MODE_SUFFIXES:
        if name.endswith("-" + mode):
            return name[:-len(mode) - 1], mode
    return name, None


def base_backend(name: str) -> str:
    """The backend ``name`` compiles with, without its mode: "tritonfuse" for
    "tritonfuse-max-autotune"."""
    return split_backend(name)[0]


def inductor_pairs(backends: list[str]) -> list[tuple[str, str]]:
    """(Inductor, tritonfuse) pairs of ``backends`` to compare: each mode against the same
    mode, and tritonfuse-max-autotune against default Inductor too."""
    pairs = []
    for mode in ("",) + tuple("-" + m for m in MODE_SUFFIXES):
        if "inductor" + mode in backends and "tritonfuse" + mode in backends:
            pairs.append(("inductor" + mode, "tritonfuse" + mode))
    for mode in MODE_SUFFIXES:
        if "inductor" in backends and f"tritonfuse-{mode}" in backends:
            pairs.append(("inductor", f"tritonfuse-{mode}"))
    return pairs


def resolve_backend(name: str) -> str | Callable:
    """What ``torch.compile(backend=...)`` takes for ``name``.

    "tritonfuse" is registered through the package's entry point when it is installed;
    from a plain checkout the entry point is missing, so the function itself is passed.
    "package.module:function" names any backend function by import path (worker processes
    of the model suites get backends that way). "<backend>-max-autotune": that backend
    compiling as under ``torch.compile(mode="max-autotune")`` (a backend function with the
    mode bound, so every suite's plain ``torch.compile(fn, backend=...)`` call takes it).
    Raises BackendUnavailable when the backend's module cannot be imported.
    """
    base, mode = split_backend(name)
    backend = _resolve_base_backend(base)
    return backend if mode is None else _with_mode(base, backend, mode)


def _resolve_base_backend(name: str) -> str | Callable:
    if ":" in name:
        module_name, attr = name.split(":", 1)
        try:
            return getattr(importlib.import_module(module_name), attr)
        except Exception as exc:
            raise BackendUnavailable(f"backend {name!r}: {type(exc).__name__}: {exc}") from exc
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


def _with_mode(base: str, backend: str | Callable, mode: str) -> Callable:
    """``backend`` compiling as ``torch.compile(backend=backend, mode=mode)`` would: Inductor
    with the mode's config patches, any other backend with ``mode=`` passed to it."""
    if base == "inductor":
        from torch._inductor import list_mode_options
        from torch._inductor.compile_fx import compile_fx
        return functools.partial(compile_fx, config_patches=list_mode_options(mode))
    if isinstance(backend, str):
        from torch._dynamo.backends.registry import lookup_backend
        backend = lookup_backend(backend)
    return functools.partial(backend, mode=mode)


def pick_device(arg: str) -> torch.device:
    if arg == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if arg == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available here")
    return torch.device(arg)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tritonfuse_metrics() -> dict:
    """Every counter of ``tritonfuse.metrics`` (ints, lists, dicts), read now. Counters
    that a newer tritonfuse adds are picked up without a change here; "generated_kernel_count"
    and "generated_kernels" also count the kernels of graphs loaded from the cache."""
    import tritonfuse.metrics as metrics  # read as module attributes: they are rebound

    snapshot = {}
    for name, value in vars(metrics).items():
        if name.startswith("_") or not isinstance(value, (int, float, list, dict)):
            continue
        if isinstance(value, list):
            value = [v if isinstance(v, (int, float, str)) else repr(v) for v in value]
        snapshot[name] = dict(value) if isinstance(value, dict) else value
    cached = list(snapshot.get("cached_kernels", []))
    snapshot["generated_kernel_count"] = snapshot.get("generated_kernel_count", 0) + len(cached)
    snapshot["generated_kernels"] = list(snapshot.get("generated_kernels", [])) + cached
    snapshot["outer_loop_fusions"] = len(snapshot.get("outer_loop_fusions", []))
    return snapshot


def dynamo_counts() -> dict:
    """Dynamo's work in this process so far: graphs handed to the backend (every compile,
    recompiles included), recompiles (frames compiled again after a guard failed, e.g. on
    a new input shape) and graph breaks."""
    try:
        from torch._dynamo.utils import counters, guard_failures
        return {"graphs": counters["stats"]["unique_graphs"],
                "recompiles": sum(len(reasons) for reasons in guard_failures.values()),
                "graph_breaks": sum(counters["graph_break"].values())}
    except Exception:
        return {}


def short_error(exc: BaseException) -> str:
    """The exception's type and first lines, on one line (the traceback goes to the JSON)."""
    lines = [line.strip() for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
    text = " / ".join(lines[:3])
    return text if len(text) <= 300 else text[:297] + "..."


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


# ~0.1 s on a 1.7-2 GHz GPU: longer than any step's enqueue
SLEEP_CYCLES = 200_000_000


def host_and_device_ms(fn: Callable[[], Any], n: int) -> tuple[float, float, int]:
    """(median host ms, median device ms, calls whose enqueue outlasted the sleep) of ``fn``
    on the current CUDA device. Each call is queued whole behind a sleep kernel: its host
    time is the pure enqueue cost (no launch waits for the device), and CUDA events around
    it give the pure device time, with no gap left by the host. A host-bound step's
    pipelined time follows its host time; the device time is what its kernels cost."""
    host, device, blocked = [], [], 0
    for _ in range(n):
        torch.cuda.synchronize()
        sleep_start, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        sleep_start.record()
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append(1000 * (time.perf_counter() - t0))
        end.record()
        torch.cuda.synchronize()
        device.append(start.elapsed_time(end))
        blocked += host[-1] >= sleep_start.elapsed_time(start)
    return statistics.median(host), statistics.median(device), blocked


def time_samples(fn: Callable[[], Any], repeat: int, device: torch.device) -> list[float]:
    if device.type == "cuda":
        return time_cuda_samples(fn, repeat, device)
    return time_cpu_samples(fn, repeat)


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


# ----------------------------------------------------------------------------------------
# Numbers and tables
# ----------------------------------------------------------------------------------------


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else fmt(value, 2) + "x"


def markdown_table(header: list[str], rows: list[list[str]], align_right_from: int) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        out = []
        for i, (c, w) in enumerate(zip(cells, widths)):
            out.append(str(c).rjust(w) if i >= align_right_from else str(c).ljust(w))
        return "| " + " | ".join(out) + " |"

    sep = ["-" * w if i < align_right_from else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
    return [line(header), "|" + "|".join(f" {s} " for s in sep) + "|"] + [line(r) for r in rows]


class Notes:
    """Numbered notes under a table: ``ref(text)`` gives a cell's "[n]" (one number per
    distinct text), ``lines()`` the list to print below the table."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        if not self.texts:
            return []
        return ["", "Notes:"] + [f"{i}. {t}" for i, t in enumerate(self.texts, 1)]


# ----------------------------------------------------------------------------------------
# The machine
# ----------------------------------------------------------------------------------------


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_info(device: torch.device) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except Exception:
        triton_version = None
    try:
        # only a checkout's own commit: a copy of the tree inside another checkout (say, an
        # exported commit run on another machine) would report the enclosing one's
        top, commit = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"], cwd=REPO,
                                     text=True, capture_output=True, timeout=5).stdout.split()
        commit = commit if os.path.realpath(top) == os.path.realpath(REPO) else None
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
        "load_avg": load_average(),
        "git_commit": commit,
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu_memory_gb"] = round(props.total_memory / 1e9, 1)
        info["gpu_capability"] = f"{props.major}.{props.minor}"
    return info


def machine_line(info: dict, timing: str) -> str:
    """The line under a report's title: versions, cores, timing method, date, load."""
    line = (f"torch {info['torch']}, triton {info['triton'] or '-'}, python {info['python']}, "
            f"{info['cpu_count']} CPUs, {info['torch_threads']} torch threads, "
            f"{timing}; {info['timestamp']}")
    if info.get("git_commit"):
        line += f"; commit {info['git_commit']}"
    if info.get("load_avg") and info.get("load_avg_end"):
        line += (f"; load average {info['load_avg'][0]:.2f} at start, "
                 f"{info['load_avg_end'][0]:.2f} at end")
    return line


def busy_machine_note(info: dict) -> list[str]:
    """Lines for a report made on a busy CPU machine (none otherwise)."""
    if info["device"] != "cpu" or not info.get("load_avg") or info["load_avg"][0] <= 0.5:
        return []
    return ["", f"**Noisy numbers:** this CPU machine was shared and busy (load average "
            f"{info['load_avg'][0]:.1f} on {info['cpu_count']} cores at the start); times and "
            "first-call seconds can move by tens of percent between runs."]


def warn_if_busy(info: dict) -> None:
    if info["device"] == "cpu" and info["load_avg"] and info["load_avg"][0] > 0.5:
        print(f"WARNING: the machine is busy (1-min load average {info['load_avg'][0]:.2f} on "
              f"{info['cpu_count']} CPUs): CPU timings will be noisy", file=sys.stderr)


# ----------------------------------------------------------------------------------------
# Charts and report files
# ----------------------------------------------------------------------------------------


@dataclass
class Bar:
    """One bar of a grouped chart: its value, or (value None) a label written instead."""

    value: float | None
    label: str = ""
    wrong: bool = False  # hatched red: the result did not match eager


def _minor_tick_label(value: float, _pos) -> str:
    """Label only the 2x, 3x and 5x minor ticks of a log axis, in plain numbers."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)), 6)
    return f"{value:g}" if mantissa in (2, 3, 5) else ""


def grouped_bars(ax, groups: list[str], series: dict[str, list[Bar]], colors: dict,
                 base: float = 0.0) -> None:
    """One group of bars per entry of ``groups``, one bar per series in it; ``base`` is a
    bar's foot (1 for ratios, so that slow-downs hang below the line). Log y axis with
    plain tick labels, x tick labels from ``groups``."""
    from matplotlib.ticker import FuncFormatter

    width = 0.8 / max(len(series), 1)
    for i, (name, bars) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        drawn = [(j + offset, bar) for j, bar in enumerate(bars) if bar.value]
        for j, bar in enumerate(bars):
            if not bar.value and bar.label:
                ax.text(j + offset, 0.5, bar.label, rotation=90, ha="center", va="center",
                        fontsize=7, transform=ax.get_xaxis_transform())
        patches = ax.bar([x for x, _ in drawn], [bar.value - base for _, bar in drawn], width,
                         bottom=base, label=name, color=colors[name])
        for patch, (_, bar) in zip(patches, drawn):
            if bar.wrong:
                patch.set_hatch("//")
                patch.set_edgecolor("red")
    if base:
        ax.axhline(base, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_minor_tick_label))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8)


def pyplot():
    """matplotlib.pyplot with a file-only backend, or None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path: Path) -> str:
    """Lay out, write and close a figure; returns "" (the write_png convention: no note)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


NO_MATPLOTLIB = "matplotlib is not installed: no {name} (pip install matplotlib)"


def write_report(report: dict, out: Path, stem: str, markdown: str,
                 draw_png: Callable[[dict, Path], str]) -> None:
    """Write ``<stem>.json``, ``<stem>.md`` and (through ``draw_png``, which returns a note
    when it cannot) ``<stem>.png`` to ``out``; print the markdown and what was written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    png_note = draw_png(report, out / f"{stem}.png")
    print()
    print(markdown)
    if png_note:
        print(f"NOTE: {png_note}")
    print(f"wrote {out / f'{stem}.json'}, {out / f'{stem}.md'}"
          + ("" if png_note else f", {out / f'{stem}.png'}") + f"  (total {report['wall_s']} s)")
