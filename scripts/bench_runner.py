"""Worker processes for the model suites: one fresh process per measurement.

A first call is only "cold" in a process that has never compiled anything, with caches
nobody filled; it is "warm" in a new process that finds the caches of a cold one. So the
suites run each (model, mode, backend) in worker processes:

  * a Job names the worker's module (run as ``python -m <module> --worker <spec.json>``),
    its parameters, its cache folder and its time limit;
  * the worker gets cache folders of its own through the environment
    (TRITONFUSE_CACHE_DIR, TRITONFUSE_AUTOTUNE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR,
    TRITON_CACHE_DIR under the job's cache folder): a fresh folder makes a cold run, the
    folder of an earlier job a warm one;
  * it streams what it measured as JSON lines (``emit(key, value)``, the last value of a
    key wins), so a worker killed at its time limit still reports what it had;
  * the worker imports torch (and whatever ``prepare`` imports) and then waits for a "go"
    line on stdin. With ``prespawn`` (the default on GPUs, whose hosts have cores to
    spare) the runner starts the next worker while the current one runs, so its imports
    cost no wall time; on a small CPU machine that would disturb the timing, so workers
    start one after another there.

Runner.run also keeps the whole run within its time limit (counted from the start of the
suite's main(), with REPORT_RESERVE_S kept for writing the report): a job gets at most the time
left, and a job that cannot get MIN_JOB_S any more is skipped. A job can name another that
must have finished first (``after``: a warm run needs its cold run's caches); it is
skipped when that one did not finish.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from scripts.bench_common import INDUCTOR_THREADS_SET_HERE, REPO, short_error

CACHE_ENV = {
    "TRITONFUSE_CACHE_DIR": "tritonfuse",
    "TRITONFUSE_AUTOTUNE_CACHE_DIR": "autotune",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
}
# A job is not started with less time than this left before the run's time limit.
MIN_JOB_S = 20.0
# Seconds of the run's time limit kept for gathering and writing the report (PNG included).
REPORT_RESERVE_S = 15.0
LOG_TAIL_CHARS = 2000


@dataclass
class Job:
    key: str             # e.g. "gpt2/train/tritonfuse/cold"
    module: str          # the worker's module, e.g. "scripts.bench_models"
    params: dict         # what the worker is asked to do (JSON)
    cache_dir: Path      # its caches live under here
    timeout_s: float
    after: str | tuple[str, ...] | None = None  # keys of jobs that must have finished ok first
    # per cache variable (CACHE_ENV), a folder other than the one under cache_dir: the
    # caches of other jobs (a job that runs several backends uses each one's)
    cache_dirs: dict[str, Path] = field(default_factory=dict)


@dataclass
class JobResult:
    status: str          # ok | error | timeout | crashed | skipped
    values: dict = field(default_factory=dict)  # the worker's emitted values
    wall_s: float = 0.0
    message: str = ""
    out_of_time: bool = False  # skipped, or killed, for the run's time limit


def worker_env(cache_dir: Path, device_type: str, cache_dirs: dict[str, Path] | None = None) -> dict:
    env = dict(os.environ)
    for var, sub in CACHE_ENV.items():
        env[var] = str((cache_dirs or {}).get(var) or cache_dir / sub)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = "1"  # models are built from configs: never reach for a hub
    env["PYTHONUNBUFFERED"] = "1"
    if device_type == "cuda" and INDUCTOR_THREADS_SET_HERE:
        # first-call times on a GPU host: Inductor with its default parallel compile
        env.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
    return env


class _Worker:
    """One started worker process, waiting for its go."""

    def __init__(self, job: Job, work_dir: Path, device_type: str):
        self.job = job
        name = job.key.replace("/", "_")
        self.events = work_dir / f"{name}.events.jsonl"
        self.log = work_dir / f"{name}.log"
        spec = work_dir / f"{name}.spec.json"
        spec.write_text(json.dumps({"params": job.params, "events": str(self.events), "parent": os.getpid()}))
        self.events.write_text("")
        job.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", job.module, "--worker", str(spec)], cwd=REPO,
                env=worker_env(job.cache_dir, device_type, job.cache_dirs), stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, text=True)

    def go(self) -> None:
        self.started = time.perf_counter()
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass  # it died while importing: finish() reports it

    def kill(self) -> None:
        """Kill the worker and every process it started (its own session)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def finish(self, timeout_s: float, run_limit: bool) -> JobResult:
        """Wait for the worker at most ``timeout_s`` (``run_limit``: that is the time left
        to the run, not the worker's own limit) and read what it reported."""
        try:
            self.proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        self.kill()  # also ends what it left behind (compile workers)
        wall = time.perf_counter() - self.started
        values = read_events(self.events)
        log_tail = self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        if timed_out:
            why = "the run's time limit, --time-limit" if run_limit else "its limit, --timeout"
            return JobResult("timeout", values, wall, f"killed after {timeout_s:.0f} s ({why})",
                             out_of_time=run_limit)
        if "error" in values:
            return JobResult("error", values, wall, values["error"]["message"])
        if self.proc.returncode != 0 or "done" not in values:
            return JobResult("crashed", values, wall, _exit_text(self.proc.returncode, log_tail))
        return JobResult("ok", values, wall)


