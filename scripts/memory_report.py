"""What drives the peak memory of a compiled training (or inference) step, per backend.

    python scripts/memory_report.py gpt2,bert --backends tritonfuse,inductor [--device cpu|cuda]
                                    [--mode train|infer] [--dtype bf16|f32] [--top 8]

For each model of scripts/model_zoo.py and each backend it prints

  saved     the bytes the forward graph saves for the backward (the backward graph's inputs
            that are not tangents), by dtype, and the largest saved tensors: what the
            partitioned graphs keep alive between forward and backward
  peak      the peak of allocated bytes during one step (forward, loss, backward), above what
            is resident before it (weights, the batch; gradients are set to None first, so
            every backend allocates them inside the step). On the CPU the allocations are
            read from the profiler's memory events (every CPU allocation of the caching-free
            CPU allocator: the wrapper's buffers, fallbacks' results, autograd's); on cuda
            from torch.cuda.max_memory_allocated.

The step is compiled and run once before it is measured (compilation, autotuning and the
first gradients allocate things a later step does not).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz  # noqa: E402

MB = 2 ** 20


@dataclass
class SavedTensor:
    name: str
    shape: tuple
    dtype: torch.dtype
    nbytes: int


@dataclass
class GraphRecord:
    kind: str                                    # forward / backward / inference
    saved: list = field(default_factory=list)    # backward graphs: their saved inputs


def tensor_bytes(value) -> int:
    """The bytes of a (fake) tensor's storage span; 0 for anything else."""
    if not isinstance(value, torch.Tensor):
        return 0
    if value.numel() == 0:
        return 0
    span = 1 + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))
    return int(span) * value.element_size()


