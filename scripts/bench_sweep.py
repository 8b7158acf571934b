#!/usr/bin/env python
"""The shape sweep of the CPU bench: every workload over a grid of rows x cols, dtypes and
input layouts, eager vs Inductor vs tritonfuse side by side in one run.

    python scripts/bench.py --sweep                          # the whole grid (<= ~30 min, 2 cores)
    python scripts/bench.py --sweep --sweep-quick            # a few shapes, a few minutes
    python scripts/bench.py --sweep --sweep-workloads gelu,layer_norm --sweep-dtypes bf16
    python scripts/bench.py --sweep --sweep-set heldout --out /tmp/sweep

Each cell (workload, rows x cols, dtype, layout) runs through bench.py's machinery: eager
first as the reference, each compiled backend's first result checked against it with the
workload's tolerance for that dtype (a mismatch shows as FAIL), then all backends timed in
interleaved rounds. "transposed" layout: every (rows, cols) input is a transposed view of
a contiguous (cols, rows) tensor.

Two sets of cells: "tuned" (the grid that the C++ backend's loop forms were chosen on) and
"heldout" (workloads and shapes kept out of that tuning, reported separately, to show
whether the choices carry over). The report gives, per workload, its worst cell against
eager and against Inductor, and the geomean over the cells; --out writes sweep.md and
sweep.json. Exit status 1 when any cell is FAIL or error.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from scripts.bench_common import (BackendUnavailable, fmt, fmt_ratio, geomean,  # noqa: E402
                                  load_average, machine_info, machine_line, markdown_table,
                                  resolve_backend, warn_if_busy, write_report)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scripts import bench_common, models  # noqa: E402
from scripts.bench import run_workload, speedup  # noqa: E402
from scripts.models import Workload  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
LAYOUTS = ("contiguous", "transposed")
BACKENDS = ["eager", "inductor", "tritonfuse"]
# Tolerances per dtype (atol, rtol): a fused kernel keeps intermediates in f32 where eager
# rounds each one to the 16-bit type, so the 16-bit cells differ by a few of their ulps.
TOLERANCE = {"f32": (1e-4, 1e-4), "bf16": (6e-2, 3e-2), "f16": (1e-2, 1e-2)}
REPEAT = 7


# ----------------------------------------------------------------------------------------
# The workloads, as functions of (rows, cols, dtype, layout)
# ----------------------------------------------------------------------------------------


def gelu_mul(x, y):
    return F.gelu(x) * y


def silu_mul(x, y):
    return F.silu(x) * y


def bias_gelu_tanh(x, b):
    return F.gelu(x + b, approximate="tanh")


def rms_norm_f32_math(x, w):
    """LLaMA's RMSNorm: statistics in f32, the normalized row cast back, times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + models.RMS_EPS)
    return h.to(x.dtype) * w


def log_softmax_last(x):
    return torch.log_softmax(x, dim=-1)


def sigmoid_sum_dim0(x, y):
    return torch.sigmoid(torch.sum(x + y, dim=0))


def _matrix(rows, cols, dtype, layout, seed, scale=1.0):
    """A (rows, cols) input: contiguous, or a transposed view of a (cols, rows) tensor."""
    if layout == "transposed":
        return (models._randn((cols, rows), "cpu", torch.float32, seed) * scale).to(dtype).t()
    return (models._randn((rows, cols), "cpu", torch.float32, seed) * scale).to(dtype)


def _vector(cols, dtype, seed, base=0.0, scale=1.0):
    return (base + scale * models._randn((cols,), "cpu", torch.float32, seed)).to(dtype)


@dataclass(frozen=True)
class SweepWorkload:
    """A workload of the sweep: ``make(rows, cols, dtype, layout)`` -> inputs."""

    name: str
    fn: Callable
    make: Callable
    tolerance: dict | None = None   # per dtype short name; TOLERANCE otherwise

    def tolerance_for(self, dtype: str) -> tuple[float, float]:
        return (self.tolerance or {}).get(dtype, TOLERANCE[dtype])


def _pair(scale=1.0):
    return lambda r, c, dt, lay: (_matrix(r, c, dt, lay, 0, scale), _matrix(r, c, dt, lay, 1))


def _single(scale=1.0):
    return lambda r, c, dt, lay: (_matrix(r, c, dt, lay, 0, scale),)