def _exit_text(returncode: int, log_tail: str) -> str:
    """"killed by SIGSEGV: <the log's last line>", "exit status 1: ..."."""
    if returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        how = f"exit status {returncode}"
    last = [line for line in log_tail.splitlines() if line.strip()][-1:]
    return f"{how}: {last[0][:200]}" if last else how


def read_events(path: Path) -> dict:
    values: dict = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        values[event["key"]] = event["value"]
    return values


class Runner:
    def __init__(self, work_dir: Path, device_type: str, started: float,
                 time_limit_s: float | None, prespawn: bool):
        """``started``: the perf_counter() at which the run's time limit began."""
        self.work_dir = work_dir
        self.device_type = device_type
        self.deadline = started + time_limit_s - REPORT_RESERVE_S if time_limit_s else None
        self.prespawn = prespawn
        work_dir.mkdir(parents=True, exist_ok=True)

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def _skip(self, job: Job, done: dict[str, JobResult]) -> JobResult | None:
        """A "skipped" result when ``job`` cannot start now, else None."""
        for after in (job.after,) if isinstance(job.after, str) else job.after or ():
            before = done.get(after)
            if before is None or before.status != "ok":
                status = before.status if before else "not run"
                return JobResult("skipped", message=f"{after} did not finish ({status})",
                                 out_of_time=before is not None and before.out_of_time)
        left = self.time_left()
        if left is not None and left < MIN_JOB_S:
            return JobResult("skipped", message="the run's time limit was reached (--time-limit)",
                             out_of_time=True)
        return None

    def run(self, jobs: list[Job]) -> Iterator[tuple[Job, JobResult]]:
        """Run the jobs one at a time, in order; yields each with its result."""
        done: dict[str, JobResult] = {}
        worker: _Worker | None = None
        waiting: _Worker | None = None
        try:
            for i, job in enumerate(jobs):
                worker, waiting = waiting, None
                skipped = self._skip(job, done)
                if skipped is not None:
                    if worker is not None:
                        worker.kill()
                    done[job.key] = skipped
                    yield job, skipped
                    continue
                worker = worker or _Worker(job, self.work_dir, self.device_type)
                worker.go()
                if self.prespawn and i + 1 < len(jobs):
                    waiting = _Worker(jobs[i + 1], self.work_dir, self.device_type)
                left = self.time_left()
                if left is not None and left < job.timeout_s:
                    result = worker.finish(left, run_limit=True)
                else:
                    result = worker.finish(job.timeout_s, run_limit=False)
                done[job.key] = result
                yield job, result
        finally:   # also on Ctrl-C or an error here: no worker outlives the run
            for left_over in (worker, waiting):
                if left_over is not None:
                    left_over.kill()


# ----------------------------------------------------------------------------------------
# The worker's side
# ----------------------------------------------------------------------------------------

Emit = Callable[[str, Any], None]


