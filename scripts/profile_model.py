"""GPU diagnosis of one model's training step (bf16, scripts/model_zoo.py).

    python scripts/profile_model.py gpt2 tritonfuse|inductor          # device side
    python scripts/profile_model.py gpt2 tritonfuse|inductor --host   # host side
    python scripts/profile_model.py llama-gqa tritonfuse --dynamic 128,192,640 --batch 4
        # torch.compile(dynamic=True), one step per length, profiled at the last length

Device side: graphs run eagerly (and why), peak memory, and a kernel-time profile (torch
profiler, 3 steps). Host side: wall time per step (synchronized at the end only) and a
cProfile of 10 steps.
"""
import argparse
import collections
import cProfile
import gc
import logging
import pstats
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz  # noqa: E402
import tritonfuse  # noqa: E402
from tritonfuse import metrics  # noqa: E402


def compiled_train_step(name, backend, lengths=None, batch_size=None):
    """steps(n): n training steps of model ``name`` compiled with ``backend``. With
    ``lengths``, compiled with dynamic=True and called once at each length first; the
    steps then run at the last one."""
    spec = mz.MODELS_BY_NAME.get(name) or mz.text_model(name)
    dev = torch.device("cuda")
    step, _ = mz.make_step(spec, "train", dev, torch.bfloat16)
    compiled = torch.compile(step, backend=backend, dynamic=True if lengths else None)
    for length in lengths or []:
        compiled(mz.make_batch(spec, "train", dev, torch.bfloat16, batch=batch_size,
                               length=length)).backward()
    batch = mz.make_batch(spec, "train", dev, torch.bfloat16, batch=batch_size,
                          length=lengths[-1] if lengths else None)

    def steps(n):
        for _ in range(n):
            compiled(batch).backward()
    return steps


def device_profile(name, backend, steps, top=22):
    start = time.time()
    steps(3)
    torch.cuda.synchronize()
    print(f"== {name} {backend} partitioner={tritonfuse.config.partitioner}: first 3 steps "
          f"{time.time() - start:.1f} s, eager graphs {metrics.eager_graphs}, "
          f"peak MB {torch.cuda.max_memory_allocated() / 2**20:.0f}")
    print("compile seconds by phase (graphs made in this process):",
          {phase: round(sec, 2) for phase, sec in metrics.compile_seconds.items()})
    for graph, why in metrics.eager_graph_reasons.items():
        print("EAGER", graph, why)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps(3)
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.self_device_time_total for e in events) / 3 / 1000
    print(f"total device ms/step {total:.2f}; kernels/step {sum(e.count for e in events) / 3:.0f}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"{e.self_device_time_total / 3 / 1000:7.3f} ms {e.count // 3:4d}x  {e.key[:110]}")


class GcTimer:
    """Time spent in the garbage collector, by generation, while installed."""

    def __init__(self):
        self.ms, self.count, self._start = [0.0, 0.0, 0.0], [0, 0, 0], None

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.ms[info["generation"]] += 1000 * (time.perf_counter() - self._start)
            self.count[info["generation"]] += 1

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


class ThreadSampler(threading.Thread):
    """Samples where the process's other threads are, every millisecond: a thread that
    holds the GIL while the main thread launches kernels slows every step."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen, self._stop_event = collections.Counter(), threading.Event()
        self._main = threading.main_thread().ident

    def run(self):
        while not self._stop_event.wait(0.001):
            for ident, frame in sys._current_frames().items():
                if ident in (self._main, self.ident):
                    continue
                where = []
                while frame is not None and len(where) < 3:
                    where.append(f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}:{frame.f_code.co_name}")
                    frame = frame.f_back
                self.seen[" < ".join(where)] += 1

    def stop(self):
        self._stop_event.set()
        self.join()


def host_profile(name, backend, steps, top=28):
    steps(3)
    torch.cuda.synchronize()
    sampler = ThreadSampler()
    with GcTimer() as gc_time:
        start = time.perf_counter()
        steps(20)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    print(f"== {name} {backend}: {1000 * wall / 20:.3f} ms/step wall (sync at the end only); "
          f"gc {sum(gc_time.ms) / 20:.3f} ms/step (collections by generation {gc_time.count}, "
          f"ms {[round(m, 1) for m in gc_time.ms]}); threads {threading.active_count()}")
    sampler.start()
    start = time.perf_counter()
    steps(20)
    torch.cuda.synchronize()
    sampler.stop()
    print(f"   with a thread sampler running: {1000 * (time.perf_counter() - start) / 20:.3f} ms/step; "
          "other threads' stacks (samples):")
    for where, n in sampler.seen.most_common(12):
        print(f"   {n:6d}  {where}")
    profiler = cProfile.Profile()
    profiler.enable()
    steps(10)
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a scripts/model_zoo.py model (gpt2, bert, ..., llama-gqa)")
    p.add_argument("backend", help="tritonfuse or inductor (any torch.compile backend)")
    p.add_argument("--host", action="store_true", help="host side instead of device side")
    p.add_argument("--dynamic", default=None, help="comma-separated lengths: dynamic=True")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--top", type=int, default=None, help="rows to print")
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.dynamic.split(",")] if args.dynamic else None
    steps = compiled_train_step(args.model, args.backend, lengths, args.batch)
    run = host_profile if args.host else device_profile
    run(args.model, args.backend, steps, **({"top": args.top} if args.top else {}))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
