#!/usr/bin/env python
"""Triton compile time of a real model's kernels: before dedupe and pruning, and after,
serially and through the compile pool (tritonfuse/runtime/async_compile.py).

    python scripts/compile_bench.py                           # GPT-2, 2 layers, fwd + bwd
    python scripts/compile_bench.py --model llama --workers 8 --before
    python scripts/compile_bench.py --model gpt2 --layers 12 --count-only
    python scripts/compile_bench.py --save k.json ... ; python scripts/compile_bench.py --load k.json

No GPU is needed: the model's forward and backward graphs go through tritonfuse's CUDA
Triton code generator on CPU tensors (each graph then runs eagerly, its kernels never
launched), and every kernel is compiled for a CUDA target offline (default sm_90, the
H100), each run into a fresh Triton cache. It reports:

  before   every kernel occurrence (one per layer, forward and backward) with every
           candidate config of the old "default" mode, compiled serially: what a cold
           first call compiled before this pipeline (--before; it takes a while)
  after    one compile per unique kernel source (names aside) with the pruned
           candidates, serially (--workers 0) and through the pool (--workers N)

Measured on the 2-core development machine (triton 3.9, sm_90; HF models at hidden 768,
12 heads, FFN 3072, vocab 32000, 8 x 512 tokens, bf16, forward + backward):

  model, layers   launches  unique kernels  compilations before -> after   serial s before -> after
  GPT-2, 2              41              25           259 -> 121 (2.1x)        216 -> 96   (2.3x)
  Llama, 2              32              22           187 -> 119 (1.6x)        155 -> 86   (1.8x)
  GPT-2, 12            193              37          1194 -> 180 (6.6x)        (--count-only)
  Llama, 12            153              34           818 -> 183 (4.5x)        (--count-only)

That machine ran at a load of 9-12 on its 2 cores during those runs, so its pool
timings (2 threads: 0.98x / 1.07x serial; 2 processes, warm: 0.90x / 0.97x) say nothing
about parallelism; measure that on the GPU host (16 cores):

  python scripts/compile_bench.py --model gpt2 --workers 4,8,15 --before

A compile holds the GIL ~29% of its time (py-spy --gil over 30 sm_90 compiles: the
Python front end 99%, make_llir 32%, MLIR passes 0%, ptxas 2%), which bounds 15 threads
at ~3x serial; worker processes are bounded only by the cores and their start (torch and
triton imports, overlapped with lowering).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
H100_SMS = 132


# --- the models ---------------------------------------------------------------------------

def build_model(name: str, layers: int, dtype: torch.dtype):
    """(module, input ids or activations) at the issue's sizes: hidden 768, 12 heads,
    FFN 3072, vocab 32000."""
    torch.manual_seed(0)
    if name == "block":
        from scripts.models import TransformerBlock
        blocks = torch.nn.Sequential(*[TransformerBlock(768, 12) for _ in range(layers)])
        return blocks.to(dtype), lambda batch, seq: (torch.randn(batch, seq, 768, dtype=dtype),)
    import transformers
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=768, n_head=12, n_layer=layers, n_inner=3072, vocab_size=32000,
                                      n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=768, num_attention_heads=12, num_key_value_heads=12,
                                       num_hidden_layers=layers, intermediate_size=3072, vocab_size=32000,
                                       max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"unknown model {name!r}")
    model.config.use_cache = False
    return model.to(dtype), lambda batch, seq: (torch.randint(0, 32000, (batch, seq)),)


def _loss(output):
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    logits = output.logits if hasattr(output, "logits") else output[0]
    return logits.float().sum()


# --- generating the kernels ---------------------------------------------------------------

class Definitions:
    """Every Triton kernel definition code generation made: (definition, name, new)."""

    def __init__(self) -> None:
        self.made: list[tuple] = []


@contextlib.contextmanager
def cuda_codegen_on_cpu(record: Definitions):
    """CPU tensors get the CUDA Triton code generator (libdevice, an H100's split sizes);
    its kernels are recorded and not compiled (the graphs fall back to eager)."""
    from tritonfuse import config
    from tritonfuse.codegen import registry
    from tritonfuse.codegen.triton.scheduling import TritonScheduling
    from tritonfuse.codegen.wrapper import WrapperCodeGen

    class OfflineCudaScheduling(TritonScheduling):
        @staticmethod
        def split_reduction_target(device) -> int:
            return 4 * H100_SMS

        @staticmethod
        def _device_index(device):
            return None   # nothing compiles during codegen: this script compiles them

    define = WrapperCodeGen.define_triton_kernel

    def recording(self, kernel):
        name, new = define(self, kernel)
        record.made.append((kernel, name, new))
        return name, new

    saved = (registry._backends.get("cpu"), config.cpu_backend, config.graph_cache)
    registry.register_backend_for_device("cpu", OfflineCudaScheduling)
    config.cpu_backend, config.graph_cache = "cpp", False
    WrapperCodeGen.define_triton_kernel = recording
    logging.getLogger("tritonfuse").setLevel(logging.ERROR)
    try:
        yield
    finally:
        WrapperCodeGen.define_triton_kernel = define
        if saved[0] is not None:
            registry.register_backend_for_device("cpu", saved[0])
        else:
            registry._backends.pop("cpu", None)
        config.cpu_backend, config.graph_cache = saved[1], saved[2]


def generate(model_name: str, layers: int, batch: int, seq: int, dtype: torch.dtype) -> Definitions:
    model, make_inputs = build_model(model_name, layers, dtype)
    record = Definitions()
    with cuda_codegen_on_cpu(record):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="tritonfuse")
        _loss(compiled(*make_inputs(batch, seq))).backward()
    return record


# --- what to compile ------------------------------------------------------------------------

def unpruned_candidates(kernel):
    """The candidates the old "default" mode compiled: no size budget."""
    from tritonfuse.runtime import heuristics
    saved = heuristics.TUNE_MIN_ELEMENTS
    heuristics.TUNE_MIN_ELEMENTS = 0
    try:
        return heuristics.candidate_configs(kernel.kind, kernel.numels, "default", hint=kernel.hint)
    finally:
        heuristics.TUNE_MIN_ELEMENTS = saved


def jobs_before(record: Definitions) -> list[tuple]:
    """(name, source, config, argspec): every occurrence, each under its own name."""
    from tritonfuse.runtime.async_compile import ArgSpec
    jobs = []
    for i, (kernel, _, _) in enumerate(record.made):
        name = f"{kernel.prefix}_{i}"
        argspec = ArgSpec.aligned(kernel.pointer_dtypes, kernel.example_scalars)
        jobs += [(name, kernel.source(name), cfg, argspec) for cfg in unpruned_candidates(kernel)]
    return jobs


def kernels_after(record: Definitions) -> list[tuple]:
    """(KernelSource, configs, argspec) of each kernel definition, in order (the pool
    dedupes identical ones across graphs by their source)."""
    from tritonfuse.runtime.async_compile import ArgSpec, KernelSource
    out = []
    for kernel, name, new in record.made:
        if new:
            argspec = ArgSpec.aligned(kernel.pointer_dtypes, kernel.example_scalars)
            out.append((KernelSource(name, kernel.source(name)), kernel.configs, argspec))
    return out


# --- saving the kernels (to compile them on another machine) ------------------------------------

def save(record: Definitions, path: str) -> None:
    import json
    rows = [{"name": name, "new": new, "prefix": k.prefix, "template": k.template, "kind": k.kind,
             "numels": k.numels, "hint": k.hint, "configs": [c.to_dict() for c in k.configs],
             "dtypes": [str(d).replace("torch.", "") for d in k.pointer_dtypes]} for k, name, new in record.made]
    with open(path, "w") as f:
        json.dump(rows, f)


def load(path: str) -> Definitions:
    import json
    from tritonfuse.codegen.triton.scheduling import TritonKernelDefinition
    from tritonfuse.runtime.heuristics import Config
    record = Definitions()
    with open(path) as f:
        for row in json.load(f):
            kernel = TritonKernelDefinition(
                prefix=row["prefix"], origins=(), template=row["template"], kind=row["kind"], numels=row["numels"],
                configs=tuple(Config.from_dict(c) for c in row["configs"]), mutated=(), device_type="cuda",
                device_index=None, hint=row["hint"], pointer_dtypes=tuple(getattr(torch, d) for d in row["dtypes"]))
            record.made.append((kernel, row["name"], row["new"]))
    return record


# --- compiling ---------------------------------------------------------------------------------

@contextlib.contextmanager
def fresh_triton_cache():
    with tempfile.TemporaryDirectory(prefix="tf-compile-bench-") as folder:
        saved = os.environ.get("TRITON_CACHE_DIR")
        os.environ["TRITON_CACHE_DIR"] = folder
        try:
            yield folder
        finally:
            if saved is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = saved


def _loader():
    from tritonfuse import config
    from tritonfuse.runtime.triton_launcher import load_kernel
    return lambda name, source: load_kernel(name, source, config.cache_dir)


def compile_before(jobs, target) -> tuple[float, int]:
    from tritonfuse.runtime.async_compile import compile_kernel
    load = _loader()
    with fresh_triton_cache():
        start = time.perf_counter()
        for name, source, cfg, argspec in jobs:
            compile_kernel(load(name, source), cfg, argspec, target)
        return time.perf_counter() - start, len(jobs)


def compile_after(kernels, target, workers: int, processes: bool = False,
                  warm: bool = False) -> tuple[float, int, int]:
    """(seconds, compilations, failures) through a fresh CompilePool of `workers` threads
    (each with a worker process if `processes`); warm: time it once the processes are up."""
    from tritonfuse import metrics
    from tritonfuse.runtime.async_compile import CompilePool
    with fresh_triton_cache():
        before = metrics.triton_compilations
        pool = CompilePool(workers, processes)
        if warm:
            pool.start()
            deadline = time.monotonic() + 300
            while not all(worker.ready() for worker in pool._worker_processes) and time.monotonic() < deadline:
                time.sleep(0.05)
        start = time.perf_counter()
        futures = []
        for kernel, configs, argspec in kernels:
            futures += pool.submit(kernel, configs, argspec, target)[0].values()
        failures = sum(f.exception() is not None for f in futures)
        seconds = time.perf_counter() - start
        pool.close()
        return seconds, metrics.triton_compilations - before, failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "block"])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability to compile for")
    p.add_argument("--workers", default=None,
                   help="pool threads, or a comma-separated list to compare (default: one per core but one)")
    p.add_argument("--before", action="store_true", help="also compile the old set serially (slow)")
    p.add_argument("--pool", default="threads,processes",
                   help="pool kinds to time: threads, processes (cold: their start counted) or both")
    p.add_argument("--count-only", action="store_true", help="report the compilation counts, compile nothing")
    p.add_argument("--save", metavar="FILE", help="write the generated kernels to FILE (JSON)")
    p.add_argument("--load", metavar="FILE", help="compile the kernels in FILE instead of generating them")
    args = p.parse_args(argv)

    from triton.backends.compiler import GPUTarget
    from tritonfuse.runtime.async_compile import default_workers
    target = GPUTarget("cuda", args.arch, 32)
    worker_counts = [default_workers()] if args.workers is None else [int(w) for w in args.workers.split(",")]

    start = time.perf_counter()
    if args.load:
        record = load(args.load)
        print(f"kernels of {args.load}")
    else:
        record = generate(args.model, args.layers, args.batch, args.seq, DTYPES[args.dtype])
        print(f"{args.model}: {args.layers} layers, {args.batch}x{args.seq}, {args.dtype}, forward + backward; "
              f"code generation {time.perf_counter() - start:.1f} s")
    if args.save:
        save(record, args.save)
    before = jobs_before(record)
    after = kernels_after(record)
    unique = {kernel.key for kernel, _, _ in after}
    print(f"kernels: {len(record.made)} launches in the graphs, {len(after)} definitions (identical ones "
          f"share one within a graph), {len(unique)} unique sources")
    print(f"compilations before: {len(before):4d} (each launch's kernel x "
          f"{len(before) / max(1, len(record.made)):.1f} candidates of the old default mode)")
    n_after = len({(kernel.key, cfg, argspec) for kernel, configs, argspec in after for cfg in configs})
    print(f"compilations after:  {n_after:4d} (unique kernels x {n_after / max(1, len(unique)):.1f} "
          f"candidates after pruning)")
    if args.count_only:
        return 0
    serial, _, failed = compile_after(after, target, 0)
    print(f"  serial                {serial:7.1f} s ({failed} failed)")
    best = serial
    for kind in args.pool.split(","):
        for workers in worker_counts:
            runs = [("threads", False)] if kind == "threads" else [("processes, cold", False),
                                                                   ("processes, warm", True)]
            for label, warm in runs:
                seconds, _, failed = compile_after(after, target, workers, kind == "processes", warm)
                best = min(best, seconds)
                print(f"  {workers:2d} {label:18s} {seconds:7.1f} s ({failed} failed): "
                      f"{serial / seconds:.2f}x serial")
    if args.before:
        seconds, n = compile_before(before, target)
        print(f"before, serial: {n} compilations {seconds:.1f} s: {seconds / best:.1f}x the fastest 'after'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