def _norm(with_bias):
    def make(r, c, dt, lay):
        inputs = (_matrix(r, c, dt, lay, 0), _vector(c, dt, 1, base=1.0, scale=0.1))
        return inputs + ((_vector(c, dt, 2, scale=0.1),) if with_bias else ())
    return make


def _transposed_pair(r, c, dt, lay):
    """x.t() + y: x is (cols, rows); "transposed" gives x as a view, so x.t() is contiguous."""
    return (_matrix(c, r, dt, lay, 0), _matrix(r, c, dt, lay, 1))


def _cross_entropy(r, c, dt, lay):
    gen = torch.Generator().manual_seed(1)
    return (_matrix(r, c, dt, lay, 0, scale=2.0), torch.randint(0, c, (r,), generator=gen))


def _bias(r, c, dt, lay):
    return (_matrix(r, c, dt, lay, 0, scale=2.0), _vector(c, dt, 1, scale=0.5))


# Sums over many 16-bit values: eager accumulates in f32 too, but in a different order.
_SUM_TOL = {"f32": (1e-3, 1e-4), "bf16": (0.5, 3e-2), "f16": (0.25, 1e-2)}

TUNED_WORKLOADS = [
    # the four of issue 13
    SweepWorkload("gelu_mul", gelu_mul, _pair()),
    SweepWorkload("layer_norm", models.layer_norm, _norm(with_bias=True)),
    SweepWorkload("rms_norm_f32_math", rms_norm_f32_math, _norm(with_bias=False)),
    SweepWorkload("transpose_add", models.transpose_add, _transposed_pair),
    # the other CPU workloads of scripts/models.py, over 2-D shapes
    SweepWorkload("pointwise_chain", models.pointwise_chain, _pair()),
    SweepWorkload("softmax", models.softmax_last, _single(scale=3.0)),
    SweepWorkload("x_sub_softmax", models.sub_softmax, _single()),
    SweepWorkload("rms_norm", models.rms_norm, _norm(with_bias=False)),
    SweepWorkload("sigmoid_sum_dim0", sigmoid_sum_dim0, _pair(), tolerance=_SUM_TOL),
    SweepWorkload("column_sum", models.column_sum, _single(), tolerance=_SUM_TOL),
    SweepWorkload("cross_entropy", models.cross_entropy, _cross_entropy),
    SweepWorkload("var_mean", models.var_mean_last, _single()),
]
# Not used to choose anything in cpu_backend: they show whether the choices carry over.
HELDOUT_WORKLOADS = [
    SweepWorkload("silu_mul", silu_mul, _pair()),
    SweepWorkload("log_softmax", log_softmax_last, _single(scale=3.0)),
    SweepWorkload("bias_gelu_tanh", bias_gelu_tanh, _bias),
]

# (rows, cols). Powers of two, round non-powers, odd sizes; short and long rows. The grid
# is capped so that the whole sweep stays near 30 min on 2 cores: transposed inputs in f32
# only (unless --sweep-dtypes asks for others), shapes of 4096 x 4096 and more contiguous
# only, 16k x 16k (a minute a cell: 1 GB tensors) for the issue's four workloads in bf16.
TUNED_SHAPES = [(64, 64), (2048, 512), (1024, 1024), (513, 1531), (16384, 128), (4096, 4096),
                (16384, 16384)]
HELDOUT_SHAPES = [(777, 3001), (12288, 96)]
QUICK_SHAPES = [(2048, 512), (513, 1531)]
HELDOUT_WORKLOAD_SHAPES = [(64, 64), (2048, 512), (1000, 1000)]
LARGE = 4096 * 4096          # elements from which a shape runs contiguous only
HUGE = 16384 * 16384         # elements from which a shape runs for ISSUE_WORKLOADS in bf16 only
ISSUE_WORKLOADS = ("gelu_mul", "layer_norm", "rms_norm_f32_math", "transpose_add")


@dataclass(frozen=True)
class CellSpec:
    workload: SweepWorkload
    rows: int
    cols: int
    dtype: str
    layout: str
    set: str   # "tuned" | "heldout"

    @property
    def label(self) -> str:
        return f"{self.rows}x{self.cols} {self.dtype} {self.layout[:6]}"

    def as_workload(self) -> Workload:
        spec = self

        def make_inputs(device):
            torch.manual_seed(0)
            return tuple(t.to(device) if isinstance(t, torch.Tensor) else t
                         for t in spec.workload.make(spec.rows, spec.cols, DTYPES[spec.dtype], spec.layout))
        return Workload(f"{self.workload.name} {self.label}", self.workload.fn, make_inputs,
                        tolerance=self.workload.tolerance_for(self.dtype))


