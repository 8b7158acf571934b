#!/usr/bin/env python
"""Fill the autotune cache ahead of deployment, so that the first real run tunes nothing.

    python scripts/warmup_autotune.py                               # built-in set, best device
    python scripts/warmup_autotune.py --export tuned.json
    python scripts/warmup_autotune.py --no-builtin \\
        --target my_model.py:forward --shapes 8x128,8x128 --dtype float16

Every target is compiled with torch.compile(backend="tritonfuse") and called once on
random inputs: the Triton launchers tune their kernels on that first call and store the
winners in the autotune cache ($TRITONFUSE_AUTOTUNE_CACHE_DIR, or --cache-dir). The full
search (--mode max) is the default: a deployment running the default budget
(TRITONFUSE_AUTOTUNE=default) finds those results and tunes nothing. Targets:

  built-in  the demo TransformerBlock (scripts/models.py) at a few batch sizes,
            softmax / layer norm / RMS norm at typical shapes (small ones on the CPU), and
            matmuls with epilogues at LLM shapes under mode="max-autotune" (their choice
            between the GEMM template's configs and aten is stored too)
  --target  module:function or path/to/file.py:function (repeatable); --shapes gives its
            input shapes, "8x128,8x128" = two tensors (one --shapes for all targets, or
            one per --target in the same order); --dtype applies to every input
  --max-autotune  compile every target with mode="max-autotune" (a model's matmuls too)

On the CPU the Triton backend runs under Triton's interpreter (tuning forced), which is
slow but makes the script testable without a GPU. Each result is checked against eager;
the exit status is 1 if any target fails (an exception or a wrong result).
A second run with the same cache reports only cache hits and tunes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}


@dataclasses.dataclass
class Target:
    """One thing to compile and run: `fn(*make_inputs())`."""
    name: str
    fn: Callable[..., Any]
    make_inputs: Callable[[], tuple]
    mode: str | None = None        # torch.compile's mode


# --- built-in targets ---------------------------------------------------------------------

def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def linear_gelu(x, w, b):
    return F.gelu(x @ w + b)


def linear_residual(x, w, r):
    return x @ w + r


def _randn(shape, device, dtype):
    return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)


def matmul_targets(device: str, dtype: torch.dtype) -> list[Target]:
    """x [M, K] @ w [K, N] with a bias + GELU and with a residual, under max-autotune."""
    sizes = [(37, 50, 29)] if device == "cpu" else [(4096, 4096, 4096), (8192, 1024, 4096), (8192, 4096, 1024)]
    targets = []
    for m, n, k in sizes:
        targets.append(Target(f"gelu(x @ w + b) {m}x{n}x{k}", linear_gelu, lambda m=m, n=n, k=k: (
            _randn((m, k), device, dtype), _randn((k, n), device, dtype) / k ** 0.5, _randn((n,), device, dtype)),
            mode="max-autotune"))
        targets.append(Target(f"x @ w + r {m}x{n}x{k}", linear_residual, lambda m=m, n=n, k=k: (
            _randn((m, k), device, dtype), _randn((k, n), device, dtype) / k ** 0.5, _randn((m, n), device, dtype)),
            mode="max-autotune"))
    return targets


def builtin_targets(device: str, dtype: torch.dtype) -> list[Target]:
    """The demo transformer block at a few batch sizes, plus normalization-style kernels."""
    if device == "cpu":   # the interpreter is slow: tiny shapes that still cover each kind
        block_dim, heads, seq, batches = 32, 2, 8, (1, 2)
        rows = [(4, 16), (3, 40)]
    else:
        block_dim, heads, seq, batches = 768, 12, 512, (1, 8, 32)
        rows = [(4096, 1024), (8192, 768), (2048, 4096), (32768, 128)]
    targets = []
    try:
        from scripts.models import TransformerBlock, make_block_inputs
    except ImportError as e:
        print(f"warning: no transformer block target ({e})", file=sys.stderr)
    else:
        torch.manual_seed(0)
        block = TransformerBlock(block_dim, heads).to(device=device, dtype=dtype).eval()
        for batch in batches:
            targets.append(Target(
                f"transformer_block b{batch}x{seq}x{block_dim}", block,
                lambda batch=batch: (make_block_inputs(batch, seq, block_dim, device, dtype),)))
    for r, c in rows:
        targets.append(Target(f"softmax {r}x{c}", softmax,
                              lambda r=r, c=c: (_randn((r, c), device, dtype),)))
        targets.append(Target(f"layer_norm {r}x{c}", layer_norm, lambda r=r, c=c: (
            _randn((r, c), device, dtype), _randn((c,), device, dtype), _randn((c,), device, dtype))))
        targets.append(Target(f"rms_norm {r}x{c}", rms_norm, lambda r=r, c=c: (
            _randn((r, c), device, dtype), _randn((c,), device, dtype))))
    return targets + matmul_targets(device, dtype)


# --- user targets -------------------------------------------------------------------------

def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """"8x128,8x128" -> [(8, 128), (8, 128)]; "8" -> [(8,)]."""
    shapes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty shape in {text!r}")
        shapes.append(tuple(int(d) for d in part.lower().split("x")))
    return shapes


def load_function(spec: str) -> Callable[..., Any]:
    """"pkg.module:fn" or "path/to/file.py:fn" -> the function."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--target must look like module:function, got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        path = Path(module_name).resolve()
        mod_spec = importlib.util.spec_from_file_location(f"warmup_target_{path.stem}", path)
        if mod_spec is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part)
    return fn