def saved_inputs(gm: torch.fx.GraphModule) -> list[SavedTensor]:
    """The inputs of a backward graph that the forward saved (every placeholder but the
    tangents), with their sizes (0 bytes for a view of another one)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    saved, owner = [], {}
    for node in gm.graph.nodes:
        if node.op != "placeholder" or node.name.startswith("tangents"):
            continue
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            storage = StorageWeakRef(value.untyped_storage())
            if storage in owner:   # a view of another saved tensor: no bytes of its own
                saved.append(SavedTensor(f"{node.name} (view of {owner[storage]})", tuple(value.shape),
                                         value.dtype, 0))
                continue
            owner[storage] = node.name
            saved.append(SavedTensor(node.name, tuple(value.shape), value.dtype, tensor_bytes(value)))
    return saved


class GraphRecorder:
    """Records the graphs a backend compiles: ``backend(name)`` is the torch.compile
    backend that compiles as ``name`` does and keeps a GraphRecord per graph."""

    def __init__(self):
        self.graphs: list[GraphRecord] = []

    def record(self, kind, gm):
        self.graphs.append(GraphRecord(kind, saved_inputs(gm) if kind == "backward" else []))

    @contextlib.contextmanager
    def tritonfuse_hooks(self):
        from tritonfuse import backend as tf_backend
        original = tf_backend._compile_or_fall_back

        def recording(kind, graph_id, gm, example_inputs, options):
            self.record(kind, gm)
            return original(kind, graph_id, gm, example_inputs, options)
        tf_backend._compile_or_fall_back = recording
        try:
            yield
        finally:
            tf_backend._compile_or_fall_back = original

    def inductor_backend(self):
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(gm, example_inputs, **kwargs):
            backward = kwargs.get("is_backward", False)
            inference = kwargs.get("is_inference", False)
            self.record("backward" if backward else "inference" if inference else "forward", gm)
            return compile_fx_inner(gm, example_inputs, **kwargs)
        return functools.partial(compile_fx, inner_compile=inner)

    def saved(self) -> list[SavedTensor]:
        return [t for g in self.graphs for t in g.saved]


GRAPH_RANGES = ("CompiledFunction", "CompiledFunctionBackward")   # aot_autograd's, in both backends


@dataclass
class GraphPeak:
    name: str
    entry: int    # bytes allocated in the step when the graph began
    peak: int     # the step's peak while it ran

    @property
    def own(self) -> int:
        """What the graph adds at its peak to what was live when it began."""
        return self.peak - self.entry


def allocation_timeline(prof, device_type) -> tuple[int, int, list]:
    """(peak, end, graph peaks) of the profiled block: the allocated bytes summed over the
    profiler's memory events of ``device_type``, and for each compiled graph's range (aot
    autograd's ``CompiledFunction`` / ``CompiledFunctionBackward``) its entry and peak."""
    from tritonfuse.testing import allocation_levels
    levels = allocation_levels(prof, device_type)
    ranges = sorted((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()) for e in prof.kineto_results.events()
                    if e.name() in GRAPH_RANGES)
    graphs = []
    for start, end, name in ranges:
        before = [level for time, level in levels if time < start]
        inside = [level for time, level in levels if start <= time <= end]
        entry = before[-1] if before else 0
        graphs.append(GraphPeak(name.replace("CompiledFunction", "graph"), entry, max([entry, *inside])))
    return max([0] + [level for _, level in levels]), levels[-1][1] if levels else 0, graphs


@dataclass
class LiveAllocation:
    nbytes: int
    graph: str     # the compiled graph's range it was allocated in ("" outside any)
    index: int     # its place among that graph's allocations (0: the first)
    op: str        # the innermost op that allocated it


def live_at_peak(prof, device_type: str) -> list[LiveAllocation]:
    """The allocations alive at the profiled block's peak (those made inside it), largest
    first: what to compare between two backends' live sets. ``graph`` and ``index`` place
    each in the generated wrapper's order of allocations (TRITONFUSE_DEBUG=1 writes it)."""
    from torch._C._profiler import _EventType
    allocations = []   # (time, ptr, bytes, graph, op)

    def walk(event, graph, op):
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            if fields.device.type == device_type:
                allocations.append((event.start_time_ns, fields.ptr, fields.alloc_size, graph, op))
            return
        name = event.name
        if name in GRAPH_RANGES:
            graph = name.replace("CompiledFunction", "graph")
        elif event.tag == _EventType.TorchOp:
            op = name
        for child in event.children:
            walk(child, graph, op)
    for root in prof.kineto_results.experimental_event_tree():
        walk(root, "", "")
    allocations.sort(key=lambda a: a[0])
    live, level, best, best_live = {}, 0, 0, {}
    counts = defaultdict(int)
    for time, ptr, nbytes, graph, op in allocations:
        level += nbytes
        if nbytes > 0:
            live[ptr] = LiveAllocation(nbytes, graph, counts[graph], op)
            counts[graph] += 1
        else:
            live.pop(ptr, None)
        if level > best:
            best, best_live = level, dict(live)
    return sorted(best_live.values(), key=lambda a: (-a.nbytes, a.graph, a.index))


def step_peak(fn, device) -> dict:
    """{"peak", "end", "graphs"}: bytes allocated by ``fn()`` at its peak and at its end,
    and the GraphPeak of each compiled graph it ran. On cuda "peak" is
    torch.cuda.max_memory_allocated's (above the bytes allocated before)."""
    from torch.autograd.profiler import profile
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    with profile(profile_memory=True, use_kineto=True, use_device="cuda" if cuda else None) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    peak, end, graphs = allocation_timeline(prof, device_type)
    if cuda:
        peak = torch.cuda.max_memory_allocated() - start
    return {"peak": peak, "end": end, "graphs": graphs, "live": live_at_peak(prof, "cuda" if cuda else "cpu")}


def measure(spec, backend: str, device, dtype, mode: str, batch_size: int | None = None,
            length: int | None = None) -> dict:
    """Saved bytes and the step's peak for one model compiled with ``backend``
    ("tritonfuse", "inductor" or "eager"); ``batch_size``/``length`` override the spec's."""
    torch._dynamo.reset()
    step, _ = mz.make_step(spec, mode, device, dtype)
    batch = mz.make_batch(spec, mode, device, dtype, batch=batch_size, length=length)
    recorder = GraphRecorder()
    hooks = contextlib.nullcontext()
    if backend == "eager":
        compiled = step
    elif backend == "inductor":   # no cache hits: the recorder must see every graph compiled
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config
        compiled = torch.compile(step, backend=recorder.inductor_backend())
        hooks = contextlib.ExitStack()
        hooks.enter_context(inductor_config.patch(fx_graph_cache=False))
        hooks.enter_context(functorch_config.patch(enable_autograd_cache=False))
    else:
        compiled = torch.compile(step, backend="tritonfuse")
        hooks = recorder.tritonfuse_hooks()

    def one_step():
        step.zero_grad(set_to_none=True)
        if mode == "train":
            compiled(batch).backward()
        else:
            with torch.no_grad():
                compiled(batch)

    with hooks:
        one_step()            # compile, autotune, first gradients
    step.zero_grad(set_to_none=True)
    peak = step_peak(one_step, device)
    saved = recorder.saved()
    return {"model": spec.name, "backend": backend, "saved": saved,
            "saved_bytes": sum(t.nbytes for t in saved), "peak": peak["peak"], "end": peak["end"],
            "graph_peaks": peak["graphs"], "live": peak["live"],
            "graphs": [g.kind for g in recorder.graphs]}


def by_dtype(saved) -> dict:
    totals = defaultdict(int)
    for t in saved:
        totals[str(t.dtype).replace("torch.", "")] += t.nbytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def report(rows, top: int, live: int = 0) -> str:
    lines = []
    for row in rows:
        dtypes = ", ".join(f"{k} {v / MB:.2f}" for k, v in by_dtype(row["saved"]).items())
        inputs = sum(t.nbytes for t in row["saved"] if t.name.startswith("primals"))
        lines.append(f"{row['model']:8s} {row['backend']:10s} peak {row['peak'] / MB:8.2f} MB   "
                     f"saved {row['saved_bytes'] / MB:7.2f} MB in {len(row['saved'])} tensors ({dtypes}; "
                     f"graph inputs {inputs / MB:.2f})   "
                     f"graphs {','.join(row['graphs'])}")
        for g in row["graph_peaks"]:
            lines.append(f"    {g.name:14s} entry {g.entry / MB:8.2f} MB  peak {g.peak / MB:8.2f} MB  "
                         f"own {g.own / MB:8.2f} MB")
        if live:
            lines.append(f"    live at the peak: {len(row['live'])} allocations made in the step")
        for a in row["live"][:live]:
            lines.append(f"    {a.nbytes / MB:8.3f} MB  {a.graph or '(outside)':14s} #{a.index:<4d} {a.op}")
        for t in sorted(row["saved"], key=lambda t: -t.nbytes)[:top]:
            lines.append(f"    {t.nbytes / MB:7.3f} MB  {str(t.dtype).replace('torch.', ''):8s} "
                         f"{list(t.shape)}  {t.name}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", help="comma-separated model names, or a group of model_zoo")
    parser.add_argument("--backends", default="tritonfuse,inductor")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", default="train", choices=["train", "infer"])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    parser.add_argument("--top", type=int, default=8, help="largest saved tensors to list")
    parser.add_argument("--live", type=int, default=0,
                        help="largest allocations alive at the peak to list (graph, place, op)")
    parser.add_argument("--size", default="device", choices=["device", "gpu"],
                        help="model sizes: the device's, or the GPU sizes wherever it runs (on the CPU: "
                             "to reproduce a GPU gap, with --batch/--length to keep it fast)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the size's)")
    parser.add_argument("--length", type=int, default=None, help="tokens, or image side (default: the size's)")
    args = parser.parse_args(argv)
    if args.size == "gpu":
        mz.size_key = lambda device: "cuda"
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    device = torch.device(args.device)
    rows = []
    for spec in mz.select_models(args.models):
        for backend in args.backends.split(","):
            rows.append(measure(spec, backend.strip(), device, dtype, args.mode, args.batch, args.length))
            print(report(rows[-1:], args.top, args.live), flush=True)
    return rows


if __name__ == "__main__":
    main()