def _in_grid(workload, rows, cols, dtype, layout, all_dtypes_transposed) -> bool:
    if rows * cols >= HUGE and (dtype != "bf16" or workload not in ISSUE_WORKLOADS):
        return False
    if layout == "transposed" and not all_dtypes_transposed and dtype != "f32":
        return False
    return not (rows * cols >= LARGE and layout == "transposed")


def plan_cells(workload_filter: str | None = None, dtypes: list[str] | None = None,
               layouts: list[str] | None = None, quick: bool = False, which: str = "all",
               shapes: list[tuple[int, int]] | None = None, largest: float = float("inf")) -> list[CellSpec]:
    """The cells to run, in order: tuned set first, then held-out."""
    all_dtypes_transposed = dtypes is not None
    dtypes = dtypes or list(DTYPES)
    layouts = layouts or list(LAYOUTS)
    wanted = [f.strip() for f in (workload_filter or "").split(",") if f.strip()]
    sets = []
    if which in ("all", "tuned"):
        sets.append(("tuned", TUNED_WORKLOADS, shapes or (QUICK_SHAPES if quick else TUNED_SHAPES)))
    if which in ("all", "heldout"):
        # held-out shapes on every workload (not in a quick run), held-out workloads on
        # tuned shapes too
        if shapes or not quick:
            sets.append(("heldout", TUNED_WORKLOADS + HELDOUT_WORKLOADS, shapes or HELDOUT_SHAPES))
        if not shapes:
            sets.append(("heldout", HELDOUT_WORKLOADS, QUICK_SHAPES if quick else HELDOUT_WORKLOAD_SHAPES))
    cells = []
    for name, workloads, shape_list in sets:
        for w in workloads:
            if wanted and not any(f in w.name for f in wanted):
                continue
            for rows, cols in shape_list:
                for dtype in dtypes:
                    for layout in layouts:
                        if rows * cols > largest:
                            continue
                        if shapes or _in_grid(w.name, rows, cols, dtype, layout, all_dtypes_transposed):
                            cells.append(CellSpec(w, rows, cols, dtype, layout, name))
    return cells


# ----------------------------------------------------------------------------------------
# Running and summarizing
# ----------------------------------------------------------------------------------------


def run_cells(cells: list[CellSpec], backends: list[str], repeat: int, stat: str,
              unavailable: dict[str, str], log=print) -> list[dict]:
    results = []
    with torch.no_grad():
        for i, spec in enumerate(cells, 1):
            t0 = time.perf_counter()
            res = run_workload(spec.as_workload(), torch.device("cpu"), backends, repeat, stat, unavailable)
            res.update(workload=spec.workload.name, shape=[spec.rows, spec.cols], dtype=spec.dtype,
                       layout=spec.layout, set=spec.set)
            results.append(res)
            parts = []
            for b in backends:
                c = res["cells"][b]
                parts.append(f"{b} {c['ms']:.3f}" if c["ms"] else f"{b} {c['status']}")
                if c["status"] not in ("ok", "skipped"):
                    parts[-1] += f" {c['status']}"
            ratios = [f"{b}/{base} {fmt_ratio(speedup(res, base, b))}" for base, b in _pairs(backends)]
            log(f"[{i:3d}/{len(cells)}] {spec.set:7s} {spec.workload.name:18s} {spec.label:26s} "
                + " | ".join(parts) + "  " + " ".join(ratios) + f"  ({time.perf_counter() - t0:.1f} s)",
                flush=True)
    return results


def _pairs(backends: list[str]) -> list[tuple[str, str]]:
    pairs = [("eager", b) for b in backends if b != "eager"]
    if "tritonfuse" in backends and "inductor" in backends:
        pairs.append(("inductor", "tritonfuse"))
    return pairs


