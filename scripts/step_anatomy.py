"""Where a compiled training step's time goes on a GPU: host enqueue against device time.

    python scripts/step_anatomy.py llama --backends inductor,tritonfuse
    python scripts/step_anatomy.py vit --backends tritonfuse --kernels 80 --host-profile 30
    python scripts/step_anatomy.py llama-gqa --lengths 128,448 --by-time   # a symbolic recompile
    python scripts/step_anatomy.py llama-gqa --lengths 128,192,704 --sync-check   # syncs in a step

For each backend, in one process per call of this script (run it once per backend for a
clean host), the step of scripts/model_zoo.py (bf16, gradients cleared, as bench.py's
training rows) is timed three ways:

  * pipelined: back-to-back steps with L2 flushed before each, CUDA events around each
    (what bench.py reports): max(host, device) per step, roughly;
  * host: the wall time of the step's Python call while the GPU is held busy by a sleep
    kernel queued before it, so no launch waits for the device: the pure enqueue cost;
  * device: CUDA events around the same step, which was queued whole behind the sleep: the
    pure device time, with no gap left by the host.

A step whose host time exceeds its device time is host-bound: its pipelined time follows
the host. Then the kernels per step (torch profiler), by family (Triton kernels of the
backend, cuBLAS/cuDNN, other aten kernels, memsets/copies) and the most launched ones; and
with --host-profile N a cProfile of 10 steps (N rows by own time).
"""
import argparse
import collections
import cProfile
import io
import pstats
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz  # noqa: E402
from scripts.bench_accuracy import step_callable  # noqa: E402
from scripts.bench_common import host_and_device_ms, time_cuda_samples  # noqa: E402


def make_train_step(name: str, backend: str, lengths=(), batch=None):
    """The model's training step, compiled by ``backend``. With ``lengths`` (a text model,
    as in bench.py --suite dynamic): compiled in Dynamo's default mode and called once at
    each length, so that the first compiles statically and the next recompile
    symbolically; the step returned runs at the last length."""
    spec = mz.MODELS_BY_NAME.get(name) or mz.text_model(name)
    dev = torch.device("cuda")
    step, _ = mz.make_step(spec, "train", dev, torch.bfloat16)
    if backend != "eager":
        if backend == "tritonfuse":
            import tritonfuse  # noqa: F401
        compiled = torch.compile(step, backend=backend, dynamic=None if lengths else False)
    else:
        compiled = step
    if not lengths:
        return step_callable(step, compiled, mz.make_batch(spec, "train", dev, torch.bfloat16), train=True)
    for n in lengths:
        fn = step_callable(step, compiled, mz.make_batch(spec, "train", dev, torch.bfloat16, batch=batch,
                                                         length=n, seed=n), train=True)
        fn()
    return fn


def pipelined_ms(fn, n: int) -> float:
    return statistics.median(time_cuda_samples(fn, n, torch.device("cuda")))


def family(name: str) -> str:
    if name.startswith(("triton_", "cpp_")):
        return "triton (compiled)"
    if name.startswith(("nvjet", "sm90_xmma", "cutlass", "ampere_", "sm80_")) or "gemm" in name.lower():
        return "cuBLAS"
    if "cudnn" in name or "flash" in name or "fmha" in name:
        return "cuDNN/attention"
    if name.startswith(("Memset", "Memcpy")) or "memset" in name.lower() or "memcpy" in name.lower():
        return "memset/copy"
    return "other aten"


def kernel_census(fn, top: int, by_time: bool = False) -> None:
    from torch.profiler import ProfilerActivity, profile
    steps = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
              or e.self_device_time_total > 0]
    by_family = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        f = by_family[family(e.key)]
        f[0] += e.count
        f[1] += e.self_device_time_total
    total = sum(c for c, _ in by_family.values()) / steps
    print(f"   kernels/step {total:.0f}: " + ", ".join(
        f"{fam} {c / steps:.0f} ({t / steps / 1000:.3f} ms)" for fam, (c, t) in sorted(by_family.items())))
    order = ((lambda e: -e.self_device_time_total) if by_time else
             (lambda e: (-e.count, -e.self_device_time_total)))
    for e in sorted(events, key=order)[:top]:
        print(f"   {e.count // steps:4d}x {e.self_device_time_total / steps / 1000:7.3f} ms  {e.key[:120]}")


def host_profile(fn, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def sync_check(fn, steps: int = 2) -> None:
    """Runs ``steps`` steps under torch.cuda.set_sync_debug_mode("warn") and prints every
    host-device synchronization they make, with the Python stack that made it. A step with
    a sync in its middle stops the host's lead: its pipelined time grows with device time."""
    stacks = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            stack = traceback.format_stack(limit=14)[:-2]
            stacks["".join(stack[-8:])] += 1

    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    # cudaMalloc/cudaFree inside a step also synchronize, unseen by the sync debug mode
    allocator = {key: after.get(key, 0) - before.get(key, 0)
                 for key in ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")}
    print(f"   synchronizations in {steps} steps: {sum(stacks.values())}; allocator calls: "
          + ", ".join(f"{key} {value}" for key, value in allocator.items()))
    for stack, count in stacks.most_common():
        print(f"   --- {count}x at:\n{stack}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a scripts/model_zoo.py model (llama, vit, gpt2, ...)")
    p.add_argument("--backends", default="inductor,tritonfuse")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--kernels", type=int, default=40, help="most launched kernels to list")
    p.add_argument("--host-profile", type=int, default=0, help="cProfile rows (0: none)")
    p.add_argument("--lengths", default="", help="sequence lengths, comma-separated: compile in Dynamo's "
                   "default mode over them (the first static, then a symbolic recompile) and time the last "
                   "(e.g. llama-gqa --lengths 128,192,448, bench.py --suite dynamic's model)")
    p.add_argument("--batch", type=int, default=4, help="batch size with --lengths")
    p.add_argument("--by-time", action="store_true", help="list kernels by device time, not by launches")
    p.add_argument("--sync-check", action="store_true",
                   help="list the host-device synchronizations a step makes, with their Python stacks")
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",") if n]
    for backend in args.backends.split(","):
        fn = make_train_step(args.model, backend, lengths, args.batch)
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for _ in range(5):
            fn()
        pipe = pipelined_ms(fn, args.steps)
        host, device, blocked = host_and_device_ms(fn, args.steps)
        bound = "host-bound" if host > device else "device-bound"
        print(f"== {args.model} {backend}: pipelined {pipe:.3f} ms, host {host:.3f} ms, device {device:.3f} ms "
              f"({bound}; first 3 steps {first:.1f} s{'; ' + str(blocked) + ' steps outlasted the sleep' if blocked else ''})",
              flush=True)
        kernel_census(fn, args.kernels, args.by_time)
        if args.sync_check:
            sync_check(fn)
        if args.host_profile and backend != "eager":
            host_profile(fn, args.host_profile)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
