"""Data-parallel training on 2 ranks: DDP and FSDP2, compiled whole, tritonfuse vs Inductor.

    python scripts/bench_ddp.py --device cuda                    # 2 GPUs, NCCL
    python scripts/bench_ddp.py --device cpu --small             # 2 CPU ranks, gloo

The case of issue 16: HF GPT-2 (n_embd 768, 4 layers, 12 heads, FFN 3072, vocab 32000 as
scripts/model_zoo.py's text models, dropout 0) in bf16, 8x512 tokens per rank, AdamW.

  ddp    DistributedDataParallel (25 MB buckets; 1 MB with --small), then
         ``torch.compile(ddp_model)``: Dynamo's DDPOptimizer splits the graph at bucket
         boundaries, so one step runs several forward and backward graphs
  fsdp2  ``fully_shard`` on each block and on the root, then ``torch.compile(model)``

Each (wrap, backend) cell runs in a fresh launcher process (scripts/bench_runner.py: fresh
TRITONFUSE / Inductor / Triton caches, a time limit, killed with all it started), which
spawns the 2 ranks (torch.multiprocessing, spawn). Every rank builds the same weights and
trains on its own fixed batch: a first step (compile included: "first call"), 2 warm-up
steps, then --steps timed steps back to back (CUDA events between steps, or perf_counter;
median). Rank 0's loss after the last step is checked against eager's (bf16: 2% relative).
For tritonfuse the report gives, per rank, ``metrics.eager_graphs`` (graphs it failed to
compile and ran eagerly) with the logged reasons, the fallback ops and the kernels.

A failing cell writes its error into the table; the run goes on. Writes
ddp_<device>[_small].json and .md to --out (default docs/results/).
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):   # `python scripts/bench_ddp.py`: import the repo's scripts package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts import bench_common  # noqa: E402  (sets TORCHINDUCTOR_COMPILE_THREADS=1: see _rank_main)
from scripts.bench_common import fmt, fmt_ratio, markdown_table  # noqa: E402
from scripts.bench_runner import Job, Runner, worker_main  # noqa: E402

import torch  # noqa: E402

WRAPS = ("ddp", "fsdp2")
# (hidden, heads, FFN, layers, vocab), tokens (batch, length) per rank, DDP bucket MB
CONFIGS = {
    "full": dict(hidden=768, heads=12, ffn=3072, layers=4, vocab=32000, batch=8, length=512, bucket_mb=25),
    "small": dict(hidden=128, heads=4, ffn=512, layers=4, vocab=2048, batch=2, length=64, bucket_mb=1),
}
WARMUP_STEPS = 2
LOSS_RTOL = {"bfloat16": 2e-2, "float32": 1e-3}
RANKS = 2
RANK_TIMEOUT_S = 600        # collectives give up after this (the cell's limit is shorter)


# ----------------------------------------------------------------------------------------
# One rank
# ----------------------------------------------------------------------------------------


def _build_gpt2(cfg: dict) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=cfg["vocab"], n_positions=max(1024, cfg["length"]), n_embd=cfg["hidden"],
        n_layer=cfg["layers"], n_head=cfg["heads"], n_inner=cfg["ffn"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, use_cache=False))


def _wrap(model: torch.nn.Module, wrap: str, device: torch.device, bucket_mb: float) -> torch.nn.Module:
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       bucket_cap_mb=bucket_mb)
    try:
        from torch.distributed.fsdp import fully_shard   # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


class _EagerGraphLog(logging.Handler):
    """Keeps tritonfuse's warnings about graphs that run eagerly (their reasons)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record):
        message = record.getMessage()
        if "eagerly" in message:
            self.reasons.append(message[:500])


def _tritonfuse_counts(log: _EagerGraphLog) -> dict:
    snapshot = bench_common.tritonfuse_metrics()
    return {"eager_graphs": snapshot.get("eager_graphs", 0),
            "eager_graph_reasons": snapshot.get("eager_graph_reasons") or log.reasons,
            "fallbacks": snapshot.get("fallbacks", {}),
            "kernels": snapshot.get("generated_kernel_count", 0)}


def _inductor_counts() -> dict:
    try:
        from torch._inductor import metrics
        return {"kernels": metrics.generated_kernel_count}
    except Exception:
        return {}


