#!/usr/bin/env python
"""Dynamic shapes: one model over many sequence lengths, eager, Inductor and tritonfuse.

    python scripts/bench.py --suite dynamic                  # best device, both steps
    python scripts/bench.py --suite dynamic --modes train    # one step (to split a run)
    python scripts/bench.py --suite dynamic --dynamic auto   # Dynamo's default instead
    python scripts/bench.py --suite dynamic --device cpu --lengths 16,24,32

Issue 17's measurement: an HF Llama built from a config (scripts/model_zoo.py
DYNAMIC_MODEL: hidden 768, 12 heads with 6 KV heads, FFN 3072, 2 layers, vocab 32000,
bf16 on GPUs; hidden 64 and float32 on the CPU; --model picks another text model of the
zoo, e.g. nn-lm, which needs no transformers), batch 4, over 10 sequence lengths (128 to
704 in steps of 64 on GPUs, 16 to 88 in steps of 8 on the CPU), for inference and for a
training step (forward, loss, backward).

The compiled backends get ``torch.compile(dynamic=True)`` (--dynamic true, the default):
one symbolic compile should serve every length, and a backend that compiles per shape
shows it. ``--dynamic auto`` gives Dynamo's default instead (a static compile for the
first length, then a symbolic recompile), as in the issue's table.

Per step and backend, one worker process with empty caches (scripts/bench_runner.py) runs:

  first pass   every length once, in order: the seconds of each first call (compiles and
               recompiles included); each result is checked against eager and a
               higher-precision reference (scripts/bench_accuracy.py); after each length,
               Dynamo's graphs compiled and recompiles so far, and tritonfuse's counters
  second pass  every length again, timed (CUDA events / perf_counter loops): the steady
               step time per length and its geomean over the lengths

With --together, one more worker per step compiles every backend in one process, runs the
first pass for each, then times every length with eager and the backends interleaved
(scripts/bench_common.py sample_interleaved): the per-length ratios of steps that are
host-bound on a GPU then compare the backends under the same host, which separate
processes (minutes apart, on a shared host) do not.

Eager runs in a worker of its own as the baseline. "compile s" is the first pass less
the steady step time of each length: the time spent compiling (and autotuning). The
counters: Dynamo graphs (every graph handed to the backend), recompiles, and tritonfuse's
symbolic_graphs, static_specializations, eager_graphs (graphs that ran eagerly) and
cpp_builds. The run has a time limit (--time-limit, default 330 s on GPUs: it ends within
6 minutes); a worker past it shows as timeout with the lengths it finished, later ones
as skipped. Writes dynamic.json, dynamic.md and dynamic.png to --out; exit status 0 when
every compiled result matched and every worker finished, 1 otherwise.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from scripts.bench_common import (dynamo_counts, load_average,  # noqa: E402
                                  pyplot, save_figure, NO_MATPLOTLIB,
                                  base_backend, host_and_device_ms, resolve_backend, sample_interleaved,
                                  synchronize, time_samples, tritonfuse_metrics,
                                  warn_if_busy, write_report)

import torch  # noqa: E402

from scripts import model_zoo  # noqa: E402
from scripts.bench_accuracy import (REFERENCE_DTYPE, compare_steps, exact_float32,  # noqa: E402
                                    run_step, step_callable)
from scripts.bench_dynamic_report import TOGETHER, render_markdown, summarize  # noqa: E402
from scripts.bench_runner import (Job, RunSettings, add_run_options,  # noqa: E402
                                  import_backend, worker_main)  # noqa: E402

DEFAULT_BACKENDS = "inductor,tritonfuse"
MODES = ("infer", "train")
LENGTHS = {"cuda": list(range(128, 705, 64)), "cpu": list(range(16, 89, 8))}
BATCH = 4
REPEAT = {("cuda", False): 20, ("cuda", True): 10, ("cpu", False): 5, ("cpu", True): 3}
TIMEOUT_S = {"cuda": 300, "cpu": 900}
# Steps per length timed behind a sleep kernel for their host and device times (CUDA).
DEVICE_SAMPLES = 5
# The default run ends within 6 minutes on a GPU (0: no limit).
TIME_LIMIT_S = {"cuda": 330, "cpu": 0}
# --dynamic: what torch.compile's dynamic= gets.
DYNAMIC = {"true": True, "auto": None}
# tritonfuse counters recorded after each length of the first pass.
COUNTERS = ("symbolic_graphs", "static_specializations", "eager_graphs", "cpp_builds",
            "generated_kernel_count")


# ----------------------------------------------------------------------------------------
# The worker: one (mode, backend) over every length
# ----------------------------------------------------------------------------------------


def _prepare(params: dict) -> None:
    if params.get("threads"):
        torch.set_num_threads(params["threads"])
    if model_zoo.text_model(params["model"]).hf:
        import transformers  # noqa: F401  (imported before the go: not part of any timing)
    if params["backend"] == TOGETHER:
        for backend in params["backends"]:
            import_backend(backend)
    elif params["backend"] != "eager":
        params["backend_import_s"] = import_backend(params["backend"])


def _work(params: dict, emit) -> None:
    if params["backend"] == TOGETHER:
        return _work_together(params, emit)
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    backend, mode, train = params["backend"], params["mode"], params["mode"] == "train"
    spec = model_zoo.text_model(params["model"])
    ref_dtype = None if backend == "eager" else REFERENCE_DTYPE[dtype]
    step, reference = model_zoo.make_step(spec, mode, device, dtype, reference_dtype=ref_dtype)
    emit("model", model_zoo.describe_model(step.model))
    call = step
    if backend != "eager":
        emit("backend_import_s", params["backend_import_s"])
        call = torch.compile(step, backend=resolve_backend(backend), dynamic=DYNAMIC[params["dynamic"]])
        if base_backend(backend) == "tritonfuse":
            import tritonfuse.metrics
            tritonfuse.metrics.reset()
    batches = {n: model_zoo.make_batch(spec, mode, device, dtype, batch=params["batch"],
                                       length=n, seed=n) for n in params["lengths"]}
    first_pass = []
    for n, batch in batches.items():
        actual, seconds = _first_call(step, call, batch, train, device)
        entry = {"length": n, "first_call_s": seconds}
        if reference is not None:
            with exact_float32():
                expected = run_step(reference, reference, model_zoo.cast_batch(batch, ref_dtype), train)
            check = compare_steps(actual, run_step(step, step, batch, train), expected, dtype)
            entry["check"] = {k: check[k] for k in ("ok", "output_err", "output_err_eager",
                                                    "grad_err", "grad_err_eager", "failures")}
        if backend != "eager":
            entry["dynamo"] = dynamo_counts()
        if base_backend(backend) == "tritonfuse":
            metrics = tritonfuse_metrics()
            entry["tritonfuse"] = {k: metrics.get(k) for k in COUNTERS}
        first_pass.append(entry)
        emit("first_pass", first_pass)
    emit("dynamo", dynamo_counts())
    if base_backend(backend) == "tritonfuse":
        emit("tritonfuse", tritonfuse_metrics())
    del reference
    second_pass = []
    with torch.no_grad() if not train else torch.enable_grad():
        for n, batch in batches.items():
            fn = step_callable(step, call, batch, train)
            samples = time_samples(fn, params["repeat"], device)
            entry = {"length": n, "ms": statistics.median(samples), "ms_min": min(samples),
                     "samples": len(samples)}
            if device.type == "cuda":
                # Steps this small are host-bound: the pipelined time follows the host and
                # moves between processes; the device time is what the kernels cost.
                entry["host_ms"], entry["device_ms"], _ = host_and_device_ms(fn, DEVICE_SAMPLES)
            second_pass.append(entry)
            emit("second_pass", second_pass)
    emit("dynamo_after_second_pass", dynamo_counts())


def _first_call(step, call, batch, train: bool, device) -> tuple:
    """(the step's result, its wall seconds), the device synchronized before and after."""
    synchronize(device)
    t0 = time.perf_counter()
    result = run_step(step, call, batch, train)
    synchronize(device)
    return result, time.perf_counter() - t0


def _work_together(params: dict, emit) -> None:
    """Every backend compiled in this one process over the lengths (its first pass), then
    each length timed with eager and every backend interleaved. Results were checked by
    the backends' own workers; this one only times."""
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    mode, train = params["mode"], params["mode"] == "train"
    spec = model_zoo.text_model(params["model"])
    step, _ = model_zoo.make_step(spec, mode, device, dtype)
    batches = {n: model_zoo.make_batch(spec, mode, device, dtype, batch=params["batch"], length=n, seed=n)
               for n in params["lengths"]}
    calls = {"eager": step}
    first_pass = {}
    with torch.no_grad() if not train else torch.enable_grad():
        for backend in params["backends"]:
            calls[backend] = torch.compile(step, backend=resolve_backend(backend),
                                           dynamic=DYNAMIC[params["dynamic"]])
            first_pass[backend] = []
            for n, batch in batches.items():
                _, seconds = _first_call(step, calls[backend], batch, train, device)
                first_pass[backend].append({"length": n, "first_call_s": seconds})
            emit("first_pass", first_pass)
        per_length = []
        for n, batch in batches.items():
            fns = {name: step_callable(step, call, batch, train) for name, call in calls.items()}
            samples, errors = sample_interleaved(fns, params["repeat"], device)
            per_length.append({"length": n, "ms": {name: statistics.median(v) for name, v in samples.items() if v},
                               "errors": {name: repr(exc)[:200] for name, exc in errors.items()}})
            emit("interleaved", per_length)


# ----------------------------------------------------------------------------------------
# The chart
# ----------------------------------------------------------------------------------------


def write_png(report: dict, path: Path) -> str:
    """Per step: first-call seconds per length, and steady step time per length."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB.format(name=path.name)
    modes = [m for m in report["modes"] if m in report["results"]]
    fig, axes = plt.subplots(len(modes), 2, squeeze=False, figsize=(12, 4.2 * len(modes)))
    for row, mode in zip(axes, modes):
        for backend, res in report["results"][mode].items():
            if backend == TOGETHER:   # its own table in the markdown
                continue
            first = res["values"].get("first_pass", [])
            steady = res["values"].get("second_pass", [])
            row[0].plot([e["length"] for e in first], [e["first_call_s"] for e in first],
                        marker="o", label=backend)
            row[1].plot([e["length"] for e in steady], [e["ms"] for e in steady],
                        marker="o", label=backend)
        row[0].set_yscale("log")
        row[0].set_ylabel(f"{mode}: first call per length, s")
        row[1].set_ylabel(f"{mode}: steady step, ms")
        for ax in row:
            ax.set_xlabel("sequence length")
            ax.legend(fontsize=8)
    axes[0][0].set_title(f"{report['machine']['device_name']} ({report['device']}), batch "
                         f"{report['batch']}: first pass")
    axes[0][1].set_title("second pass")
    return save_figure(fig, path)


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench.py --suite dynamic", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_options(p, DEFAULT_BACKENDS, TIMEOUT_S, TIME_LIMIT_S)
    p.add_argument("--model", default=model_zoo.DYNAMIC_MODEL.name,
                   help=f"the text model (default {model_zoo.DYNAMIC_MODEL.name}; nn-lm needs no "
                        "transformers)")
    p.add_argument("--modes", default=",".join(MODES), help="infer,train (default both)")
    p.add_argument("--dynamic", choices=list(DYNAMIC), default="true",
                   help="torch.compile(dynamic=True) for the compiled backends (true, default), "
                        "or Dynamo's default, static first (auto)")
    p.add_argument("--lengths", default=None,
                   help="comma-separated sequence lengths (default cuda 128..704 step 64, "
                        "cpu 16..88 step 8; --quick: every other one)")
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--together", action="store_true",
                   help="one more worker per step: every backend in one process, each length timed "
                        "interleaved (the same host for all: see the suite's text)")
    return p.parse_args(argv)


def _model_text(spec, results: dict) -> str:
    """"llama-gqa (HF LlamaForCausalLM, 60.6 M parameters)", from what a worker reported."""
    for per_backend in results.values():
        for res in per_backend.values():
            found = res["values"].get("model")
            if found:
                return f"{spec.name} ({found['impl']} {found['class']}, {found['params_m']} M parameters)"
    return spec.name


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    try:
        spec = model_zoo.text_model(args.model)
    except ValueError as exc:
        raise SystemExit(f"--model: {exc}")
    missing = model_zoo.transformers_missing() if spec.hf else None
    if missing:
        print(f"--model {spec.name} needs transformers: {missing}", file=sys.stderr)
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes: choose from {MODES}")
    run = RunSettings.from_args(args, started, REPEAT, TIMEOUT_S, TIME_LIMIT_S)
    kind = run.device.type
    backends = ["eager"] + run.backends
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else LENGTHS[kind]
    if args.quick and not args.lengths:
        lengths = lengths[::2]
    jobs = []
    for mode in modes:
        for backend in backends:
            name = f"{mode}/{backend.replace(':', '.')}"
            params = {"model": spec.name, "mode": mode, "backend": backend, "batch": args.batch,
                      "lengths": lengths, "dynamic": args.dynamic, **run.params()}
            jobs.append(Job(name, "scripts.bench_dynamic", params,
                            run.cache_root / "caches" / name.replace("/", "_"), run.timeout_s))
        if args.together:
            name = f"{mode}/{TOGETHER}"
            params = {"model": spec.name, "mode": mode, "backend": TOGETHER, "backends": run.backends,
                      "batch": args.batch, "lengths": lengths, "dynamic": args.dynamic, **run.params()}
            jobs.append(Job(name, "scripts.bench_dynamic", params,
                            run.cache_root / "caches" / name.replace("/", "_"), run.timeout_s))
    print(f"dynamic suite: {spec.name}, {modes} x {backends}, dynamic={args.dynamic}, batch "
          f"{args.batch}, lengths {lengths} on {kind} ({run.info['device_name']}), "
          f"{run.limits_text()}", flush=True)
    warn_if_busy(run.info)
    results: dict = {mode: {} for mode in modes}
    for i, (job, result) in enumerate(run.run(jobs), 1):
        first = result.values.get("first_pass", [])
        if job.params["backend"] == TOGETHER:
            first = [e for per_backend in first.values() for e in per_backend] if first else []
        results[job.params["mode"]][job.params["backend"]] = {
            "status": result.status, "message": result.message, "wall_s": round(result.wall_s, 1),
            "values": result.values}
        print(f"[{i}/{len(jobs)}] {job.key:24s} {result.status:8s} first pass "
              f"{sum(e['first_call_s'] for e in first):.1f} s over {len(first)} lengths"
              + (f"  {result.message}" if result.message else "")
              + f"  ({result.wall_s:.0f} s)", flush=True)
    run.info["load_avg_end"] = load_average()
    report = {"suite": "dynamic", "machine": run.info, "device": kind, "dtype": str(run.dtype),
              "model": _model_text(spec, results), "dynamic": args.dynamic,
              "batch": args.batch, "lengths": lengths, "backends": backends, "modes": modes,
              "repeat": run.repeat, "timing": run.timing, "timeout_s": run.timeout_s,
              "time_limit_s": run.time_limit_s, "wall_s": round(time.perf_counter() - started, 1),
              "results": results}
    report["summary"] = summarize(report)
    write_report(report, Path(args.out), "dynamic", render_markdown(report), write_png)
    bad = [f"{mode} {b}: {s['status']}" for mode, per in report["summary"].items()
           for b, s in per.items() if s["status"] != "ok"]
    if bad:
        print("NOT CLEAN: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[1:], _prepare, _work))
    sys.exit(main())