def summarize(results: list[dict], backends: list[str]) -> dict:
    """Per set, per workload: the worst cell and the geomean of each ratio; and per set
    the geomean over all its cells."""
    summary = {}
    for set_name in dict.fromkeys(r["set"] for r in results):
        in_set = [r for r in results if r["set"] == set_name]
        per_workload = {}
        for name in dict.fromkeys(r["workload"] for r in in_set):
            mine = [r for r in in_set if r["workload"] == name]
            entry = {"cells": len(mine)}
            for base, b in _pairs(backends):
                ratios = [(speedup(r, base, b), r) for r in mine]
                ratios = [(v, r) for v, r in ratios if v is not None]
                if not ratios:
                    continue
                worst, cell = min(ratios, key=lambda vr: vr[0])
                entry[f"{b}_vs_{base}"] = {
                    "worst": worst, "worst_cell": _cell_label(cell),
                    "geomean": geomean([v for v, _ in ratios]), "losing": sum(v < 1.0 for v, _ in ratios)}
            per_workload[name] = entry
        overall = {}
        for base, b in _pairs(backends):
            ratios = [v for v in (speedup(r, base, b) for r in in_set) if v is not None]
            overall[f"{b}_vs_{base}"] = {"geomean": geomean(ratios), "cells": len(ratios),
                                         "losing": sum(v < 1.0 for v in ratios),
                                         "worst": min(ratios) if ratios else None}
        summary[set_name] = {"workloads": per_workload, "overall": overall}
    return summary


def _cell_label(res: dict) -> str:
    return f"{res['shape'][0]}x{res['shape'][1]} {res['dtype']} {res['layout']}"


def render_markdown(report: dict) -> str:
    backends, results, summary = report["backends"], report["results"], report["summary"]
    pairs = _pairs(backends)
    lines = [f"# Shape sweep: {', '.join(backends)} on {report['machine']['device_name']}", "",
             machine_line(report["machine"], report["timing"]), "",
             "Ratios are times taken in one run: \"X vs Y\" = Y_ms / X_ms (above 1: X is faster). "
             "Every compiled result was checked against eager (FAIL = wrong result). "
             f"{len(results)} cells, {report['wall_s']} s.", ""]
    for set_name, entry in summary.items():
        lines += [f"## {set_name} set: worst cell per workload", ""]
        header = ["workload", "cells"]
        for base, b in pairs:
            header += [f"{b} vs {base}: worst", "at", "geomean", "losing"]
        rows = []
        for name, w in entry["workloads"].items():
            row = [name, str(w["cells"])]
            for base, b in pairs:
                r = w.get(f"{b}_vs_{base}")
                row += ([fmt_ratio(r["worst"]), r["worst_cell"], fmt_ratio(r["geomean"]), str(r["losing"])]
                        if r else ["-", "-", "-", "-"])
            rows.append(row)
        row = ["all", str(sum(w["cells"] for w in entry["workloads"].values()))]
        for base, b in pairs:
            o = entry["overall"][f"{b}_vs_{base}"]
            row += [fmt_ratio(o["worst"]), "", fmt_ratio(o["geomean"]), f"{o['losing']}/{o['cells']}"]
        rows.append(row)
        lines += markdown_table(header, rows, align_right_from=1) + [""]
    lines += ["## Every cell", ""]
    header = ["set", "workload", "shape", "dtype", "layout"] + [f"{b} ms" for b in backends] \
        + [f"{b} vs {base}" for base, b in pairs] + ["check"]
    rows = []
    for r in results:
        cells = r["cells"]
        row = [r["set"], r["workload"], f"{r['shape'][0]}x{r['shape'][1]}", r["dtype"], r["layout"]]
        row += [fmt(cells[b]["ms"]) if cells[b]["ms"] else cells[b]["status"] for b in backends]
        row += [fmt_ratio(speedup(r, base, b)) for base, b in pairs]
        bad = [f"{b} {cells[b]['status']}: {cells[b]['message']}" for b in backends
               if cells[b]["status"] not in ("ok", "skipped")]
        row.append("; ".join(bad) or "ok")
        rows.append(row)
    lines += markdown_table(header, rows, align_right_from=5)
    return "\n".join(lines) + "\n"


