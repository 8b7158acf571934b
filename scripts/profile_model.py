"""GPU diagnosis of one model's training step (bf16, scripts/model_zoo.py).

    python scripts/profile_model.py gpt2 tritonfuse|inductor          # device side
    python scripts/profile_model.py gpt2 tritonfuse|inductor --host   # host side

Device side: graphs run eagerly (and why), peak memory, and a kernel-time profile (torch
profiler, 3 steps). Host side: wall time per step (synchronized at the end only) and a
cProfile of 10 steps.
"""
import cProfile
import logging
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz  # noqa: E402
import tritonfuse  # noqa: E402
from tritonfuse import metrics  # noqa: E402


def compiled_train_step(name, backend):
    """steps(n): n training steps of model ``name`` compiled with ``backend``."""
    spec = mz.MODELS_BY_NAME[name]
    dev = torch.device("cuda")
    step, _ = mz.make_step(spec, "train", dev, torch.bfloat16)
    batch = mz.make_batch(spec, "train", dev, torch.bfloat16)
    compiled = torch.compile(step, backend=backend)

    def steps(n):
        for _ in range(n):
            compiled(batch).backward()
    return steps


def device_profile(name, backend, steps):
    start = time.time()
    steps(3)
    torch.cuda.synchronize()
    print(f"== {name} {backend} partitioner={tritonfuse.config.partitioner}: first 3 steps "
          f"{time.time() - start:.1f} s, eager graphs {metrics.eager_graphs}, "
          f"peak MB {torch.cuda.max_memory_allocated() / 2**20:.0f}")
    for graph, why in metrics.eager_graph_reasons.items():
        print("EAGER", graph, why)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps(3)
        torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.self_device_time_total for e in events) / 3 / 1000
    print(f"total device ms/step {total:.2f}; kernels/step {sum(e.count for e in events) / 3:.0f}")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:22]:
        print(f"{e.self_device_time_total / 3 / 1000:7.3f} ms {e.count // 3:4d}x  {e.key[:110]}")


def host_profile(name, backend, steps):
    steps(3)
    torch.cuda.synchronize()
    start = time.perf_counter()
    steps(20)
    torch.cuda.synchronize()
    print(f"== {name} {backend}: {1000 * (time.perf_counter() - start) / 20:.3f} ms/step wall "
          "(sync at the end only)")
    profiler = cProfile.Profile()
    profiler.enable()
    steps(10)
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(28)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    model, compiler = sys.argv[1], sys.argv[2]
    run = host_profile if "--host" in sys.argv[3:] else device_profile
    run(model, compiler, compiled_train_step(model, compiler))
