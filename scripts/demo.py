#!/usr/bin/env python
"""tritonfuse demo: compile a transformer block, train one step, check it against eager.

    python scripts/demo.py                  # best device present (cuda, else cpu)
    python scripts/demo.py --device cpu
    python scripts/demo.py --backend inductor   # the same checks for another backend

It compiles ``TransformerBlock`` (scripts/models.py) with
``torch.compile(model, backend="tritonfuse")``, runs forward and backward
(loss = mean(out**2)) and compares the output, the loss, the input gradient and every
parameter gradient with an eager copy of the same model (float32). It prints the kernels
that tritonfuse generated, the ops that ran as aten fallbacks (and why), the number of
fused nodes, and the time of one training step (forward + backward) against eager.

Exit status: 0 when everything matched eager, 1 when something did not (or the compiled
model failed to run), 2 when the backend is not available.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # `python scripts/demo.py` from a checkout, not installed
    sys.path.insert(0, str(_REPO))

# scripts.bench first: it sets the environment that torch must see at import.
from scripts.bench import (BackendUnavailable, pick_device, resolve_backend,  # noqa: E402
                           synchronize, time_samples)
from scripts.models import make_block, make_block_inputs  # noqa: E402

import torch  # noqa: E402

# (batch, seq, dim, heads) per device type: CPU small enough for a 2-core machine to
# compile and run everything in about a minute.
SIZES = {"cpu": (4, 64, 128, 4), "cuda": (8, 512, 768, 12)}
# (atol, rtol); atol is relative to the largest |value| of each reference tensor, so that
# tiny gradients are held to the same standard as large ones.
TOLERANCES = {"cpu": (1e-4, 1e-3), "cuda": (1e-3, 1e-2)}
# A gradient's scale is at least this fraction of the largest gradient's (see check()).
GRAD_SCALE_FLOOR = 1e-2
DEFAULT_STEPS = {"cpu": 20, "cuda": 50}
WIDTH = 78


def loss_fn(out: torch.Tensor) -> torch.Tensor:
    return out.float().pow(2).mean()


@dataclass
class Check:
    name: str
    shape: tuple
    max_abs_err: float
    scale: float  # largest |value| of the eager tensor
    ok: bool
    why: str = ""


def check(name: str, expected: torch.Tensor | None, actual: torch.Tensor | None,
          atol: float, rtol: float, scale_floor: float = 0.0) -> Check:
    """|actual - expected| <= atol * scale + rtol * |expected|, elementwise, where scale is
    max|expected| but at least ``scale_floor`` (a gradient that is zero in exact arithmetic,
    like the key bias's, is float32 rounding noise; it is judged on its siblings' scale)."""
    if expected is None or actual is None:
        missing = "eager" if expected is None else "compiled"
        return Check(name, (), float("inf"), 0.0, False, f"no {missing} gradient")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return Check(name, tuple(expected.shape), float("inf"), 0.0, False,
                     f"{tuple(actual.shape)} {actual.dtype} vs eager {tuple(expected.shape)} "
                     f"{expected.dtype}")
    e, a = expected.detach().double(), actual.detach().double()
    scale = float(e.abs().max()) if e.numel() else 0.0
    diff = (a - e).abs().nan_to_num(nan=float("inf"))
    err = float(diff.max()) if diff.numel() else 0.0
    bound = atol * max(scale, scale_floor, 1e-30) + rtol * e.abs()
    bad = int((diff > bound).sum())
    why = f"{bad} of {e.numel()} elements differ" if bad else ""
    return Check(name, tuple(expected.shape), err, scale, bad == 0, why)


def section(title: str) -> None:
    print()
    print(title)
    print("-" * len(title))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda if available, else cpu")
    p.add_argument("--backend", default="tritonfuse",
                   help="torch.compile backend to demo (default tritonfuse)")
    p.add_argument("--batch", type=int, help="batch size (default: per device)")
    p.add_argument("--seq", type=int, help="sequence length (default: per device)")
    p.add_argument("--dim", type=int, help="model width (default: per device)")
    p.add_argument("--heads", type=int, help="attention heads (default: per device)")
    p.add_argument("--steps", type=int, help="timed training steps, median taken "
                   f"(default cpu {DEFAULT_STEPS['cpu']}, cuda {DEFAULT_STEPS['cuda']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-graph-cache", action="store_true",
                   help="compile from scratch instead of loading tritonfuse's on-disk graph cache")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    dev = "cuda" if device.type == "cuda" else "cpu"
    batch, seq, dim, heads = (v if v is not None else d
                              for v, d in zip((args.batch, args.seq, args.dim, args.heads), SIZES[dev]))
    atol, rtol = TOLERANCES[dev]
    steps = args.steps or DEFAULT_STEPS[dev]
    torch.set_float32_matmul_precision("highest")  # no TF32: compare float32 with float32

    title = f"{args.backend} demo: TransformerBlock forward + backward vs eager"
    print(title)
    print("=" * max(len(title), WIDTH))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"  {'device':<10} {device.type} ({name})")
    print(f"  {'torch':<10} {torch.__version__}")
    print(f"  {'model':<10} TransformerBlock(dim={dim}, heads={heads}, mlp_ratio=4), float32")
    print(f"  {'input':<10} [{batch}, {seq}, {dim}], loss = mean(out**2)")

    try:
        backend = resolve_backend(args.backend)
    except BackendUnavailable as exc:
        print(f"\nERROR: the {args.backend} backend is not available: {exc}")
        return 2
    uses_tritonfuse = args.backend == "tritonfuse"
    if uses_tritonfuse:
        import tritonfuse.config
        import tritonfuse.metrics
        if args.no_graph_cache:
            tritonfuse.config.graph_cache = False
        tritonfuse.metrics.reset()

    eager_model = make_block(dim, heads, device, seed=args.seed)
    compiled_src = copy.deepcopy(eager_model)
    x_eager = make_block_inputs(batch, seq, dim, device, seed=args.seed + 1, requires_grad=True)
    x_comp = x_eager.detach().clone().requires_grad_(True)

    # --- compile + one training step -----------------------------------------------------
    compiled = torch.compile(compiled_src, backend=backend)
    t0 = time.perf_counter()
    try:
        out_comp = compiled(x_comp)
        loss_comp = loss_fn(out_comp)
        loss_comp.backward()
        synchronize(device)
    except Exception as exc:
        traceback.print_exc()
        print(f"\nFAIL: the compiled model did not run: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return 1
    compile_s = time.perf_counter() - t0
    print(f"  {'compile':<10} {compile_s:.1f} s (first forward + backward, compiles included)")

    out_eager = eager_model(x_eager)
    loss_eager = loss_fn(out_eager)
    loss_eager.backward()

    # --- correctness ----------------------------------------------------------------------
    checks = [check("output", out_eager, out_comp, atol, rtol),
              check("loss", loss_eager, loss_comp, atol, rtol)]
    grads = [("grad input", x_eager.grad, x_comp.grad)]
    comp_params = dict(compiled_src.named_parameters())
    grads += [(f"grad {pname}", p.grad, comp_params[pname].grad)
              for pname, p in eager_model.named_parameters()]
    grad_floor = GRAD_SCALE_FLOOR * max(float(g.abs().max()) for _, g, _ in grads if g is not None)
    checks += [check(gname, g_eager, g_comp, atol, rtol, grad_floor)
               for gname, g_eager, g_comp in grads]

    section(f"Correctness vs eager (atol {atol:g} x max|eager|, rtol {rtol:g}; gradients: "
            f"max|eager| >= {grad_floor:.1e})")
    name_w = max(len(c.name) for c in checks)
    for c in checks:
        shape = "[" + ", ".join(str(s) for s in c.shape) + "]"
        status = "ok" if c.ok else f"MISMATCH ({c.why})"
        print(f"  {c.name:<{name_w}}  {shape:<14} max err {c.max_abs_err:9.2e}  "
              f"max|eager| {c.scale:9.2e}  {status}")
    mismatched = [c for c in checks if not c.ok]

    # --- what the compiler did ------------------------------------------------------------
    if uses_tritonfuse:
        m = tritonfuse.metrics
        kernels = list(m.generated_kernels)
        section(f"Kernels generated ({m.generated_kernel_count})")
        for i, k in enumerate(kernels):
            print(f"  {i:3d}  {k}")
        if m.cached_kernels:
            print(f"  {len(m.cached_kernels)} more from {m.graph_cache_hits} graph(s) loaded from the on-disk "
                  "cache (--no-graph-cache compiles from scratch):")
            for i, k in enumerate(m.cached_kernels):
                print(f"  {i:3d}  {k}")
        fallbacks = dict(m.fallbacks)
        section(f"Fallbacks: ops run as aten calls ({len(fallbacks)})")
        op_w = max((len(str(op)) for op in fallbacks), default=0)
        for op, reason in fallbacks.items():
            print(f"  {str(op):<{op_w}}  {reason}")
        if not fallbacks:
            print("  (none)")
        section("Fusion")
        print(f"  {'fused nodes':<20} {m.fused_node_count}")
        print(f"  {'outer-loop fusions':<20} {len(m.outer_loop_fusions)}")
        print(f"  {'graph cache hits':<20} {m.graph_cache_hits}")
        print(f"  {'aot cache hits':<20} {m.aot_cache_hits}")
    else:
        section("Compiler metrics")
        print(f"  (tritonfuse.metrics counts tritonfuse compiles only; backend is {args.backend})")

    # --- speed ----------------------------------------------------------------------------
    def train_step(model, x):
        def step():
            model.zero_grad(set_to_none=True)
            x.grad = None
            loss_fn(model(x)).backward()
        return step

    eager_samples = time_samples(train_step(eager_model, x_eager), steps, device)
    comp_samples = time_samples(train_step(compiled, x_comp), steps, device)
    eager_ms, comp_ms = statistics.median(eager_samples), statistics.median(comp_samples)
    counts = sorted({len(eager_samples), len(comp_samples)})
    section(f"Speed: one training step (forward + backward), median of "
            f"{' / '.join(str(c) for c in counts)} steps")
    print(f"  {'eager':<12} {eager_ms:9.3f} ms")
    verdict = "faster" if comp_ms < eager_ms else "slower"
    ratio = eager_ms / comp_ms
    label = "compiled" if args.backend == "eager" else args.backend
    print(f"  {label:<12} {comp_ms:9.3f} ms   speed-up {ratio:.2f}x "
          f"({verdict} than eager)")

    # --- verdict --------------------------------------------------------------------------
    print()
    print("=" * WIDTH)
    if mismatched:
        print(f"FAIL: {len(mismatched)} of {len(checks)} tensors differ from eager: "
              + ", ".join(c.name for c in mismatched))
        return 1
    print(f"PASS: output, loss and all {len(checks) - 2} gradients match eager "
          f"(speed-up {ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