def _train(rank: int, params: dict, device: torch.device) -> dict:
    """The rank's first, warm-up and timed steps; what it measured."""
    from scripts.bench_common import resolve_backend
    cfg, backend = params["config"], params["backend"]
    dtype = getattr(torch, params["dtype"])
    log = _EagerGraphLog()
    logging.getLogger("tritonfuse").addHandler(log)
    torch.manual_seed(0)
    model = _build_gpt2(cfg).to(device, dtype)
    model = _wrap(model, params["wrap"], device, cfg["bucket_mb"])
    step_model = model if backend == "eager" else torch.compile(model, backend=resolve_backend(backend))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["length"]), generator=generator).to(device)
    losses = []

    def step():
        loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    bench_common.synchronize(device)
    started = time.perf_counter()
    step()
    bench_common.synchronize(device)
    first_call_s = time.perf_counter() - started
    for _ in range(WARMUP_STEPS):
        step()
    step_ms = _timed_steps(step, params["steps"], device)
    result = {"first_call_s": first_call_s, "step_ms": step_ms,
              "losses": [float(loss) for loss in losses], "dynamo": _dynamo_counts()}
    if cuda:
        result["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    else:
        import resource
        result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    if bench_common.base_backend(backend) == "tritonfuse":
        result["tritonfuse"] = _tritonfuse_counts(log)
    elif bench_common.base_backend(backend) == "inductor":
        result["inductor"] = _inductor_counts()
    return result


def _dynamo_counts() -> dict:
    """Dynamo's graph breaks, and the graphs it handed to the backend after DDPOptimizer's
    split (each goes through aot_autograd: a forward and a backward graph compiled)."""
    from torch._dynamo.utils import counters
    return dict(bench_common.dynamo_counts(), graphs=counters["aot_autograd"]["total"])


def _timed_steps(step, count: int, device: torch.device) -> list[float]:
    """Milliseconds of each of ``count`` steps run back to back (CPU launches overlap the
    GPU as in training): CUDA events between steps on GPUs, perf_counter on the CPU."""
    if device.type != "cuda":
        marks = [time.perf_counter()]
        for _ in range(count):
            step()
            marks.append(time.perf_counter())
        return [1e3 * (b - a) for a, b in zip(marks, marks[1:])]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    events[0].record()
    for event in events[1:]:
        step()
        event.record()
    torch.cuda.synchronize(device)
    return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


def _rank_main(rank: int, params: dict, port: int, out_dir: str) -> None:
    """One rank (a spawned process): join the group, train, write rank<N>.json."""
    import torch.distributed as dist
    if params["inductor_default_threads"]:   # undo bench_common's setting (this module imported it)
        os.environ.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if params["threads"]:
        torch.set_num_threads(params["threads"])
    if params["device"] == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    out = Path(out_dir) / f"rank{rank}.json"
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
    try:
        result = _train(rank, params, device)
    except Exception as exc:
        out.write_text(json.dumps({"error": bench_common.short_error(exc), "traceback": traceback.format_exc()}))
        os._exit(1)   # no collective teardown: the other rank may be stuck in one
    out.write_text(json.dumps(result))
    dist.destroy_process_group()


# ----------------------------------------------------------------------------------------
# The launcher: one process per cell, run by scripts/bench_runner.py
# ----------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare(params: dict) -> None:
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401


def _launch(params: dict, emit) -> None:
    """Spawn the ranks, wait for them (when one fails, torch ends the others) and emit
    what each one wrote."""
    import torch.multiprocessing as mp
    out_dir = tempfile.mkdtemp(prefix="bench-ddp-")
    context = mp.start_processes(_rank_main, args=(params, _free_port(), out_dir), nprocs=RANKS,
                                 join=False, start_method="spawn")
    failure = ""
    try:
        while not context.join(timeout=1):
            pass
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:   # torch ended the others
        failure = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else type(exc).__name__
    for process in context.processes:
        if process.is_alive():
            process.kill()
    ranks = []
    for rank in range(RANKS):
        path = Path(out_dir) / f"rank{rank}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else
                     {"error": f"exit code {context.processes[rank].exitcode} without a result ({failure})"})
    emit("ranks", ranks)
    shutil.rmtree(out_dir, ignore_errors=True)
    errors = [f"rank {r}: {result['error']}" for r, result in enumerate(ranks) if "error" in result]
    if errors:
        raise RuntimeError("; ".join(errors))


# ----------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------


def _median(values):
    return statistics.median(values) if values else None


