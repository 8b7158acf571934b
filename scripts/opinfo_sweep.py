#!/usr/bin/env python
"""Run every op of torch's OpInfo table through tritonfuse and, on the same samples,
through Inductor (the reference), and write ``docs/results/opinfo_<device>.md``.

    python scripts/opinfo_sweep.py                          # cpu (OpenMP C++), float32, 2 samples
    python scripts/opinfo_sweep.py --device triton-interpret
    python scripts/opinfo_sweep.py --device cuda --compilers tritonfuse --time-limit 420 --out opinfo_cuda.md
    python scripts/opinfo_sweep.py --device cuda --dtypes float32,bfloat16
    python scripts/opinfo_sweep.py --ops 'sum,masked.*' --compilers tritonfuse --no-write

Each op runs its first ``--samples`` samples alone and between generated pointwise ops
(scripts/opinfo_harness.py says how, and what each outcome means). Ops run in chunks,
one worker process per chunk (``--jobs`` workers side by side), with
``torch._dynamo.reset()`` between ops; every result is appended to a JSON-lines state
file as soon as it is known, so an interrupted sweep picks up where it stopped
(``--fresh`` starts over). An op that kills its worker (a segfault, or a hang past
``--op-timeout``) is recorded as a crash and the sweep goes on with the next op.
``--time-limit`` stops the workers after that many seconds (compilers in the order
given) and reports the ops done; run again with the same ``--state-dir`` to go on.

Inductor's CPU code is C++ whichever CPU column is swept, so its results for ``cpu`` are
reused for ``triton-interpret`` when present in the state folder. The OpInfo table needs
``expecttest`` (the ``[test]`` extra); where it is missing a stand-in is used.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import fnmatch
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")   # no background compile pool

DEVICES = ("cpu", "triton-interpret", "cuda")
COMPILERS = ("tritonfuse", "inductor")


def _torch_device(device):
    return "cuda" if device == "cuda" else "cpu"


def _state_path(state_dir: Path, device, compiler, dtypes, samples) -> Path:
    if compiler == "inductor" and device == "triton-interpret":
        device = "cpu"   # the same C++ code either way
    return state_dir / f"{device}_{compiler}_{'-'.join(dtypes)}_s{samples}.jsonl"


def _state_files(path: Path):
    """The state file and those of parallel jobs (``--jobs``) beside it."""
    return [path] + sorted(path.parent.glob(path.stem + ".job*.jsonl"))


def _read_file(path: Path):
    """({(op, dtype): result record}, the (op, dtype) last started and not finished or None)."""
    done, started = {}, None
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            key = (record["name"], record["dtype"])
            if record.get("started"):
                started = key
            else:
                done[key] = record
                started = None if started == key else started
    return done, started


def _read_state(path: Path) -> dict:
    done = {}
    for part in _state_files(path):
        done.update(_read_file(part)[0])
    return done


# ---- the worker: runs a chunk of ops in this process --------------------------------------

def make_compiler(compiler, device, autotune):
    from scripts.opinfo_harness import InductorCompiler, TritonfuseCompiler
    if compiler == "inductor":
        return InductorCompiler()
    from tritonfuse import config
    config.autotune = autotune
    return TritonfuseCompiler({"cpu": "cpp", "triton-interpret": "triton"}.get(device))


def run_worker(args):
    import faulthandler
    import torch
    from scripts.opinfo_harness import ops_by_name, run_op
    table = ops_by_name()
    compiler = make_compiler(args.compiler, args.device, args.autotune)
    device = _torch_device(args.device)
    with open(args.state, "a") as out:
        for name in args.worker_ops.split(","):
            op = table[name]
            for dtype_name in args.dtypes.split(","):
                dtype = getattr(torch, dtype_name)
                out.write(json.dumps(dict(name=name, dtype=dtype_name, started=True)) + "\n")
                out.flush()
                faulthandler.dump_traceback_later(args.op_timeout, exit=True)   # a hang ends the worker
                started = time.perf_counter()
                if dtype not in op.supported_dtypes(device):
                    record = dict(name=name, dtype=dtype_name, outcome="unsupported", detail="", fallbacks=[],
                                  kernels=0)
                else:
                    result = run_op(compiler, op, device, dtype, samples=args.samples)
                    record = dict(name=name, dtype=dtype_name, outcome=result.outcome, detail=result.detail,
                                  fallbacks=result.fallback_ops(), kernels=sum(c.kernels for c in result.cases))
                record["seconds"] = round(time.perf_counter() - started, 2)
                faulthandler.cancel_dump_traceback_later()
                out.write(json.dumps(record) + "\n")
                out.flush()
                print(f"{args.compiler} {name} {dtype_name}: {record['outcome']} ({record['seconds']} s)",
                      flush=True)


# ---- the driver ----------------------------------------------------------------------------

def _selected_ops(patterns):
    from scripts.opinfo_harness import op_name, op_table
    names = [op_name(op) for op in op_table()]
    if not patterns:
        return names
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in wanted)]


def _spawn(args, compiler, state, ops):
    """Run a worker on ``ops``: its exit status, or None if the time limit stopped it."""
    command = [sys.executable, __file__, "--worker-ops", ",".join(ops), "--compiler", compiler,
               "--device", args.device, "--dtypes", args.dtypes, "--samples", str(args.samples),
               "--state", str(state), "--op-timeout", str(args.op_timeout), "--autotune", args.autotune]
    quiet = None if args.verbose else subprocess.DEVNULL
    try:
        return subprocess.run(command, cwd=_REPO, stdout=quiet, stderr=quiet, timeout=_time_left(args)).returncode
    except subprocess.TimeoutExpired:   # killed at the time limit; its op in flight is left to a later run
        return None


def _time_left(args):
    """Seconds until ``--time-limit`` runs out (None: no limit)."""
    return None if args.deadline is None else max(0.0, args.deadline - time.monotonic())


def sweep(args, compiler, names):
    dtypes = args.dtypes.split(",")
    state = _state_path(args.state_dir, args.device, compiler, dtypes, args.samples)
    if args.fresh and not (compiler == "inductor" and args.keep_inductor):
        for part in _state_files(state):
            part.unlink(missing_ok=True)
    started = time.perf_counter()
    done = _read_state(state)
    todo = [n for n in names if any((n, d) not in done for d in dtypes)]
    jobs = max(1, min(args.jobs or _auto_jobs(), len(todo)))
    parts = [state if jobs == 1 else state.with_name(f"{state.stem}.job{k}.jsonl") for k in range(jobs)]
    threads = [threading.Thread(target=_drive, args=(args, compiler, part, todo[k::jobs], len(names), started))
               for k, part in enumerate(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stopped = " (stopped at the time limit)" if _time_left(args) == 0 else ""
    print(f"[{compiler} {args.device}] done in {time.perf_counter() - started:.0f} s{stopped}", flush=True)
    return _read_state(state)


def _auto_jobs():
    """One worker per two CPUs, at most 8 (a GPU box runs 8 workers side by side)."""
    return max(1, min(8, (os.cpu_count() or 2) // 2))


def _drive(args, compiler, part: Path, names, total, started):
    """Run ``names`` chunk by chunk in worker processes that append to ``part``."""
    dtypes = args.dtypes.split(",")
    while True:
        done, _ = _read_file(part)
        todo = [n for n in names if any((n, d) not in done for d in dtypes)]
        if not todo or _time_left(args) == 0:
            return
        chunk = todo[:args.chunk]
        print(f"[{compiler} {args.device} {part.name}] {len(names) - len(todo)}/{len(names)} of this job "
              f"({total} ops), {time.perf_counter() - started:.0f} s; next: {chunk[0]} ...", flush=True)
        status = _spawn(args, compiler, part, chunk)
        if status is None:
            return
        _, victim = _read_file(part)
        if status != 0 and victim is not None:   # the op that killed (or hung) its worker
            with open(part, "a") as out:
                out.write(json.dumps(dict(name=victim[0], dtype=victim[1], outcome="crash", fallbacks=[], kernels=0,
                                          detail=f"the worker process died (exit status {status})",
                                          seconds=0)) + "\n")
        elif status != 0:
            raise SystemExit(f"a worker failed (exit status {status}) outside any op; run with --verbose")


# ---- the report ------------------------------------------------------------------------------

GOOD = ("pass", "views", "fallback")


def _expectations():
    """tests/opinfo_expectations.py (the tables the OpInfo test applies), or empty ones."""
    sys.path.insert(0, str(_REPO / "tests"))
    try:
        import opinfo_expectations as table
    except ImportError:
        return lambda name, column: None, {}, lambda name, column: None
    return table.allowed_fallback, table.PENDING_LOWERINGS, table.expected_failure


def _inductor_cell(record):
    if record is None:
        return "—"
    return "pass" if record["outcome"] in GOOD else record["outcome"]


def _inductor_detail(record):
    """The per-op cell: pass with kernels, or pass without one (aten calls or views only)."""
    cell = _inductor_cell(record)
    return "pass, no kernel" if cell == "pass" and record["outcome"] != "pass" else cell


def _note(record, other):
    note = ""
    if record is not None:
        note = record.get("detail", "") or ""
        if record["outcome"] in GOOD and record.get("fallbacks"):
            note = "fallbacks: " + ", ".join(f"`{f}`" for f in record["fallbacks"])
    if other is not None and _inductor_cell(other) != "pass" and other.get("detail"):
        note += ("; " if note else "") + "Inductor: " + other["detail"]
    return note.replace("|", "\\|").replace("\n", " ")[:300]


def _status(name, record, column, tables):
    """What the OpInfo test makes of this outcome: ok, allowed, pending, gap, expected or FAIL."""
    allowed, pending, expected_failure = tables
    outcome = record["outcome"]
    if expected_failure(name, column):
        return "expected failure" if outcome not in GOOD else "unexpected pass"
    if outcome in ("pass", "views", "skip"):
        return "ok"
    if outcome == "fallback":
        if allowed(name, column):
            return "allowed fallback"
        return "pending lowering" if name in pending else "lowering gap"
    return "FAIL"


def write_report(args, names, results, path: Path):
    import torch
    dtypes = args.dtypes.split(",")
    tf = results.get("tritonfuse", {})
    ind = results.get("inductor", {})
    tables = _expectations()
    lines = [f"# OpInfo sweep: {args.device}", ""]
    lines += [f"Every op of `op_db` ({len(names)} ops), dtypes {', '.join(dtypes)}, the first {args.samples} samples "
              f"of each, alone and between generated pointwise ops (`x * 1.0` in, `y + 0.0` out), compiled and "
              f"compared with eager. Written by `python scripts/opinfo_sweep.py --device {args.device}"
              f"{' --dtypes ' + args.dtypes if args.dtypes != 'float32' else ''}"
              f"{' --samples ' + str(args.samples) if args.samples != 2 else ''}` on "
              f"{datetime.date.today().isoformat()} (torch {torch.__version__}, {platform.machine()}, "
              f"{os.cpu_count()} CPUs). Inductor's CPU code is C++ for both CPU columns.", ""]
    lines += ["Outcomes: **pass** = matches eager and the op generated kernels; **views** = matches, the op "
              "needed neither kernel nor fallback; **fallback** = matches, the op ran as aten calls only; "
              "**eager** = a graph ran eagerly (tritonfuse could not compile it, or the backend handed an error "
              "back to Dynamo, which ran the op outside any graph); **wrong** = a result differs from eager; "
              "**crash** = the compiled call raised; **skip** = eager rejects every sample. For Inductor, "
              "**pass** covers pass, views and fallback (per op, *pass, no kernel* where its run of the op "
              "alone generated no kernel). Random ops (dropout, rand_like, ...) and `empty*` "
              "compare shapes and dtypes only, for both compilers. The *test* column is what "
              "tests/test_opinfo.py makes of it (tests/opinfo_expectations.py): an allowed fallback (Inductor "
              "runs it as aten too), a pending lowering (issue 9, point 5), a lowering gap (Inductor generates "
              "kernels, tritonfuse runs aten), an expected failure, or FAIL.", ""]
    for dtype in dtypes:
        tf_counts = collections.Counter(tf[(n, dtype)]["outcome"] for n in names if (n, dtype) in tf)
        ind_counts = collections.Counter(_inductor_cell(ind[(n, dtype)]) for n in names if (n, dtype) in ind)
        status = collections.Counter(_status(n, tf[(n, dtype)], args.device, tables) for n in names
                                     if (n, dtype) in tf and tf[(n, dtype)]["outcome"] != "unsupported")
        tf_ok = sum(tf_counts[c] for c in GOOD)
        tf_missing = sum((n, dtype) not in tf for n in names)
        ind_missing = sum((n, dtype) not in ind for n in names)
        lines += [f"## Totals, {dtype}", ""]
        lines += ["| compiler | correct (pass+views+fallback) | pass | views | fallback | eager | wrong | crash | "
                  "skip | dtype unsupported | not run |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines.append(f"| tritonfuse | **{tf_ok}** | {tf_counts['pass']} | {tf_counts['views']} | "
                     f"{tf_counts['fallback']} | {tf_counts['eager']} | {tf_counts['wrong']} | {tf_counts['crash']} | "
                     f"{tf_counts['skip']} | {tf_counts['unsupported']} | {tf_missing} |")
        if ind:
            lines.append(f"| Inductor | **{ind_counts['pass']}** | — | — | — | {ind_counts['eager']} | "
                         f"{ind_counts['wrong']} | {ind_counts['crash']} | {ind_counts['skip']} | "
                         f"{ind_counts['unsupported']} | {ind_missing} |")
        both = [n for n in names if (n, dtype) in tf and (n, dtype) in ind
                and "unsupported" not in (tf[(n, dtype)]["outcome"], ind[(n, dtype)]["outcome"])]
        if ind and ind_missing:
            lines += ["", f"On the {len(both)} ops both compilers ran: tritonfuse "
                      f"**{sum(tf[(n, dtype)]['outcome'] in GOOD for n in both)}** correct, Inductor "
                      f"**{sum(ind[(n, dtype)]['outcome'] in GOOD for n in both)}**."]
        if tf_missing or (ind and ind_missing):
            lines += ["", "*Not run*: ops the sweep did not reach before its `--time-limit`; run "
                      "the same command again with the same state folder to carry on."]
        lines += ["", "tritonfuse's fallbacks and failures as the test sees them: "
                  + ", ".join(f"{key} {count}" for key, count in sorted(status.items())), ""]
    lines += ["## Per op", "", "| op | dtype | tritonfuse | test | Inductor | detail (first failing case) / fallbacks |",
              "| --- | --- | --- | --- | --- | --- |"]
    for name in names:
        for dtype in dtypes:
            record = tf.get((name, dtype))
            if record is not None and record["outcome"] == "unsupported":
                continue
            other = ind.get((name, dtype))
            status = _status(name, record, args.device, tables) if record is not None else "—"
            lines.append(f"| `{name}` | {dtype} | {record['outcome'] if record else '—'} | {status} | "
                         f"{_inductor_detail(other)} | {_note(record, other)} |")
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=DEVICES)
    parser.add_argument("--compilers", default="tritonfuse,inductor")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--ops", default="", help="comma-separated names or fnmatch patterns (default: all)")
    parser.add_argument("--chunk", type=int, default=40, help="ops per worker process")
    parser.add_argument("--jobs", type=int, default=0, help="worker processes at a time (default: one per two "
                        "CPUs, at most 8)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for the whole sweep (every "
                        "compiler): then the workers stop and the report covers the ops done; a later run with "
                        "the same state folder carries on")
    parser.add_argument("--op-timeout", type=int, default=600, help="seconds one op may take before it counts "
                        "as a crash")
    parser.add_argument("--autotune", default="none", choices=("none", "default", "max"), help="tritonfuse's "
                        "launch-config tuning (default none: one config per kernel; the sweep checks results)")
    parser.add_argument("--state-dir", type=Path, default=Path(tempfile.gettempdir()) / "tritonfuse_opinfo_sweep")
    parser.add_argument("--fresh", action="store_true", help="forget earlier results of this configuration")
    parser.add_argument("--keep-inductor", action="store_true", help="with --fresh: keep Inductor's results")
    parser.add_argument("--out", type=Path, default=None, help="default: docs/results/opinfo_<device>.md")
    parser.add_argument("--no-write", action="store_true", help="print the outcomes, write no report")
    parser.add_argument("--report-only", action="store_true", help="run nothing: report the results recorded so far")
    parser.add_argument("--verbose", action="store_true", help="show the workers' output")
    # worker mode (internal)
    parser.add_argument("--worker-ops", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compiler", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--state", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker_ops is not None:
        return run_worker(args)

    args.deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    args.state_dir.mkdir(parents=True, exist_ok=True)
    names = _selected_ops(args.ops)
    results = {}
    for compiler in args.compilers.split(","):
        if compiler not in COMPILERS:
            parser.error(f"unknown compiler {compiler!r}")
        if args.report_only:
            results[compiler] = _read_state(_state_path(args.state_dir, args.device, compiler,
                                                        args.dtypes.split(","), args.samples))
        else:
            results[compiler] = sweep(args, compiler, names)
    if args.no_write:
        for name in names:
            for dtype in args.dtypes.split(","):
                cells = [f"{c}={results[c].get((name, dtype), {}).get('outcome', '—')}" for c in results]
                detail = results.get("tritonfuse", {}).get((name, dtype), {}).get("detail", "")
                print(f"{name} {dtype}: {' '.join(cells)} {detail[:200]}")
        return 0
    out = args.out or _REPO / "docs" / "results" / f"opinfo_{args.device}.md"
    write_report(args, names, results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