def user_targets(specs: list[str], shapes: list[str], device: str,
                 dtype: torch.dtype) -> list[Target]:
    if specs and len(shapes) not in (1, len(specs)):
        raise ValueError(f"give one --shapes for all targets or one per --target "
                         f"({len(specs)} targets, {len(shapes)} --shapes)")
    if specs and not shapes:
        raise ValueError("--target needs --shapes")
    targets = []
    for i, spec in enumerate(specs):
        fn = load_function(spec)
        shape_text = shapes[i] if len(shapes) > 1 else shapes[0]
        parsed = parse_shapes(shape_text)
        targets.append(Target(f"{spec} {shape_text}", fn, lambda parsed=parsed: tuple(
            _randn(s, device, dtype) for s in parsed)))
    return targets


# --- running ------------------------------------------------------------------------------

class ProgressBar:
    """A plain text bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, width: int = 30) -> None:
        self.total, self.width, self.done = total, width, 0
        self.tty = sys.stderr.isatty()

    def show(self, label: str) -> None:
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {label}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)


def _resolve_backend(name: str):
    if name == "tritonfuse":
        from tritonfuse.backend import tritonfuse_backend
        return tritonfuse_backend
    return name


def _check(result, expected, dtype: torch.dtype) -> None:
    tol = TOLERANCE.get(dtype, 1e-3)
    torch.testing.assert_close(result, expected, rtol=tol, atol=tol, equal_nan=True)


def run_target(target: Target, backend, dtype: torch.dtype, check: bool) -> dict[str, Any]:
    """Compile and call `target` once; returns its row of the summary."""
    from tritonfuse.runtime import autotuner
    torch._dynamo.reset()          # each target compiles from scratch
    tuned0, hits0 = autotuner.stats.tuned, autotuner.stats.cache_hits
    start = time.perf_counter()
    row = {"name": target.name, "ok": True, "error": None}
    try:
        inputs = target.make_inputs()
        compiled = torch.compile(target.fn, backend=backend, mode=target.mode)
        with torch.no_grad():
            result = compiled(*inputs)
            if check:
                _check(result, target.fn(*inputs), dtype)
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported, and the run goes on
        row.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    row.update(tuned=autotuner.stats.tuned - tuned0, hits=autotuner.stats.cache_hits - hits0,
               seconds=time.perf_counter() - start)
    return row


def configure(args) -> None:
    """Apply the command line to tritonfuse.config before anything compiles."""
    import tritonfuse.config as tf_config
    if args.cache_dir:
        tf_config.autotune_cache_dir = os.path.abspath(args.cache_dir)
    tf_config.autotune = args.mode
    if args.device == "cpu":
        tf_config.cpu_backend = "triton"
        tf_config.autotune_under_interpreter = True


def parse_args(argv: list[str] | None):
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="a function to compile (repeatable); module or path/to/file.py")
    p.add_argument("--shapes", action="append", default=[], metavar="AxB,C",
                   help="input shapes of the target(s), e.g. 8x128,8x128")
    p.add_argument("--dtype", choices=sorted(DTYPES),
                   help="input dtype (default: float16 on cuda, float32 on cpu)")
    p.add_argument("--device", default=default_device, choices=["cuda", "cpu"],
                   help=f"default: {default_device}")
    p.add_argument("--mode", default="max", choices=["default", "max"],
                   help="how many launch configs to try per kernel (default: max, the full search, "
                        "whose results TRITONFUSE_AUTOTUNE=default runs also use)")
    p.add_argument("--max-autotune", action="store_true",
                   help='compile every target with mode="max-autotune" (GEMM templates for matmuls)')
    p.add_argument("--builtin", action=argparse.BooleanOptionalAction, default=True,
                   help="include the built-in targets (default: yes)")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare every result with eager (default: yes)")
    p.add_argument("--cache-dir", help="autotune cache folder (instead of TRITONFUSE_AUTOTUNE_CACHE_DIR)")
    p.add_argument("--export", metavar="FILE", help="write the whole cache as a bundle afterwards")
    p.add_argument("--backend", default="tritonfuse", help=argparse.SUPPRESS)  # for debugging
    args = p.parse_args(argv)
    if not args.builtin and not args.target:
        p.error("nothing to do: --no-builtin and no --target")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float16 if args.device == "cuda"
                                                     else torch.float32)
    try:
        targets = builtin_targets(args.device, dtype) if args.builtin else []
        targets += user_targets(args.target, args.shapes, args.device, dtype)
        if args.max_autotune:
            targets = [dataclasses.replace(t, mode="max-autotune") for t in targets]
        backend = _resolve_backend(args.backend)
    except Exception as e:  # noqa: BLE001 - bad target spec or missing compiler
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    configure(args)
    from tritonfuse.runtime import autotuner

    import autotune_cache
    autotuner.stats.reset()
    started = time.perf_counter()
    bar = ProgressBar(len(targets))
    bar.show("starting")
    rows = []
    for target in targets:
        rows.append(run_target(target, backend, dtype, args.check))
        bar.step(target.name)

    cache = autotune_cache.AutotuneCache()
    for row in rows:
        status = "ok  " if row["ok"] else "FAIL"
        print(f"{status} {row['name']}: {row['tuned']} tuned, {row['hits']} cache hits "
              f"({row['seconds']:.1f} s)")
        if not row["ok"]:
            print(f"     {row['error']}")
            print("     " + row["traceback"].strip().replace("\n", "\n     "), file=sys.stderr)
    failed = sum(not r["ok"] for r in rows)
    print(f"targets: {len(rows)}, failed: {failed}")
    print(f"kernels tuned: {autotuner.stats.tuned}")
    print(f"cache hits: {autotuner.stats.cache_hits}")
    from tritonfuse import metrics
    print(f"Triton compilations: {metrics.triton_compilations} (kernels identical to an earlier one: "
          f"{metrics.kernel_dedup_hits})")
    print(f"tuning time: {autotuner.stats.tuning_seconds:.1f} s "
          f"(total {time.perf_counter() - started:.1f} s)")
    print(f"cache: {cache.directory} ({len(cache.keys())} entries)")
    if args.export:
        print(f"exported {cache.export(args.export)} entries to {args.export}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
