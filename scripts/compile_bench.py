#!/usr/bin/env python
"""Compile time of real models: first calls with the compile pool against serial compile
(on a GPU), and the compilations of a model's kernels before and after dedupe and
pruning (anywhere: offline, for an sm_90 target).

On a GPU (the default there; about 4 minutes on an H100, under --budget seconds):

    python scripts/compile_bench.py --out compile_bench.json

  Each run is a fresh process with empty caches (tritonfuse's, the autotune cache,
  Triton's) that builds a model (HF GPT-2 and Llama from small configs if transformers
  is importable, else built-in MLP and transformer blocks), runs one eager training step
  (CUDA and cuBLAS warm), then times the first compiled training step (forward, loss,
  backward): Dynamo, lowering, code generation, Triton compiles, autotuning, the run.
  Runs: serial compile (TRITONFUSE_COMPILE_WORKERS=0), the pool as configured by default
  (processes from 8 cores on), then, as the budget allows, the caches left by the pool run
  in a new process (warm), Inductor's cold first call for reference, and the other pool
  kind (threads or processes); --runs picks some of them. The JSON holds every run; a markdown table goes to stdout.

Offline (no GPU needed; --mode kernels, the default without one):

    python scripts/compile_bench.py --mode kernels                 # GPT-2, 2 layers, fwd + bwd
    python scripts/compile_bench.py --mode kernels --model llama --workers 8 --before
    python scripts/compile_bench.py --mode kernels --model gpt2 --layers 12 --count-only
    python scripts/compile_bench.py --mode kernels --save k.json ... ; ... --load k.json

  The model's forward and backward graphs go through tritonfuse's CUDA Triton code
  generator on CPU tensors (each graph then runs eagerly, its kernels never launched), and
  every kernel is compiled for a CUDA target offline (default sm_90, the H100), each run
  into a fresh Triton cache. It reports:

  before   every kernel occurrence (one per layer, forward and backward) with every
           candidate config of the old "default" mode, compiled serially: what a cold
           first call compiled before this pipeline (--before; it takes a while)
  after    one compile per unique kernel source (names aside) with the pruned
           candidates, serially (--workers 0) and through the pool (--workers N)

Measured offline on the 2-core development machine (triton 3.9, sm_90; HF models at
hidden 768, 12 heads, FFN 3072, vocab 32000, 8 x 512 tokens, bf16, forward + backward of
the logits' sum; the script now takes HF's own loss, a cross-entropy):

  model, layers   launches  unique kernels  compilations before -> after   serial s before -> after
  GPT-2, 2              41              25           259 -> 121 (2.1x)        216 -> 96   (2.3x)
  Llama, 2              32              22           187 -> 119 (1.6x)        155 -> 86   (1.8x)
  GPT-2, 12            193              37          1194 -> 180 (6.6x)        (--count-only)
  Llama, 12            153              34           818 -> 183 (4.5x)        (--count-only)

That machine ran at a load of 9-12 on its 2 cores, so its pool timings say nothing about
parallelism: the first-call runs on the GPU host (16 cores) do. A compile holds the GIL
~29% of its time (py-spy --gil over 30 sm_90 compiles: the Python front end 99%,
make_llir 32%, MLIR passes 0%, ptxas 2%), which bounds 15 threads at ~3x serial; worker
processes are bounded only by the cores and their start (torch and triton imports,
overlapped with lowering).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import subprocess
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
HIDDEN, HEADS, FFN, VOCAB = 768, 12, 3072, 32000   # the sizes


# --- the models ---------------------------------------------------------------------------

class MLP(torch.nn.Module):
    """`layers` identical residual blocks: x + W2 gelu(W1 layernorm(x))."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(
            torch.nn.LayerNorm(HIDDEN), torch.nn.Linear(HIDDEN, FFN), torch.nn.GELU(), torch.nn.Linear(FFN, HIDDEN))
            for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def build_model(name: str, layers: int, dtype: torch.dtype, device: str = "cpu"):
    """(module, inputs(batch, seq), loss(module, inputs)) at the issue's sizes: hidden
    768, 12 heads, FFN 3072, vocab 32000; dropout 0."""
    torch.manual_seed(0)
    if name in ("mlp", "block"):
        if name == "mlp":
            model = MLP(layers)
        else:
            from scripts.models import TransformerBlock
            model = torch.nn.Sequential(*[TransformerBlock(HIDDEN, HEADS) for _ in range(layers)])

        def activations(batch, seq):
            return (torch.randn(batch, seq, HIDDEN, dtype=dtype, device=device),)

        return model.to(device=device, dtype=dtype), activations, lambda m, inputs: m(*inputs).float().square().mean()
    import transformers
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_embd=HIDDEN, n_head=HEADS, n_layer=layers, n_inner=FFN, vocab_size=VOCAB,
                                      n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(cfg)
    elif name == "llama":
        cfg = transformers.LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                       num_hidden_layers=layers, intermediate_size=FFN, vocab_size=VOCAB,
                                       max_position_embeddings=1024)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"unknown model {name!r}")
    model.config.use_cache = False

    def token_ids(batch, seq):
        return (torch.randint(0, VOCAB, (batch, seq), device=device),)

    def language_model_loss(m, inputs):   # HF's own loss: shifted cross-entropy
        return m(inputs[0], labels=inputs[0]).loss

    return model.to(device=device, dtype=dtype), token_ids, language_model_loss


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
    model, make_inputs, loss = build_model(model_name, layers, dtype)
    record = Definitions()
    with cuda_codegen_on_cpu(record):
        torch._dynamo.reset()
        loss(torch.compile(model, backend="tritonfuse"), make_inputs(batch, seq)).backward()
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
    rows = [{"name": name, "new": new, "prefix": k.prefix, "template": k.template, "kind": k.kind,
             "numels": k.numels, "hint": k.hint, "configs": [c.to_dict() for c in k.configs],
             "dtypes": [str(d).replace("torch.", "") for d in k.pointer_dtypes],
             "scalars": list(k.example_scalars)} for k, name, new in record.made]
    with open(path, "w") as f:
        json.dump(rows, f)


