#!/usr/bin/env python
"""Real models, compiled whole: eager, Inductor and tritonfuse side by side in one run.

    python scripts/bench.py --suite models                       # main models, best device
    python scripts/bench.py --suite models --quick               # 3 models, fewer samples
    python scripts/bench.py --suite models --models held-out     # the models nobody tunes on
    python scripts/bench.py --suite models --models all --device cpu
    python scripts/bench.py --suite models --models gpt2,resnet --modes train --phases cold
    python scripts/bench.py --suite models --models t5,vit --time-limit 900

The models are in scripts/model_zoo.py (HF GPT-2, BERT, Llama, T5, ViT and a ResNet-18;
held out: DistilBERT, Pythia-style GPT-NeoX, Mistral-style, ConvNeXt), random weights,
bf16 on GPUs and float32 (much smaller) on the CPU. Two steps each: training (forward,
loss and backward; batch 8 x 512 tokens / 32 images on GPUs) and inference (batch 1 x 128
tokens / 1 image: latency).

Every (model, step, backend) runs in worker processes (scripts/bench_runner.py):

  cold  a fresh process with empty caches (tritonfuse's, its autotune cache, Inductor's,
        Triton's): builds the model, runs the step in a higher-precision reference and in
        eager, compiles it and times the first call (compile included; the backend's
        package import is not), checks it (scripts/bench_accuracy.py: loss / logits and
        every gradient, relative to the reference, against eager's own error), then times
        eager and the compiled step interleaved round by round (CUDA events or perf_counter
        loops, as the kernel suite) and, on GPUs, the peak memory of one step;
  warm  a second fresh process with the cold one's caches: the first call again, checked.

Jobs run model after model (cold, then warm). Each worker has a time limit (--timeout)
and the run one too (--time-limit, default 510 s on GPUs: the run ends within 9 minutes):
a worker that runs past its limit shows as "timeout" with whatever it had measured, one
that dies as "crashed", one that raises as "error", and jobs past the run's limit as
"skipped"; the run goes on, and prints the --models of what it skipped, to run next. A
warm job whose cold job did not finish is skipped. Speed-ups:
"X vs eager" = eager_ms / X_ms with eager timed in X's own process; "tritonfuse vs
inductor" = inductor_ms / tritonfuse_ms; "tritonfuse vs inductor (own eager)" = the ratio
of the two speed-ups over eager, each taken in its own process: on a host whose speed
varies from process to process (a shared VM), a host-bound step's cross-process ratio
measures the host as much as the compiler. Geomeans use rows where both ran and matched.

--phases together (after cold, or alone) adds one more process per (model, step): it
compiles the step with every backend, from the caches of their cold jobs, and times
eager and each compiled step interleaved in that one process. "tritonfuse vs inductor
(same process)" comes from it: on a host whose speed drifts from process to process and
minute to minute (the GPU VM: the same eager step ran 1.4-2.2 ms), the only ratio of
host-bound steps that measures the compilers and not the host.

Writes models.json, models.md and models.png to --out. Exit status 0 when every compiled
step ran and matched eager, 1 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from scripts.bench_common import (Bar, dynamo_counts, geomean, grouped_bars,  # noqa: E402
                                  load_average, pyplot, save_figure,
                                  NO_MATPLOTLIB, base_backend, inductor_pairs, resolve_backend, sample_interleaved,
                                  short_error, synchronize, tritonfuse_metrics, warn_if_busy, write_report)

import torch  # noqa: E402

from scripts import model_zoo  # noqa: E402
from scripts.bench_accuracy import (REFERENCE_DTYPE, compare_steps, exact_float32,  # noqa: E402
                                    run_step, step_callable)
from scripts.bench_runner import (CACHE_ENV, Job, RunSettings, add_run_options,  # noqa: E402
                                  import_backend, worker_main)  # noqa: E402
from scripts.bench_models_report import render_markdown, speedup_rows, summarize  # noqa: E402

DEFAULT_BACKENDS = "inductor,tritonfuse"
MODES = ("train", "infer")
PHASES = ("cold", "warm", "together")
DEFAULT_PHASES = "cold,warm"
# The cache variables (bench_runner.CACHE_ENV) that a "together" job takes from each
# backend's cold job: its own caches, and Triton's binaries from Inductor's.
TOGETHER_CACHES = {"tritonfuse": ("TRITONFUSE_CACHE_DIR", "TRITONFUSE_AUTOTUNE_CACHE_DIR"),
                   "inductor": ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
REPEAT = {("cuda", False): 30, ("cuda", True): 10, ("cpu", False): 10, ("cpu", True): 5}
TIMEOUT_S = {"cuda": 240, "cpu": 600}
# The default run ends within 9 minutes on a GPU (0: no limit).
TIME_LIMIT_S = {"cuda": 510, "cpu": 0}


# ----------------------------------------------------------------------------------------
# The worker: one (model, mode, backend, phase) in its own process
# ----------------------------------------------------------------------------------------


def _peak_mb(fn, device: torch.device) -> float:
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def _prepare(params: dict) -> None:
    if params.get("threads"):
        torch.set_num_threads(params["threads"])
    if model_zoo.MODELS_BY_NAME[params["model"]].hf:
        import transformers  # noqa: F401  (imported before the go: not part of any timing)
    params["backend_import_s"] = sum(import_backend(b) for b in params.get("backends") or [params["backend"]])


def _work(params: dict, emit) -> None:
    if params["phase"] == "together":
        return _work_together(params, emit)
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    spec, backend = model_zoo.MODELS_BY_NAME[params["model"]], params["backend"]
    train = params["mode"] == "train"
    emit("backend_import_s", params["backend_import_s"])
    ref_dtype = REFERENCE_DTYPE[dtype]
    step, reference = model_zoo.make_step(spec, params["mode"], device, dtype, reference_dtype=ref_dtype)
    emit("model", model_zoo.describe_model(step.model))
    batch = model_zoo.make_batch(spec, params["mode"], device, dtype)
    with contextlib.ExitStack() as stack:
        if not train:
            stack.enter_context(torch.no_grad())
        with exact_float32():
            expected = run_step(reference, reference, model_zoo.cast_batch(batch, ref_dtype), train)
        del reference
        eager = run_step(step, step, batch, train)
        compiled = torch.compile(step, backend=resolve_backend(backend))
        if base_backend(backend) == "tritonfuse":
            import tritonfuse.metrics
            tritonfuse.metrics.reset()
        actual, seconds = _timed(lambda: run_step(step, compiled, batch, train), device)
        emit("first_call_s", seconds)
        if base_backend(backend) == "tritonfuse":
            emit("tritonfuse", tritonfuse_metrics())
        emit("dynamo", dynamo_counts())
        emit("check", compare_steps(actual, eager, expected, dtype))
        del actual, eager, expected
        if params["phase"] == "cold":
            fns = {"eager": step_callable(step, step, batch, train),
                   backend: step_callable(step, compiled, batch, train)}
            samples = _time_steps(fns, params["repeat"], device, emit)
            if device.type == "cuda":
                emit("peak_mb", {name: _peak_mb(fn, device) for name, fn in fns.items()
                                 if name in samples})
    emit("max_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _work_together(params: dict, emit) -> None:
    """Every backend's compiled step and eager, timed interleaved in this one process
    (each backend's result was checked by its cold job, from the same caches)."""
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    spec, train = model_zoo.MODELS_BY_NAME[params["model"]], params["mode"] == "train"
    step, _ = model_zoo.make_step(spec, params["mode"], device, dtype)
    batch = model_zoo.make_batch(spec, params["mode"], device, dtype)
    fns = {"eager": step_callable(step, step, batch, train)}
    first_calls = {}
    with contextlib.ExitStack() as stack:
        if not train:
            stack.enter_context(torch.no_grad())
        for backend in params["backends"]:
            compiled = torch.compile(step, backend=resolve_backend(backend))
            fns[backend] = step_callable(step, compiled, batch, train)
            _, first_calls[backend] = _timed(fns[backend], device)
        emit("first_call_s", first_calls)
        _time_steps(fns, params["repeat"], device, emit)


def _timed(fn, device: torch.device):
    """(fn(), its wall seconds), the device synchronized before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - t0


def _time_steps(fns: dict, repeat: int, device: torch.device, emit) -> dict:
    """Times `fns` interleaved (sample_interleaved), emits their "ms" (and the errors of
    those that raised); returns the samples."""
    samples, errors = sample_interleaved(fns, repeat, device)
    emit("ms", {name: {"median": statistics.median(v), "min": min(v), "samples": len(v)}
                for name, v in samples.items()})
    if errors:
        emit("timing_errors", {name: short_error(exc) for name, exc in errors.items()})
    return samples


# ----------------------------------------------------------------------------------------
# The run: plan the jobs, run them, gather the rows
# ----------------------------------------------------------------------------------------


def plan_jobs(models, modes, phases, run: RunSettings) -> list[Job]:
    """Model after model: its cold jobs, then its warm ones (each after its cold job), so
    that a run cut short by its time limit has whole rows for the models it reached."""
    jobs = []
    for spec in models:
        for phase in ("cold", "warm"):
            if phase not in phases:
                continue
            for mode in modes:
                for backend in run.backends:
                    name = f"{spec.name}/{mode}/{backend.replace(':', '.')}"
                    params = {"model": spec.name, "mode": mode, "backend": backend,
                              "phase": phase, **run.params()}
                    after = f"{name}/cold" if phase == "warm" and "cold" in phases else None
                    jobs.append(Job(f"{name}/{phase}", "scripts.bench_models", params,
                                    _cache_dir(run, name), run.timeout_s, after))
        if "together" in phases and len(run.backends) > 1:
            jobs += [_together_job(spec, mode, "cold" in phases, run) for mode in modes]
    return jobs


def _cache_dir(run: RunSettings, name: str) -> Path:
    return run.cache_root / "caches" / name.replace("/", "_")


def _together_job(spec, mode: str, after_cold: bool, run: RunSettings) -> Job:
    """The job that times every backend in one process: after their cold jobs, from
    their caches (TOGETHER_CACHES), else cold in a folder of its own."""
    names = {b: f"{spec.name}/{mode}/{b.replace(':', '.')}" for b in run.backends}
    cache_dirs = {}
    for backend, name in reversed(names.items()):   # the first backend of a kind wins
        for var in TOGETHER_CACHES.get(base_backend(backend), ()) if after_cold else ():
            cache_dirs[var] = _cache_dir(run, name) / CACHE_ENV[var]
    params = {"model": spec.name, "mode": mode, "backend": "together", "backends": run.backends,
              "phase": "together", **run.params()}
    return Job(f"{spec.name}/{mode}/together", "scripts.bench_models", params,
               _cache_dir(run, f"{spec.name}/{mode}/together"), run.timeout_s,
               tuple(f"{name}/cold" for name in names.values()) if after_cold else None, cache_dirs)


def _median_of(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def gather_rows(models, modes, backends, device: torch.device, results: dict) -> list[dict]:
    """One row per (model, mode): every backend's cell, from its cold and warm jobs."""
    rows = []
    for spec in models:
        shapes = spec.shapes(device)
        for mode in modes:
            train = mode == "train"
            batch, length = ((shapes.train_batch, shapes.train_len) if train
                             else (shapes.infer_batch, shapes.infer_len))
            shape = f"{batch}x{length}" + ("px" if spec.inputs == "image" else "")
            row = {"model": spec.name, "group": spec.group, "mode": mode, "shape": shape,
                   "cells": {}, "eager": {}}
            eager_ms, eager_mb = [], []
            for backend in backends:
                cold = results.get((spec.name, mode, backend, "cold"))
                warm = results.get((spec.name, mode, backend, "warm"))
                cell = _cell(cold, warm, backend)
                row["cells"][backend] = cell
                if cell.get("eager_ms"):
                    eager_ms.append(cell["eager_ms"])
                if cell.get("eager_peak_mb"):
                    eager_mb.append(cell["eager_peak_mb"])
                if cold is not None and not row.get("impl"):
                    row["impl"] = cold.values.get("model")
            row["eager"] = {"ms": _median_of(eager_ms), "peak_mb": _median_of(eager_mb)}
            together = results.get((spec.name, mode, "together", "together"))
            if together is not None:
                row["together"] = _together_cell(together)
            rows.append(row)
    return rows


def _together_cell(result) -> dict:
    """The "together" job's results: status, ms per backend and eager (medians), and each
    backend's first call there (from the caches of its cold job)."""
    ms = result.values.get("ms", {})
    return {"status": result.status, "message": result.message, "out_of_time": result.out_of_time,
            "ms": {name: v["median"] for name, v in ms.items()},
            "first_call_s": result.values.get("first_call_s", {}),
            "timing_errors": result.values.get("timing_errors")}


def _cell(cold, warm, backend: str) -> dict:
    """A backend's results for one row. status: ok | FAIL (a wrong result, cold or warm) |
    error | timeout | crashed | skipped | not run."""
    if cold is None:
        return {"status": "not run", "message": ""}
    values = cold.values
    ms = values.get("ms", {})
    cell = {
        "status": cold.status, "message": cold.message, "wall_s": round(cold.wall_s, 1),
        "out_of_time": cold.out_of_time or (warm is not None and warm.out_of_time),
        "first_call_cold_s": values.get("first_call_s"),
        "ms": ms.get(backend, {}).get("median"), "ms_min": ms.get(backend, {}).get("min"),
        "eager_ms": ms.get("eager", {}).get("median"),
        "peak_mb": values.get("peak_mb", {}).get(backend),
        "eager_peak_mb": values.get("peak_mb", {}).get("eager"),
        "check": values.get("check"), "tritonfuse": values.get("tritonfuse"),
        "dynamo": values.get("dynamo"), "backend_import_s": values.get("backend_import_s"),
        "timing_errors": values.get("timing_errors"),
        "traceback": values.get("error", {}).get("traceback", ""),
    }
    if warm is not None:
        cell.update({"warm_status": warm.status, "warm_message": warm.message,
                     "first_call_warm_s": warm.values.get("first_call_s"),
                     "warm_check": warm.values.get("check"),
                     "tritonfuse_warm": warm.values.get("tritonfuse")})
    checks = [c for c in (cell["check"], cell.get("warm_check")) if c]
    if cell["status"] == "ok" and any(not c["ok"] for c in checks):
        cell["status"] = "FAIL"
        cell["message"] = "; ".join(f for c in checks for f in c["failures"][:2])
    if cell["status"] == "ok" and cell["ms"] is None:
        cell["status"] = "error"
        cell["message"] = "; ".join(f"{k}: {v}" for k, v in (cell["timing_errors"] or {}).items())
    return cell


# ----------------------------------------------------------------------------------------
# The chart
# ----------------------------------------------------------------------------------------


def write_png(report: dict, path: Path) -> str:
    """Speed-ups vs eager, tritonfuse vs Inductor (when both ran) and first-call seconds,
    per model and step (log scales)."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB.format(name=path.name)
    rows, backends = report["rows"], report["backends"]
    labels = [f"{'*' if r['group'] != 'main' else ''}{r['model']} {r['mode']}" for r in rows]
    colors = {b: f"C{i}" for i, b in enumerate(backends)}
    ratios = speedup_rows(rows, backends)
    panels = [("vs eager", [(b, "eager", b) for b in backends])]
    for inductor, ours in inductor_pairs(backends):
        panels.append((f"{ours} vs {inductor}", [(ours, inductor, ours)]))
    fig, axes = plt.subplots(len(panels) + 1, 1, squeeze=False,
                             figsize=(max(8.0, 0.5 * (len(labels) + 1) * len(backends)),
                                      4.2 * (len(panels) + 1)))
    for ax, (title, pairs) in zip(axes[:, 0], panels):
        series = {}
        for name, base, b in pairs:
            bars = [Bar(ratios[i].get((base, b)), label=row["cells"][b]["status"],
                        wrong=row["cells"][b]["status"] == "FAIL") for i, row in enumerate(rows)]
            found = [bar.value for bar in bars if bar.value]
            series[name] = bars + [Bar(geomean(found))]
        grouped_bars(ax, labels + ["geomean"], series, colors, base=1.0)
        ax.set_ylabel(f"speed-up {title}")
    ax = axes[-1][0]
    first = {f"{b} {phase}": [Bar(row["cells"][b].get(f"first_call_{phase}_s"))
                              for row in rows] for b in backends for phase in PHASES}
    phase_colors = {f"{b} {phase}": colors[b] if phase == "cold" else f"C{len(backends) + i}"
                    for i, b in enumerate(backends) for phase in PHASES}
    grouped_bars(ax, labels, first, phase_colors)
    ax.set_ylabel("first call, s (compile included)")
    axes[0][0].set_title(f"{report['machine']['device_name']} ({report['device']}); "
                         "* held-out; hatched red: wrong result")
    return save_figure(fig, path)


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench.py --suite models", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(p, DEFAULT_BACKENDS, TIMEOUT_S, TIME_LIMIT_S)
    p.add_argument("--models", default="main",
                   help="main (default), held-out, extra, all, or comma-separated model names: "
                        + ", ".join(m.name for m in model_zoo.MODELS)
                        + f"; --quick keeps {', '.join(model_zoo.QUICK)} of a group")
    p.add_argument("--modes", default=",".join(MODES), help="train,infer (default both)")
    p.add_argument("--phases", default=DEFAULT_PHASES,
                   help=f"of {','.join(PHASES)} (default {DEFAULT_PHASES}); warm needs cold; together: every "
                        "backend timed in one process (after cold, from its caches)")
    return p.parse_args(argv)


def _split(text: str, allowed) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise SystemExit(f"unknown {bad}; choose from {list(allowed)}")
    return items


def _choose_models(args) -> list:
    try:
        models = model_zoo.select_models(args.models, args.quick)
    except ValueError as exc:
        raise SystemExit(str(exc))
    missing = model_zoo.transformers_missing()
    if missing and any(m.hf for m in models):
        print(f"NOTE: {missing}: skipping {', '.join(m.name for m in models if m.hf)}",
              file=sys.stderr)
        models = [m for m in models if not m.hf]
        if not models:
            raise SystemExit("no model left to run")
    return models


def _unfinished_models(rows: list[dict]) -> list[str]:
    """The models with a job that the run's time limit skipped or cut short, in order."""
    names = []
    for row in rows:
        cells = list(row["cells"].values()) + [row.get("together") or {}]
        if any(c.get("out_of_time") for c in cells) and row["model"] not in names:
            names.append(row["model"])
    return names


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    models = _choose_models(args)
    modes, phases = _split(args.modes, MODES), _split(args.phases, PHASES)
    if "warm" in phases and "cold" not in phases:
        raise SystemExit("--phases: warm needs cold (a warm run uses the caches of a cold one)")
    run = RunSettings.from_args(args, started, REPEAT, TIMEOUT_S, TIME_LIMIT_S)
    if not run.backends:
        raise SystemExit("--backends: name at least one compiled backend (eager always runs)")
    jobs = plan_jobs(models, modes, phases, run)
    print(f"models suite: {len(models)} models x {modes} x {run.backends} x {phases} = {len(jobs)} "
          f"worker processes on {run.device.type} ({run.info['device_name']}), "
          f"{run.limits_text()}", flush=True)
    warn_if_busy(run.info)
    results = {}
    for i, (job, result) in enumerate(run.run(jobs), 1):
        p = job.params
        results[(p["model"], p["mode"], p["backend"], p["phase"])] = result
        first = result.values.get("first_call_s")
        first = ", ".join(f"{b} {s:.1f}" for b, s in first.items()) if isinstance(first, dict) else (
            first if first is None else round(first, 1))
        check = result.values.get("check") or {}
        print(f"[{i:3d}/{len(jobs)}] {job.key:38s} {result.status:8s} "
              f"first call {first} s"
              + ("" if check.get("ok", True) else " WRONG")
              + (f"  {result.message}" if result.message else "")
              + f"  ({result.wall_s:.0f} s)", flush=True)
    run.info["load_avg_end"] = load_average()
    rows = gather_rows(models, modes, run.backends, run.device, results)
    report = {"suite": "models", "machine": run.info, "device": run.device.type,
              "dtype": str(run.dtype), "backends": run.backends, "modes": modes, "phases": phases,
              "repeat": run.repeat, "timing": run.timing, "timeout_s": run.timeout_s,
              "time_limit_s": run.time_limit_s, "wall_s": round(time.perf_counter() - started, 1),
              "rows": rows, "summary": summarize(rows, run.backends),
              "unfinished_models": _unfinished_models(rows)}
    write_report(report, Path(args.out), "models", render_markdown(report), write_png)
    if report["unfinished_models"]:
        print("NOT ALL RUN (the run's time limit): run the rest with --models "
              + ",".join(report["unfinished_models"]))
    bad = [f"{r['model']} {r['mode']} {b}: {c['status']}" for r in rows
           for b, c in r["cells"].items() if c["status"] != "ok"]
    bad += [f"{r['model']} {r['mode']} {b} (warm): {c['warm_status']}" for r in rows
            for b, c in r["cells"].items()
            if c["status"] == "ok" and c.get("warm_status") not in (None, "ok")]
    bad += [f"{r['model']} {r['mode']} together: {r['together']['status']}" for r in rows
            if r.get("together") and r["together"]["status"] not in ("ok", "skipped")]
    if bad:
        print("NOT CLEAN: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[1:], _prepare, _work))
    sys.exit(main())