def _summarize(ranks: list[dict]) -> dict:
    """The cell's figures: rank 0's, with the slowest rank's median step beside them."""
    ok = [r for r in ranks if "error" not in r]
    failed = {f"rank {n}": r.get("traceback", r["error"]) for n, r in enumerate(ranks) if "error" in r}
    if not ok:
        return {"rank_errors": failed} if failed else {}
    first = ranks[0] if "error" not in ranks[0] else ok[0]
    dynamo = first.get("dynamo", {})
    cell = {"first_call_s": max(r["first_call_s"] for r in ok), "step_ms": _median(first["step_ms"]),
            "step_ms_slowest_rank": max(_median(r["step_ms"]) for r in ok), "losses": first["losses"],
            "peak_memory_gb": max(r.get("peak_memory_gb", r.get("peak_rss_gb", 0)) for r in ok),
            "graphs": dynamo.get("graphs"), "graph_breaks": dynamo.get("graph_breaks")}
    if failed:
        cell["rank_errors"] = failed
    if "tritonfuse" in first:
        cell["eager_graphs_per_rank"] = [r["tritonfuse"]["eager_graphs"] for r in ok]
        cell["eager_graph_reasons"] = sorted({why for r in ok for why in r["tritonfuse"]["eager_graph_reasons"]})
        cell["fallbacks"] = first["tritonfuse"]["fallbacks"]
        cell["kernels"] = first["tritonfuse"]["kernels"]
    elif "inductor" in first:
        cell["kernels"] = first["inductor"].get("kernels")
    return cell


def _check_loss(cell: dict, eager: dict | None, dtype: str) -> None:
    if not eager or not cell.get("losses") or not eager.get("losses"):
        return
    got, want = cell["losses"][-1], eager["losses"][-1]
    cell["loss_diff"] = got - want
    cell["loss_ok"] = abs(got - want) <= LOSS_RTOL[dtype] * abs(want)


def _markdown(report: dict) -> str:
    s = report["settings"]
    cfg = s["config"]
    lines = [f"# DDP / FSDP2 on {RANKS} ranks ({report['machine']['device_name']}, {s['device']})", "",
             bench_common.machine_line(report["machine"], f"median of {s['steps']} steps back to back"), "",
             f"HF GPT-2: hidden {cfg['hidden']}, {cfg['layers']} layers, {cfg['heads']} heads, vocab {cfg['vocab']}, "
             f"{s['dtype']}, {cfg['batch']}x{cfg['length']} tokens per rank, AdamW; DDP buckets {cfg['bucket_mb']} MB. "
             f"First call: the first training step, compiles included (slowest rank). Step: rank 0's median "
             f"(slowest rank's in brackets). Loss: rank 0's after {s['steps'] + WARMUP_STEPS + 1} steps, "
             f"minus eager's (ok within {LOSS_RTOL[s['dtype']]:.0%}). Graphs: those Dynamo handed to the "
             "backend (DDP: split by DDPOptimizer at buckets), each compiled as a forward and a backward. Eager "
             "graphs: tritonfuse graphs that ran eagerly, per rank.", ""]
    header = ["wrap", "backend", "first call s", "step ms", "vs eager", "vs inductor", "peak GB", "loss diff",
              "graphs", "eager graphs", "fallbacks", "kernels"]
    rows, notes = [], bench_common.Notes()
    for key, cell in report["cells"].items():
        wrap, backend = key.split("/")
        if "error" in cell and not cell.get("step_ms"):
            rows.append([wrap, backend, notes.ref(f"{key}: {cell['error']}")] + ["-"] * (len(header) - 3))
            continue
        label = backend   # with a note when one rank measured and the other failed
        if "error" in cell:
            label += " " + notes.ref(f"{key}: {cell['error']}")
        eager = report["cells"].get(f"{wrap}/eager", {}).get("step_ms")
        inductor = report["cells"].get(f"{wrap}/inductor", {}).get("step_ms")
        loss = "-" if "loss_diff" not in cell else f"{cell['loss_diff']:+.4f}" + ("" if cell["loss_ok"] else " WRONG")
        eager_graphs = "-"
        if "eager_graphs_per_rank" in cell:
            eager_graphs = "/".join(str(n) for n in cell["eager_graphs_per_rank"])
            for why in cell["eager_graph_reasons"]:
                eager_graphs += " " + notes.ref(why)
        rows.append([wrap, label, fmt(cell["first_call_s"], 1),
                     f"{fmt(cell['step_ms'], 2)} ({fmt(cell['step_ms_slowest_rank'], 2)})",
                     fmt_ratio(eager / cell["step_ms"]) if eager else "-",
                     fmt_ratio(inductor / cell["step_ms"]) if inductor and backend != "inductor" else "-",
                     fmt(cell["peak_memory_gb"], 2), loss, str(cell.get("graphs", "-")), eager_graphs,
                     str(len(cell["fallbacks"])) if "fallbacks" in cell else "-", str(cell.get("kernels", "-"))])
    lines += markdown_table(header, rows, align_right_from=2)
    lines.append("")
    lines.append("vs eager / vs inductor: their step time over this row's (above 1: this row is faster).")
    lines += notes.lines()
    for key, cell in report["cells"].items():
        if cell.get("fallbacks"):
            lines += ["", f"Fallback ops of {key}: " + ", ".join(sorted(cell["fallbacks"]))]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------


