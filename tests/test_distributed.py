"""DistributedDataParallel and FSDP2 (fully_shard) on 2 ranks, compiled with tritonfuse.

Each test spawns two processes. Each rank trains a small model a few steps twice from the
same initial weights, once compiled with tritonfuse and once eagerly, and saves losses and
final parameters; the test compares them and checks that no graph ran eagerly. Under DDP
1 MB buckets (the smallest DDPOptimizer accepts) over 1 MB blocks make Dynamo's
DDPOptimizer split the graph at bucket boundaries: several forward and backward graphs.

    cpu    gloo, CPU tensors (the C++ backend)
    cuda   nccl, one GPU per rank; skipped with fewer than 2 GPUs. Prints the median step
           time of tritonfuse, Inductor and eager (``pytest -s``).
"""
import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 3
WIDTH = 256             # 1 MB of weights per block
TIMED_STEPS = 20        # cuda only
SPAWN_TIMEOUT_S = 240


def _fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard   # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


class _Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x, keep):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)))) * keep


class _Model(torch.nn.Module):
    def __init__(self, width=WIDTH, depth=3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x):
        # computed once and expanded (stride 0), read by every block as attention masks are:
        # under DDP it crosses the graph splits, an expanded output of one graph and an input
        # of the next (the case that ran eagerly on GPUs, issue 16)
        keep = (x[:, :1] > -1).to(x.dtype).expand_as(x)
        for block in self.blocks:
            x = block(x, keep)
        return self.head(torch.softmax(x, -1) * x).sum(-1)   # not a view: FSDP2 warns about those


def _wrap(model, mode):
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
        return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=1)
    fully_shard = _fully_shard()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def _train(mode, device, backend, timed_steps):
    """STEPS steps (compiled with ``backend``, or eager for None) compared with eager, then
    ``timed_steps`` more that are only timed."""
    from tritonfuse import compile_fx, metrics
    torch.manual_seed(0)
    model = _wrap(_Model().to(device), mode)
    step_model = torch.compile(model, backend=backend) if backend else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + dist.get_rank())
    losses = []
    with compile_fx.capture_sources() as graphs:
        for _ in range(STEPS):
            _step(step_model, optimizer, generator, device, losses)
    params = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
              for name, p in model.named_parameters()}
    step_times = [_step(step_model, optimizer, generator, device, []) for _ in range(timed_steps)]
    return {"losses": torch.stack(losses), "params": params, "step_times": step_times, "graphs": len(graphs),
            "eager_graphs": metrics.eager_graphs if backend == "tritonfuse" else 0}


def _step(step_model, optimizer, generator, device, losses):
    """One training step; returns its wall time."""
    x = torch.randn(16, WIDTH, generator=generator).to(device)
    y = torch.randn(16, generator=generator).to(device)
    started = time.perf_counter()
    loss = torch.nn.functional.mse_loss(step_model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    losses.append(loss.detach().cpu())
    return time.perf_counter() - started


def _worker(rank, world, port, mode, device_type, cache_dir, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TRITONFUSE_CACHE_DIR=cache_dir,
                      TRITONFUSE_AUTOTUNE_CACHE_DIR=os.path.join(cache_dir, "autotune"))
    import tritonfuse
    tritonfuse.config.cache_dir = cache_dir
    torch.set_num_threads(1)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=SPAWN_TIMEOUT_S))
    try:
        timed = TIMED_STEPS if device_type == "cuda" else 0
        result = {"compiled": _train(mode, device, "tritonfuse", timed), "eager": _train(mode, device, None, timed)}
        if device_type == "cuda":    # the reference to beat, timed only
            result["inductor"] = _train(mode, device, "inductor", timed)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_ranks(mode, device_type, tmp_path):
    cache_dir, out_dir = str(tmp_path / "cache"), str(tmp_path / "out")
    os.makedirs(out_dir)
    context = mp.start_processes(_worker, args=(2, _free_port(), mode, device_type, cache_dir, out_dir),
                                 nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the 2 ranks did not finish in {SPAWN_TIMEOUT_S} s")
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(2)]