def print_summary(summary: dict, backends: list[str]) -> None:
    for set_name, entry in summary.items():
        print(f"\n{set_name} set: worst cell per workload")
        for name, w in entry["workloads"].items():
            parts = []
            for base, b in _pairs(backends):
                r = w.get(f"{b}_vs_{base}")
                if r:
                    parts.append(f"{b}/{base} worst {fmt_ratio(r['worst'])} at {r['worst_cell']}, "
                                 f"geomean {fmt_ratio(r['geomean'])}")
            print(f"  {name:18s} " + "; ".join(parts))
        for key, o in entry["overall"].items():
            print(f"  {set_name} geomean {key}: {fmt_ratio(o['geomean'])} over {o['cells']} cells, "
                  f"{o['losing']} below 1.0x, worst {fmt_ratio(o['worst'])}")


# ----------------------------------------------------------------------------------------
# Command line (reached through `bench.py --sweep`)
# ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.py --sweep", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep-workloads", default=None,
                   help="comma-separated substrings of workload names (default: all)")
    p.add_argument("--sweep-dtypes", default=None, help="comma-separated of f32,bf16,f16 (default: all)")
    p.add_argument("--sweep-layouts", default=None,
                   help="comma-separated of contiguous,transposed (default: both)")
    p.add_argument("--sweep-quick", action="store_true", help="a few shapes only (minutes, not half an hour)")
    p.add_argument("--sweep-set", choices=["all", "tuned", "heldout"], default="all",
                   help="the tuned grid, the held-out cells, or both (default)")
    p.add_argument("--sweep-largest", type=float, default=float("inf"),
                   help="skip shapes of more elements than this (e.g. 4e6: no 4096x4096 and up)")
    p.add_argument("--sweep-shapes", default=None,
                   help="RxC,RxC,... instead of the grid (every dtype and layout for each)")
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help="comma-separated backends (eager always runs as the reference)")
    p.add_argument("--repeat", type=int, default=REPEAT, help=f"timed rounds per cell (default {REPEAT})")
    p.add_argument("--stat", choices=["median", "min"], default="median")
    p.add_argument("--sample-ms", type=float, default=None,
                   help="length of one timed loop of calls (default 10 ms); on a busy machine "
                        "1 ms loops with --stat min and --repeat 40 find quiet windows more often")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N)")
    p.add_argument("--out", default="bench_results", help="folder for sweep.md and sweep.json")
    p.add_argument("--list", action="store_true", help="list the cells and exit")
    return p.parse_args(argv)


def _split(text: str | None, allowed) -> list[str] | None:
    if not text:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in items if t not in allowed]
    if unknown:
        raise SystemExit(f"unknown {unknown}; choose from {list(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shapes = None
    if args.sweep_shapes:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.sweep_shapes.split(",")]
    cells = plan_cells(args.sweep_workloads, _split(args.sweep_dtypes, DTYPES),
                       _split(args.sweep_layouts, LAYOUTS), args.sweep_quick, args.sweep_set, shapes,
                       args.sweep_largest)
    if args.list or not cells:
        for spec in cells:
            print(f"{spec.set:7s} {spec.workload.name:18s} {spec.label}")
        if not cells:
            print("no cell matches the filters", file=sys.stderr)
            return 2
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sample_ms:
        bench_common.MIN_CPU_SAMPLE_S = args.sample_ms / 1e3
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "eager" not in backends:
        backends.insert(0, "eager")
    unavailable = {}
    for b in backends[1:]:
        try:
            resolve_backend(b)
        except BackendUnavailable as exc:
            unavailable[b] = str(exc)
    timing = (f"perf_counter loops >= {bench_common.MIN_CPU_SAMPLE_S * 1e3:g} ms, {args.stat} of <= {args.repeat} "
              "interleaved rounds")
    info = machine_info(torch.device("cpu"))
    print(f"sweep: {len(cells)} cells x {backends}; {timing}")
    warn_if_busy(info)
    started = time.perf_counter()
    results = run_cells(cells, backends, args.repeat, args.stat, unavailable)
    info["load_avg_end"] = load_average()
    report = {"machine": info, "device": "cpu", "backends": backends, "repeat": args.repeat,
              "timing": timing, "wall_s": round(time.perf_counter() - started, 1),
              "results": results, "summary": summarize(results, backends)}
    write_report(report, Path(args.out), "sweep", render_markdown(report),
                 lambda *_: "no chart for the sweep: sweep.md has the tables")
    print_summary(report["summary"], backends)
    bad = [r for r in results for c in r["cells"].values() if c["status"] in ("FAIL", "error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
