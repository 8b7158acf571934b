#!/usr/bin/env python
"""Time eager, Inductor and tritonfuse side by side, in one run, on one device.

    python scripts/bench.py                                   # all workloads, best device
    python scripts/bench.py --device cpu --backends eager,inductor
    python scripts/bench.py --workloads softmax,norm --repeat 50 --out /tmp/bench
    python scripts/bench.py --workloads mm_ --backends eager,inductor,inductor-max-autotune,tritonfuse-max-autotune
    python scripts/bench.py --sweep --sweep-quick             # CPU shape sweep (bench_sweep.py)

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
import math
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `python scripts/bench.py` from a checkout, not installed
    sys.path.insert(0, str(_REPO))

# scripts.bench_common first: it sets the environment that torch must see at import.
from scripts.bench_common import (MIN_CPU_SAMPLE_S, NO_MATPLOTLIB, Bar,  # noqa: E402,F401
                                  BackendUnavailable, Notes, fmt, geomean, grouped_bars,
                                  load_average, machine_info, machine_line, markdown_table,
                                  base_backend, inductor_pairs, pick_device, pyplot, resolve_backend,
                                  sample_interleaved, save_figure, short_error, synchronize, time_samples,
                                  tritonfuse_metrics, warn_if_busy, write_report)

import torch  # noqa: E402

from scripts.models import Workload, describe_inputs, select_workloads, WORKLOADS  # noqa: E402

SUITES = ("kernels", "models", "dynamic")
DEFAULT_BACKENDS = "eager,inductor,tritonfuse"
DEFAULT_REPEAT = {"cpu": 15, "cuda": 50}


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
        bad, err = _compare_in_chunks(e.detach().reshape(-1), a.detach().reshape(-1), atol, rtol)
        max_err = max(max_err, err)
        if bad:
            return False, max_err, (f"output {i}: {bad} of {e.numel()} elements differ, "
                                    f"max abs error {err:.3g} (atol {atol:g}, rtol {rtol:g})")
    return True, max_err, ""


def _compare_in_chunks(e: torch.Tensor, a: torch.Tensor, atol: float, rtol: float,
                       chunk: int = 1 << 24) -> tuple[int, float]:
    """(elements not close, max abs error) of two flat tensors, in float64, a chunk at a
    time (a 16k x 16k output would otherwise need several GB of temporaries)."""
    bad, max_err = 0, 0.0
    for start in range(0, e.numel(), chunk):
        e64, a64 = e[start:start + chunk].double(), a[start:start + chunk].double()
        close = torch.isclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True)
        diff = (a64 - e64).abs().nan_to_num(nan=math.inf)
        both_nan = e64.isnan() & a64.isnan()
        max_err = max(max_err, float(diff.masked_fill(both_nan, 0).max()))
        bad += int((~close).sum())
    return bad, max_err


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


def compile_backend(workload: Workload, backend: str, inputs: tuple, expected: Any,
                    device: torch.device) -> tuple[Callable | None, Cell]:
    """Compile ``workload`` with ``backend`` and check its first result against eager.
    Returns (the compiled function, its cell so far) or (None, an error cell)."""
    atol, rtol = workload.tolerance
    try:
        if base_backend(backend) == "tritonfuse":
            import tritonfuse.metrics
            tritonfuse.metrics.reset()
        compiled = torch.compile(_fresh_function(workload.fn), backend=resolve_backend(backend))
        t0 = time.perf_counter()
        actual = compiled(*inputs)
        synchronize(device)
        compile_s = time.perf_counter() - t0
        metrics = tritonfuse_metrics() if base_backend(backend) == "tritonfuse" else {}
        ok, max_err, why = compare(expected, actual, atol, rtol)
        del actual
    except Exception as exc:
        return None, Cell(backend, "error", message=short_error(exc), traceback=traceback.format_exc())
    return compiled, Cell(backend, "ok" if ok else "FAIL", compile_s=compile_s, max_abs_err=max_err,
                          message=why, metrics=metrics)


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
        cells[backend] = Cell(backend, "error", message=short_error(exc),
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
    return pairs + inductor_pairs(backends)


def summarize(results: list[dict], backends: list[str]) -> dict:
    summary = {}
    for base, b in ratio_columns(backends):
        ratios = [r for r in (speedup(res, base, b) for res in results) if r is not None]
        summary[f"{b}_vs_{base}"] = {"geomean": geomean(ratios), "workloads": len(ratios)}
    return summary


def render_markdown(report: dict) -> str:
    backends, results, summary = report["backends"], report["results"], report["summary"]
    info = report["machine"]
    pairs = ratio_columns(backends)
    notes = Notes()

    def time_cell(cell: dict) -> str:
        if cell["status"] in ("error", "skipped"):
            return f"{cell['status']} {notes.ref(cell['backend'] + ': ' + cell['message'])}"
        if cell["status"] == "FAIL":
            return f"FAIL {fmt(cell['ms'])}"
        return fmt(cell["ms"])

    header = (["workload", "size"] + [f"{b} ms" for b in backends] + [f"{b} GB/s" for b in backends]
              + [f"{b} vs {base}" for base, b in pairs] + ["check"])
    rows = []
    for res in results:
        cells = res["cells"]
        row = [res["workload"], res["size"]]
        row += [time_cell(cells[b]) for b in backends]
        row += [fmt(cells[b]["gbps"], 1) if cells[b]["gbps"] else "-" for b in backends]
        for base, b in pairs:
            ratio = speedup(res, base, b)
            row.append("-" if ratio is None else fmt(ratio, 2) + "x")
        checks = []
        for b in backends:
            if b == "eager":
                continue
            c = cells[b]
            if c["status"] == "FAIL":
                ref = notes.ref(f"{b} on {res['workload']} is WRONG: {c['message']}")
                checks.append(f"{b} FAIL {ref}")
            else:
                checks.append(f"{b} {c['status']}")
        row.append(", ".join(checks) or "reference")
        rows.append(row)
    geo_row = ["geomean", ""] + [""] * (2 * len(backends))
    for base, b in pairs:
        s = summary[f"{b}_vs_{base}"]
        geo_row.append(f"{fmt(s['geomean'], 2)}x (n={s['workloads']})" if s["geomean"] else "-")
    geo_row.append("")
    rows.append(geo_row)

    lines = [f"# Benchmark: {', '.join(backends)} on {info['device_name']}", ""]
    lines.append(machine_line(info, report["timing"]))
    lines.append("")
    lines.append("Times in ms (lower is better); \"X vs Y\" = Y_ms / X_ms (above 1: X is faster); "
                 "GB/s of ideal traffic (inputs read once, outputs written once). Geomeans use "
                 "only workloads where both backends ran and matched eager.")
    lines.append("")
    lines += markdown_table(header, rows, align_right_from=2)
    lines += notes.lines()

    compiled = [b for b in backends if b != "eager"]
    if compiled:
        lines += ["", "## Compile time (s, first call) and max abs error vs eager", ""]
        header2 = ["workload"] + [f"{b} compile s" for b in compiled] + [f"{b} max err" for b in compiled]
        ours = [b for b in compiled if base_backend(b) == "tritonfuse"]
        for b in ours:
            header2 += [f"{b} kernels", f"{b} fallbacks"]
        rows2 = []
        for res in results:
            cells = res["cells"]
            row = [res["workload"]]
            row += [fmt(cells[b]["compile_s"], 2) for b in compiled]
            row += [f"{cells[b]['max_abs_err']:.2g}" if cells[b]["max_abs_err"] is not None else "-"
                    for b in compiled]
            for b in ours:
                m = cells[b]["metrics"]
                row.append(str(m.get("generated_kernel_count", "-")))
                row.append(", ".join(m.get("fallbacks", {})) or "-")
            rows2.append(row)
        lines += markdown_table(header2, rows2, align_right_from=1)
    return "\n".join(lines) + "\n"


def _cell_bars(results: list[dict], backend: str, value) -> list[Bar]:
    """One bar per workload for ``backend``: ``value(result, cell)``, hatched when the
    result was wrong, the cell's status written instead when it did not run."""
    bars = []
    for res in results:
        cell = res["cells"][backend]
        if cell["status"] in ("ok", "FAIL") and cell["ms"]:
            bars.append(Bar(value(res, cell), wrong=cell["status"] == "FAIL"))
        else:
            bars.append(Bar(None, cell["status"]))
    return bars