def _run_cells(runner: Runner, jobs: list[Job], dtype: str) -> dict:
    """{"wrap/backend": the cell's figures (or its error)}, eager's loss checked against."""
    cells = {}
    for job, result in runner.run(jobs):
        cell = _summarize(result.values.get("ranks", []))
        if result.status != "ok":
            cell["error"] = f"{result.status}: {result.message}"
        _check_loss(cell, cells.get(f"{job.params['wrap']}/eager"), dtype)
        cells[job.key] = cell
        print(f"{job.key}: {result.status} in {result.wall_s:.0f} s "
              f"{ {k: v for k, v in cell.items() if k not in ('losses', 'fallbacks')} }", flush=True)
    return cells


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--wrap", choices=list(WRAPS) + ["both"], default="both")
    p.add_argument("--backends", default="eager,inductor,tritonfuse",
                   help="comma-separated; eager is the loss reference (default: eager,inductor,tritonfuse)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default cuda 20, cpu 3)")
    p.add_argument("--small", action="store_true", help="a tiny GPT-2 (hidden 128, 2x64 tokens): CPU-sized")
    p.add_argument("--dtype", choices=sorted(LOSS_RTOL), default="bfloat16")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in each rank (cpu default 1)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per cell (default cuda 200, cpu 900)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for the whole run (default cuda 470, cpu none; 0: none)")
    p.add_argument("--out", default=str(bench_common.REPO / "docs" / "results"))
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    if args.device == "cuda" and torch.cuda.device_count() < RANKS:
        raise SystemExit(f"--device cuda needs {RANKS} GPUs, found {torch.cuda.device_count()}")
    cuda = args.device == "cuda"
    wraps = list(WRAPS) if args.wrap == "both" else [args.wrap]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    backends.sort(key=lambda b: b != "eager")   # eager first: the loss reference
    params = {"device": args.device, "dtype": args.dtype, "config": CONFIGS["small" if args.small else "full"],
              "steps": args.steps or (20 if cuda else 3), "threads": args.threads or (None if cuda else 1),
              # first-call times on a GPU host: Inductor with its default parallel compile
              "inductor_default_threads": cuda and bench_common.INDUCTOR_THREADS_SET_HERE}
    limit = args.time_limit if args.time_limit is not None else (470 if cuda else 0)
    cache_root = Path(tempfile.mkdtemp(prefix="bench-ddp-caches-"))
    timeout = args.timeout or (200 if cuda else 900)
    jobs = [Job(f"{wrap}/{backend}", "scripts.bench_ddp", dict(params, wrap=wrap, backend=backend),
                cache_root / wrap / backend, timeout) for wrap in wraps for backend in backends]
    runner = Runner(cache_root / "workers", args.device, started, limit or None, prespawn=cuda)
    machine = bench_common.machine_info(torch.device(args.device))
    try:
        cells = _run_cells(runner, jobs, args.dtype)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    machine["load_avg_end"] = bench_common.load_average()
    report = {"settings": params, "wraps": wraps, "backends": backends, "machine": machine, "cells": cells,
              "wall_s": round(time.perf_counter() - started, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"ddp_{args.device}" + ("_small" if args.small else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    markdown = _markdown(report)
    (out / f"{stem}.md").write_text(markdown)
    print("\n" + markdown + f"\nwrote {out / stem}.json and .md (total {report['wall_s']} s)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        sys.exit(worker_main(sys.argv[1:], _prepare, _launch))
    sys.exit(main())