def _exit_with_parent(parent: int) -> None:
    """A worker runs in its own session (so that a kill takes its compile workers too), so
    nothing ends it when the run dies without killing it (SIGKILL, a crash): it watches
    for being handed to another parent (also while it was still starting) and exits then."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def worker_main(argv: list[str], prepare: Callable[[dict], None],
                work: Callable[[dict, Emit], None]) -> int:
    """Entry point of a worker: ``argv`` is ``["--worker", spec_path]``. Calls
    ``prepare(params)`` (imports), waits for the go, then ``work(params, emit)``."""
    spec = json.loads(Path(argv[1]).read_text())
    params = spec["params"]
    _exit_with_parent(spec["parent"])
    with open(spec["events"], "a") as events:
        def emit(key: str, value: Any) -> None:
            events.write(json.dumps({"key": key, "value": value}, default=str) + "\n")
            events.flush()

        try:
            prepare(params)
            sys.stdin.readline()
            work(params, emit)
        except Exception as exc:
            emit("error", {"message": short_error(exc), "traceback": traceback.format_exc()})
            return 1
        emit("done", True)
    return 0


def import_backend(name: str) -> float:
    """Import what the backend ``name`` compiles with, before any first call is timed, so
    that no backend's first call carries its package's import; returns the seconds taken."""
    from scripts.bench_common import base_backend, resolve_backend

    t0 = time.perf_counter()
    if base_backend(name) == "inductor":  # "tritonfuse" and "module:function" are imported when resolved
        import torch._inductor.compile_fx  # noqa: F401
    resolve_backend(name)
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------------------
# What the suites' command lines share
# ----------------------------------------------------------------------------------------


def add_run_options(p, default_backends: str, timeout_s: dict, time_limit_s: dict) -> None:
    """The options of a suite that runs workers: device, backends, samples, limits, output."""
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--backends", default=default_backends,
                   help=f"compiled backends (default {default_backends}); eager always runs as "
                        "the reference; 'package.module:function' names a backend function")
    p.add_argument("--quick", action="store_true", help="a shorter run: see the suite's text")
    p.add_argument("--repeat", type=int, default=None, help="timed samples per step")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"seconds per worker process; one that runs longer is killed and shows "
                        f"as timeout (default cuda {timeout_s['cuda']}, cpu {timeout_s['cpu']})")
    p.add_argument("--time-limit", type=float, default=None,
                   help=f"seconds for the whole run, report included: the worker running at the "
                        f"limit is killed (timeout), later ones are skipped (default cuda "
                        f"{time_limit_s['cuda']}, cpu {time_limit_s['cpu'] or 'none'}; 0: none)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads(N) in every worker (default: torch's choice; "
                        "1 suffers least on a shared, busy CPU machine)")
    p.add_argument("--prespawn", choices=["auto", "on", "off"], default="auto",
                   help="start the next worker while one runs (auto: on GPUs only)")
    p.add_argument("--cache-root", default=None,
                   help="where the workers' caches go (default: a temporary folder, removed)")
    p.add_argument("--out", default="bench_results", help="output folder (default bench_results/)")


@dataclass
class RunSettings:
    """A suite run's settings, from its command line and the device's defaults."""

    device: Any          # torch.device
    dtype: Any           # torch.dtype: bf16 on GPUs, float32 on the CPU
    backends: list[str]  # the compiled ones
    repeat: int
    timeout_s: float
    time_limit_s: float  # 0: none
    started: float       # perf_counter() when the run (and its time limit) began
    prespawn: bool
    threads: int | None
    info: dict           # machine_info
    timing: str          # how steps are timed, in words
    cache_root: Path
    own_cache_root: bool  # a temporary folder of ours, removed at the end

    @classmethod
    def from_args(cls, args, started: float, repeat: dict, timeout_s: dict,
                  time_limit_s: dict) -> "RunSettings":
        import tempfile

        import torch

        from scripts.bench_common import MIN_CPU_SAMPLE_S, machine_info, pick_device

        device = pick_device(args.device)
        kind = device.type
        backends = [b for b in (x.strip() for x in args.backends.split(",")) if b and b != "eager"]
        count = args.repeat or repeat[(kind, args.quick)]
        info = machine_info(device)
        if args.threads:
            info["torch_threads"] = args.threads
        timing = (f"CUDA events, L2 flushed, median of {count}" if kind == "cuda"
                  else f"perf_counter loops >= {MIN_CPU_SAMPLE_S * 1e3:.0f} ms, median of {count}")
        root = args.cache_root or tempfile.mkdtemp(prefix="tf-bench-")
        return cls(device, torch.bfloat16 if kind == "cuda" else torch.float32, backends, count,
                   args.timeout or timeout_s[kind],
                   time_limit_s[kind] if args.time_limit is None else args.time_limit, started,
                   kind == "cuda" if args.prespawn == "auto" else args.prespawn == "on",
                   args.threads, info, timing, Path(root), args.cache_root is None)

    def params(self) -> dict:
        """What every worker of the run is told."""
        return {"device": self.device.type, "dtype": str(self.dtype).replace("torch.", ""),
                "repeat": self.repeat, "threads": self.threads}

    def limits_text(self) -> str:
        return (f"{str(self.dtype).replace('torch.', '')}; limit {self.timeout_s:.0f} s per worker"
                + (f", {self.time_limit_s:.0f} s for the run" if self.time_limit_s else ""))

    def run(self, jobs: list[Job]) -> Iterator[tuple[Job, JobResult]]:
        """Run the jobs (Runner.run); the temporary cache folder goes at the end."""
        import shutil

        try:
            runner = Runner(self.cache_root / "workers", self.device.type, self.started,
                            self.time_limit_s or None, self.prespawn)
            yield from runner.run(jobs)
        finally:
            if self.own_cache_root:
                shutil.rmtree(self.cache_root, ignore_errors=True)