def write_png(report: dict, path: Path) -> str:
    """Bar charts, log scale: speed-ups vs eager per compiled backend (with geomeans), and
    GB/s of ideal traffic per backend. Returns a note for the user ("" when written)."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB.format(name=path.name)
    results, backends = report["results"], report["backends"]
    compiled = [b for b in backends if b != "eager"]
    labels = [r["workload"] for r in results]
    colors = {b: f"C{i}" for i, b in enumerate(backends)}  # one colour per backend, both panels
    panels = 2 if compiled else 1
    fig, axes = plt.subplots(panels, 1, squeeze=False,
                             figsize=(max(8.0, 0.45 * (len(labels) + 1) * len(backends)), 4.5 * panels))
    if compiled:
        ax = axes[0][0]
        series = {}
        for b in compiled:
            geo = report["summary"].get(f"{b}_vs_eager", {}).get("geomean")
            series[b] = _cell_bars(results, b, lambda res, cell: res["cells"]["eager"]["ms"] / cell["ms"])
            series[b].append(Bar(geo))
        grouped_bars(ax, labels + ["geomean"], series, colors, base=1.0)
        ax.set_ylabel("speed-up vs eager\n(eager_ms / backend_ms)")
        ax.set_title(f"{report['machine']['device_name']} ({report['device']}); "
                     "hatched red: wrong result")
    series = {b: _cell_bars(results, b, lambda res, cell: cell["gbps"]) for b in backends}
    grouped_bars(axes[-1][0], labels, series, colors)
    axes[-1][0].set_ylabel("GB/s of ideal traffic")
    return save_figure(fig, path)


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=SUITES, default="kernels",
                   help="kernels (default): the single-kernel workloads below; models: real "
                        "models (scripts/bench_models.py, see --suite models --help); dynamic: "
                        "one model over many sequence lengths (scripts/bench_dynamic.py)")
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


def _suite_of(argv: list[str]) -> tuple[str, list[str]]:
    """The --suite of a command line, and the command line without it."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--suite", choices=SUITES, default="kernels")
    known, rest = pre.parse_known_args(argv)
    return known.suite, rest


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--sweep" in argv:   # the shape sweep of the CPU workloads (scripts/bench_sweep.py)
        from scripts import bench_sweep
        return bench_sweep.main([a for a in argv if a != "--sweep"])
    suite, rest = _suite_of(argv)
    if suite == "models":
        from scripts import bench_models
        return bench_models.main(rest)
    if suite == "dynamic":
        from scripts import bench_dynamic
        return bench_dynamic.main(rest)
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
            resolve_backend(b)
        except BackendUnavailable as exc:
            unavailable[b] = str(exc)
            print(f"NOTE: backend {b!r} is skipped: {exc}", file=sys.stderr)

    timing = (f"CUDA events, L2 flushed, {args.stat} of {repeat}" if device.type == "cuda"
              else f"perf_counter loops >= {MIN_CPU_SAMPLE_S * 1e3:.0f} ms, {args.stat} of {repeat}")
    info = machine_info(device)
    print(f"bench: {len(workloads)} workloads x {backends} on {device.type} "
          f"({info['device_name']}); {timing}")
    warn_if_busy(info)
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

    info["load_avg_end"] = load_average()
    report = {"machine": info, "device": device.type, "backends": backends, "repeat": repeat,
              "timing": timing, "wall_s": round(time.perf_counter() - started, 1),
              "results": results, "summary": summarize(results, backends)}
    write_report(report, Path(args.out), "bench", render_markdown(report), write_png)

    bad = [(r["workload"], b, c["status"]) for r in results for b, c in r["cells"].items()
           if c["status"] in ("FAIL", "error")]
    if bad:
        print("NOT CLEAN: " + "; ".join(f"{b} {s} on {w}" for w, b, s in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
