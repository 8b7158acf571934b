"""Where a compiled training step's first call spends its time (issue 10: first compiles).

    python scripts/first_call_profile.py llama tritonfuse             # cold or warm: as the caches are
    python scripts/first_call_profile.py gpt2 tritonfuse --sample 5   # + a profile of the main thread

Builds the model suite's step (scripts/model_zoo.py, bfloat16 on a GPU, float32 on the
CPU), compiles it with the backend and times its first training call (forward and
backward), compiles included. Prints one JSON line: the import seconds (torch, the
model's packages, the backend), the first call, tritonfuse's compile phases and counters
(Triton binaries, graphs loaded from its cache, graphs run eagerly) and Dynamo's own
compile times. Run it twice with the same TRITONFUSE_CACHE_DIR,
TRITONFUSE_AUTOTUNE_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR for a cold
and a warm first call.

--sample MS: a thread samples the main thread's stack every MS milliseconds; the report
lists the functions on the stack in most samples (inclusive) and at its top (leaf), and a
histogram of how many compile-pool threads were busy. Unlike cProfile, the shares are of
wall time, waits included, and nothing but the main thread is attributed to it.
--eager N also times N eager steps before the compile and after the first call, in this
process: a step that runs slower after is slowed by what the compile left behind.
--stacks FILE (with --sample) also writes every thread's collapsed stacks but the compile
pool's (the autograd engine's device threads run the backward), for a flame graph.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time

started = time.perf_counter()
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StackSampler:
    """Samples one thread's stack from a daemon thread (see the module docstring)."""

    def __init__(self, period_ms: float, thread_id: int):
        self.period = period_ms / 1000
        self.thread_id = thread_id
        self.inclusive: collections.Counter = collections.Counter()
        self.leaf: collections.Counter = collections.Counter()
        self.busy_pool_threads: collections.Counter = collections.Counter()
        self.samples = 0
        # collapsed stacks ("thread;outer;...;inner" -> samples) of every thread but the
        # compile pool's, for a flame graph or a breakdown by caller (--stacks FILE)
        self.stacks: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            frames = sys._current_frames()
            pool = [t for t in threading.enumerate() if t.name.startswith("tritonfuse-compile")]
            self.busy_pool_threads[sum(1 for t in pool if t.ident in frames
                                       and frames[t.ident].f_code.co_name not in ("_serve", "get", "wait"))] += 1
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, top in frames.items():
                name = names.get(ident, str(ident))
                if ident != threading.get_ident() and not name.startswith("tritonfuse-compile"):
                    self.stacks[";".join([name] + self._stack(top))] += 1
            frame, seen = frames.get(self.thread_id), set()
            if frame is None:
                continue
            self.samples += 1
            self.leaf[self._name(frame)] += 1
            while frame is not None:
                name = self._name(frame)
                if name not in seen:
                    self.inclusive[name] += 1
                    seen.add(name)
                frame = frame.f_back

    @classmethod
    def _stack(cls, frame) -> list[str]:
        names = []
        while frame is not None:
            names.append(cls._name(frame))
            frame = frame.f_back
        return names[::-1]

    @staticmethod
    def _name(frame) -> str:
        return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"

    def report(self, top: int = 40) -> str:
        total = self.samples or 1
        lines = [f"{self.samples} samples; busy compile-pool threads: {sorted(self.busy_pool_threads.items())}",
                 "--- inclusive (main thread)"]
        lines += [f"{count / total * 100:6.1f}% {name}" for name, count in self.inclusive.most_common(top)]
        lines.append("--- leaf")
        lines += [f"{count / total * 100:6.1f}% {name}" for name, count in self.leaf.most_common(top // 2)]
        return "\n".join(lines)


def _eager_step_ms(step, batch, n: int, device: str) -> float:
    """The fastest of 3 rounds of ``n`` eager training steps, in ms per step (the
    gradients are left to accumulate: only the time matters)."""
    def run() -> None:
        step(batch).backward()
    for _ in range(3):
        run()
    best = float("inf")
    for _ in range(3):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            run()
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / n * 1e3)
    step.zero_grad(set_to_none=True)
    return round(best, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model of scripts/model_zoo.py (gpt2, llama, bert, mistral, ...)")
    parser.add_argument("backend", help="tritonfuse, inductor, ...")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sample", type=float, default=0, metavar="MS", help="sample the main thread every MS ms")
    parser.add_argument("--eager", type=int, default=0, metavar="N",
                        help="also time N eager training steps before the compile and N after the first "
                             "call, in this process (does compiling leave eager slower?)")
    parser.add_argument("--stacks", metavar="FILE", help="with --sample: write every thread's collapsed stacks "
                        "(but the compile pool's) to FILE, one 'thread;outer;...;inner count' per line")
    args = parser.parse_args()
    import model_zoo
    packages = time.perf_counter()
    if args.backend == "tritonfuse":
        import tritonfuse  # noqa: F401
    imported = time.perf_counter()
    spec = model_zoo.select_models(args.model)[0]
    dtype = torch.bfloat16 if args.device != "cpu" else torch.float32
    step, _ = model_zoo.make_step(spec, "train", args.device, dtype)
    batch = model_zoo.make_batch(spec, "train", args.device, dtype)
    eager_before = _eager_step_ms(step, batch, args.eager, args.device) if args.eager else None
    compiled = torch.compile(step, backend=args.backend)
    sampler = StackSampler(args.sample, threading.get_ident()) if args.sample else None

    def first_call() -> float:
        start = time.perf_counter()
        compiled(batch).backward()
        if args.device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if sampler is not None:
        with sampler:
            seconds = first_call()
    else:
        seconds = first_call()
    out = {"model": args.model, "backend": args.backend, "device": args.device,
           "import_s": round(imported - started, 2), "backend_import_s": round(imported - packages, 2),
           "first_call_s": round(seconds, 2)}
    if args.eager:
        out.update(eager_before_ms=eager_before, eager_after_ms=_eager_step_ms(step, batch, args.eager, args.device))
    if args.backend == "tritonfuse":
        from tritonfuse import metrics
        out.update(compile_seconds={k: round(v, 2) for k, v in metrics.compile_seconds.items()},
                   triton_compilations=metrics.triton_compilations, graph_cache_hits=metrics.graph_cache_hits,
                   aot_cache_hits=metrics.aot_cache_hits, eager_graphs=metrics.eager_graphs)
    from torch._dynamo.utils import compile_times
    out["dynamo"] = compile_times(repr="str", aggregate=True)
    print(json.dumps(out))
    if sampler is not None:
        print(sampler.report())
        if args.stacks:
            with open(args.stacks, "w") as f:
                f.writelines(f"{stack} {count}\n" for stack, count in sampler.stacks.most_common())


if __name__ == "__main__":
    main()