def load(path: str) -> Definitions:
    from tritonfuse.codegen.triton.scheduling import TritonKernelDefinition
    from tritonfuse.runtime.heuristics import Config
    record = Definitions()
    with open(path) as f:
        for row in json.load(f):
            kernel = TritonKernelDefinition(
                prefix=row["prefix"], origins=(), template=row["template"], kind=row["kind"], numels=row["numels"],
                configs=tuple(Config.from_dict(c) for c in row["configs"]), mutated=(), device_type="cuda",
                device_index=None, hint=row["hint"], pointer_dtypes=tuple(getattr(torch, d) for d in row["dtypes"]),
                example_scalars=tuple(row["scalars"]))
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
            pool.start(with_processes=True)
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


# --- first calls on the GPU -------------------------------------------------------------------

# what each kind of run sets in a child's environment
POOL_ENV = {"serial": {"TRITONFUSE_COMPILE_WORKERS": "0"}, "default": {},
            "threads": {"TRITONFUSE_COMPILE_POOL": "threads"}, "processes": {"TRITONFUSE_COMPILE_POOL": "processes"}}
CACHE_ENV = ("TRITONFUSE_CACHE_DIR", "TRITONFUSE_AUTOTUNE_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def first_call(spec: dict) -> dict:
    """In a child process: one eager training step, then the first compiled one, timed."""
    device = spec["device"]
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model, make_inputs, loss_of = build_model(spec["model"], spec["layers"], DTYPES[spec["dtype"]], device)
    inputs = make_inputs(spec["batch"], spec["seq"])
    eager_loss = loss_of(model, inputs)        # CUDA, cuBLAS and the allocator warm; the reference
    eager_loss.backward()
    model.zero_grad(set_to_none=True)
    synchronize()
    result = {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__}
    if spec["backend"] == "tritonfuse":
        import tritonfuse.compile_fx
        compile_seconds = [0.0]
        compile_graph = tritonfuse.compile_fx.compile_graph

        def timed_compile_graph(*args, **kwargs):   # lowering, scheduling, code generation
            start = time.perf_counter()
            try:
                return compile_graph(*args, **kwargs)
            finally:
                compile_seconds[0] += time.perf_counter() - start

        tritonfuse.compile_fx.compile_graph = timed_compile_graph
    compiled = torch.compile(model, backend=spec["backend"])
    seconds = []
    for _ in range(2):                         # the first call, then one that compiles nothing
        start = time.perf_counter()
        loss = loss_of(compiled, inputs)
        loss.backward()
        synchronize()
        seconds.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    import triton
    result.update(first_call_s=seconds[0], second_call_s=seconds[1], triton=triton.__version__,
                  loss_rel_diff=abs(loss.item() - eager_loss.item()) / max(abs(eager_loss.item()), 1e-6))
    if spec["backend"] == "tritonfuse":
        from tritonfuse import metrics
        from tritonfuse.runtime import async_compile, autotuner
        pool = async_compile.pool()
        result.update(
            graph_compile_s=compile_seconds[0], pool_workers=pool.workers, pool_processes=pool.processes,
            triton_compilations=metrics.triton_compilations, kernel_dedup_hits=metrics.kernel_dedup_hits,
            kernel_launches=metrics.generated_kernel_count, graph_cache_hits=metrics.graph_cache_hits,
            eager_graphs=metrics.eager_graphs, fallbacks=sorted(metrics.fallbacks),
            autotuned=autotuner.stats.tuned, autotune_cache_hits=autotuner.stats.cache_hits,
            autotune_s=autotuner.stats.tuning_seconds)
    return result


RUN_KINDS = ("serial", "pool", "warm", "inductor", "other-pool")


def plan_runs(models: list[str], other_pools: list[str], wanted: set) -> list[dict]:
    """The `wanted` runs (of RUN_KINDS) in the order they are worth having: serial and the
    default pool for every model first, then warm caches, Inductor (the reference) and the
    other pool kinds."""
    runs = [dict(model=m, backend="tritonfuse", pool=pool, cache="cold") for m in models
            for kind, pool in (("serial", "serial"), ("pool", "default")) if kind in wanted]
    if "warm" in wanted:
        runs += [dict(model=m, backend="tritonfuse", pool="default", cache="warm") for m in models]
    if "inductor" in wanted:
        runs += [dict(model=m, backend="inductor", pool="-", cache="cold") for m in models]
    if "other-pool" in wanted:
        runs += [dict(model=m, backend="tritonfuse", pool=kind, cache="cold") for kind in other_pools for m in models]
    return runs


def run_child(run: dict, args, cache_root: str, timeout: float) -> dict:
    """One run in a fresh process; its caches: new (cold) or those of the model's
    default-pool cold run (warm)."""
    owner = f"{run['model']}-{run['backend']}-{run['pool'] if run['cache'] == 'cold' else 'default'}"
    env = {k: v for k, v in os.environ.items() if k not in CACHE_ENV and not k.startswith("TRITONFUSE_COMPILE_")}
    env.update({name: os.path.join(cache_root, owner, name.lower()) for name in CACHE_ENV})
    env.update(POOL_ENV.get(run["pool"], {}), PYTHONUNBUFFERED="1")
    spec = dict(run, layers=args.layers, batch=args.batch, seq=args.seq, dtype=args.dtype, device=args.device)
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(run, error=f"timed out after {timeout:.0f} s", process_s=time.perf_counter() - start)
    out = dict(run, process_s=time.perf_counter() - start)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return dict(out, error=(proc.stderr.strip().splitlines() or ["no output"])[-1][:500])
    return dict(out, **json.loads(lines[-1]))


def first_call_bench(args) -> int:
    from tritonfuse.runtime import async_compile
    models = args.models.split(",") if args.models else (["gpt2", "llama"] if has_transformers() else ["mlp", "block"])
    default_kind = "processes" if (os.cpu_count() or 1) >= async_compile.PROCESSES_MIN_CPUS else "threads"
    other_kinds = [k for k in ("threads", "processes") if k != default_kind]
    wanted = set(args.runs.split(","))
    if not wanted <= set(RUN_KINDS):
        raise SystemExit(f"--runs: expected some of {', '.join(RUN_KINDS)}")
    runs = plan_runs(models, other_kinds, wanted)
    report = {"settings": dict(models=models, device=args.device, layers=args.layers, batch=args.batch, seq=args.seq, dtype=args.dtype,
                               autotune=os.environ.get("TRITONFUSE_AUTOTUNE", "default"), budget_s=args.budget,
                               cpus=os.cpu_count(), default_pool=default_kind, python=platform.python_version()),
              "runs": []}
    deadline = time.monotonic() + args.budget
    with tempfile.TemporaryDirectory(prefix="tf-compile-bench-") as cache_root:
        for run in runs:
            left = deadline - time.monotonic()
            if left < args.min_run:
                report["runs"].append(dict(run, skipped=f"{args.budget} s budget spent"))
                continue
            result = run_child(run, args, cache_root, left)
            report["runs"].append(result)
            print(f"{run['model']:6s} {run['backend']:10s} {run['pool']:9s} {run['cache']:4s} "
                  + (f"first call {result['first_call_s']:6.1f} s" if "first_call_s" in result
                     else result.get("error", "")), flush=True)
            if args.out:                       # what finished survives a later stop
                write_report(report, args.out)
    report["table"] = summary_table(report["runs"], models)
    print(report["table"])
    if args.out:
        write_report(report, args.out)
    return 0


def write_report(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def summary_table(runs: list[dict], models: list[str]) -> str:
    """Markdown: first-call seconds per model and run, and what the pool run compiled."""
    def seconds(model, backend, pool, cache="cold"):
        for r in runs:
            if (r["model"], r["backend"], r["pool"], r["cache"]) == (model, backend, pool, cache):
                return r.get("first_call_s")
        return None

    def text(value, digits=1, suffix=""):
        return "-" if value is None else f"{value:.{digits}f}{suffix}"

    lines = ["| model | serial s | pool s | pool vs serial | warm s | threads s | processes s | Inductor s "
             "| compilations | dedup hits | fallbacks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        serial, pool = seconds(m, "tritonfuse", "serial"), seconds(m, "tritonfuse", "default")
        pooled = next((r for r in runs if (r["model"], r["pool"], r["cache"]) == (m, "default", "cold")), {})
        kind = ("processes" if pooled.get("pool_processes") else "threads") if pooled.get("pool_workers") else None
        threads = seconds(m, "tritonfuse", "threads") if kind != "threads" else pool
        processes = seconds(m, "tritonfuse", "processes") if kind != "processes" else pool
        speedup = serial / pool if serial and pool else None
        lines.append(f"| {m} | {text(serial)} | {text(pool)} ({pooled.get('pool_workers', '?')} {kind or ''}) "
                     f"| {text(speedup, 2, 'x')} | {text(seconds(m, 'tritonfuse', 'default', 'warm'))} "
                     f"| {text(threads)} | {text(processes)} | {text(seconds(m, 'inductor', '-'))} "
                     f"| {pooled.get('triton_compilations', '-')} | {pooled.get('kernel_dedup_hits', '-')} "
                     f"| {len(pooled.get('fallbacks', [])) if pooled else '-'} |")
    return "\n".join(lines)


# --- the command line ---------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["first-call", "kernels"],
                   help="first calls on the GPU (the default where there is one), or the kernels offline")
    p.add_argument("--out", metavar="FILE", help="write the results as JSON (first-call mode)")
    p.add_argument("--models", help="first-call mode: comma-separated of gpt2, llama, mlp, block "
                                    "(default: gpt2,llama with transformers, else mlp,block)")
    p.add_argument("--budget", type=float, default=270, help="first-call mode: seconds for all runs")
    p.add_argument("--min-run", type=float, default=25, help="first-call mode: start no run with less left")
    p.add_argument("--runs", default=",".join(RUN_KINDS),
                   help="first-call mode: which runs, of " + ", ".join(RUN_KINDS) + " (default: all, the budget "
                        "allowing; warm reuses the pool run's caches)")
    p.add_argument("--device", default="cuda", help="first-call mode: where the models run (cpu: a smoke test)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "mlp", "block"], help="kernels mode")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=None, help="default: 4 (first-call), 8 (kernels)")
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
    if args.child:
        spec = json.loads(args.child)
        if spec["backend"] == "tritonfuse":
            import tritonfuse  # noqa: F401  (registers the backend)
        print(json.dumps(first_call(spec)))
        return 0
    mode = args.mode or ("first-call" if torch.cuda.is_available() else "kernels")
    if mode == "first-call":
        args.batch = args.batch or 4
        return first_call_bench(args)
    args.batch = args.batch or 8
    return kernels_bench(args)


def kernels_bench(args) -> int:
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