def _devices():
    only = os.environ.get("TRITONFUSE_TEST_DEVICES")
    params = []
    for device_type in ("cpu", "cuda"):
        marks = []
        if device_type == "cuda" and torch.cuda.device_count() < 2:
            marks.append(pytest.mark.skip(reason="needs 2 GPUs"))
        if only and not any(d.startswith(device_type) for d in only.split(",")):
            marks.append(pytest.mark.skip(reason="TRITONFUSE_TEST_DEVICES"))
        params.append(pytest.param(device_type, marks=marks, id=device_type))
    return params


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("device_type", _devices())
@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_ranks_train_like_eager(mode, device_type, tmp_path):
    ranks = _run_two_ranks(mode, device_type, tmp_path)
    for rank, result in enumerate(ranks):
        compiled, eager = result["compiled"], result["eager"]
        assert compiled["eager_graphs"] == 0, f"rank {rank}: a graph ran eagerly"
        if mode == "ddp":   # DDPOptimizer split the forward (and so the backward) at buckets
            assert compiled["graphs"] >= 4, compiled["graphs"]
        torch.testing.assert_close(compiled["losses"], eager["losses"], atol=1e-4, rtol=1e-4)
        assert compiled["params"].keys() == eager["params"].keys()
        for name in eager["params"]:
            torch.testing.assert_close(compiled["params"][name], eager["params"][name], atol=1e-4, rtol=1e-4,
                                       msg=lambda m, name=name: f"rank {rank}, {name}: {m}")
    # the ranks saw different data, yet hold the same parameters: gradients were reduced
    for name, value in ranks[0]["compiled"]["params"].items():
        torch.testing.assert_close(ranks[1]["compiled"]["params"][name], value)
    if device_type == "cuda":
        timed = {kind: sorted(ranks[0][kind]["step_times"]) for kind in ("compiled", "inductor", "eager")}
        median = {kind: 1e3 * times[len(times) // 2] for kind, times in timed.items()}
        print(f"\n{mode} on 2 GPUs, median step: tritonfuse {median['compiled']:.2f} ms, "
              f"inductor {median['inductor']:.2f} ms, eager {median['eager']:.2f} ms")


def test_bench_ddp_report_keeps_failed_cells_and_compares_losses():
    """scripts/bench_ddp.py's table from rank results: ratios against eager and Inductor,
    the loss check, per-rank eager graphs with their reasons, and a failed cell's error."""
    from scripts import bench_ddp

    def rank(step_ms, loss, **extra):
        return dict({"first_call_s": 2.0, "step_ms": [step_ms] * 3, "losses": [9.0, loss], "peak_memory_gb": 1.0,
                     "dynamo": {"graphs": 4, "graph_breaks": 0}}, **extra)

    tritonfuse = {"eager_graphs": 1, "eager_graph_reasons": ["graph g1 failed"], "fallbacks": {"aten.mm": "why"},
                  "kernels": 7}
    cells = {"ddp/eager": bench_ddp._summarize([rank(12.0, 5.0), rank(12.5, 5.1)]),
             "ddp/inductor": bench_ddp._summarize([rank(10.0, 5.01), rank(10.0, 5.0)]),
             "ddp/tritonfuse": bench_ddp._summarize([rank(8.0, 6.0, tritonfuse=tritonfuse),
                                                      rank(8.0, 6.0, tritonfuse=dict(tritonfuse, eager_graphs=0))]),
             "fsdp2/tritonfuse": {"error": "error: rank 0: RuntimeError: boom"}}
    for key in ("ddp/inductor", "ddp/tritonfuse"):
        bench_ddp._check_loss(cells[key], cells["ddp/eager"], "bfloat16")
    assert cells["ddp/inductor"]["loss_ok"] and not cells["ddp/tritonfuse"]["loss_ok"]
    assert cells["ddp/eager"]["step_ms_slowest_rank"] == 12.5
    assert cells["ddp/tritonfuse"]["eager_graphs_per_rank"] == [1, 0]
    settings = {"device": "cpu", "dtype": "bfloat16", "steps": 3, "config": bench_ddp.CONFIGS["small"]}
    machine = {"device": "cpu", "device_name": "test", "torch": "-", "triton": "-", "python": "-", "cpu_count": 2,
               "torch_threads": 1, "timestamp": "-"}
    text = bench_ddp._markdown({"settings": settings, "machine": machine, "cells": cells})
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in text.splitlines()}
    row = rows["ddp", "tritonfuse"]
    assert "1.50x" in row and "1.25x" in row and "WRONG" in row and "1/0 [1]" in row, row
    assert "graph g1 failed" in text and "RuntimeError: boom" in text
