"""Is a compiled model step right? Compared the way that is meaningful for random-weight
models in low precision.

An element-wise tolerance fails a correct bf16 model (eager itself is off by many ulps
from the exact result) or passes a wrong f32 one. Instead each step is run three times:
in a higher-precision reference (float32 for a bf16 model, float64 for a float32 one,
same weights), in eager at the tested dtype, and compiled. For the output (loss or
logits) and for each parameter's gradient, the relative error

    err(x) = ||x - reference|| / ||reference||        (2-norm over all elements)

of the compiled result must stay within MULTIPLIER times eager's own error, or within the
dtype's floor (relative L2 errors that small are rounding whatever the order of
operations). A wrong index, a dropped term or a transposed gradient gives an error of
order 1; rounding in another order gives one of the size of eager's. Non-finite values
where the reference is finite fail.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

MULTIPLIER = 3.0
# Relative L2 error below which a difference is rounding for that dtype.
FLOOR = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 5e-3}
# The reference is run in a wider type than the tested one.
REFERENCE_DTYPE = {torch.float32: torch.float64, torch.bfloat16: torch.float32,
                   torch.float16: torch.float32}


@contextlib.contextmanager
def exact_float32():
    """No TF32 in a float32 reference on GPUs (cuDNN convolutions use it by default)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@dataclass
class StepOutputs:
    value: torch.Tensor                 # the loss (training) or the logits (inference)
    grads: dict[str, torch.Tensor]      # parameter name -> gradient (training only)


def run_step(module: nn.Module, call: Callable, batch: dict, train: bool) -> StepOutputs:
    """One step through ``call`` (``module`` itself or a compiled version of it); returns
    copies of its results in float32 at least."""
    def keep(t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t.clone()

    if not train:
        with torch.no_grad():
            return StepOutputs(keep(call(batch)), {})
    for p in module.parameters():
        p.grad = None
    loss = call(batch)
    loss.backward()
    grads = {n: keep(p.grad) for n, p in module.named_parameters() if p.grad is not None}
    for p in module.parameters():
        p.grad = None
    return StepOutputs(keep(loss), grads)


def step_callable(module: nn.Module, call: Callable, batch: dict, train: bool) -> Callable[[], None]:
    """A function running one step, for timing: training clears the gradients first."""
    params = list(module.parameters())
    if not train:
        def infer():
            call(batch)
        return infer

    def train_step():
        for p in params:
            p.grad = None
        call(batch).backward()
    return train_step


def rel_error(x: torch.Tensor, reference: torch.Tensor) -> float:
    x64, r64 = x.double(), reference.double()
    if x64.shape != r64.shape:
        return math.inf
    if not bool(torch.isfinite(x64).all()) and bool(torch.isfinite(r64).all()):
        return math.inf
    diff = float((x64 - r64).norm())
    scale = float(r64.norm())
    return diff / scale if scale > 0 else diff


def compare_steps(actual: StepOutputs, eager: StepOutputs, reference: StepOutputs,
                  dtype: torch.dtype) -> dict:
    """{"ok", "output_err", "output_err_eager", "grad_err", "grad_err_eager",
    "failures": [what failed, at most 5]}; errors relative to the reference."""
    floor = FLOOR.get(dtype, 1e-2)
    quantities = [("output", actual.value, eager.value, reference.value)]
    failures = []
    for name, ref in reference.grads.items():
        if name not in actual.grads:
            if name in eager.grads:
                failures.append(f"grad {name}: missing (eager has one)")
            continue
        quantities.append((f"grad {name}", actual.grads[name], eager.grads.get(name, ref), ref))
    extra = sorted(set(actual.grads) - set(reference.grads))
    failures += [f"grad {name}: present, but not in the reference" for name in extra]
    errors = {}
    for name, got, base, ref in quantities:
        err, eager_err = rel_error(got, ref), rel_error(base, ref)
        errors[name] = (err, eager_err)
        if not err <= max(MULTIPLIER * eager_err, floor):
            failures.append(f"{name}: relative error {err:.3g} vs eager's {eager_err:.3g}")
    grads = [v for k, v in errors.items() if k != "output"]
    return {
        "ok": not failures,
        "output_err": errors["output"][0],
        "output_err_eager": errors["output"][1],
        "grad_err": max((e for e, _ in grads), default=None),
        "grad_err_eager": max((e for _, e in grads), default=None),
        "failures": failures[:5],
        "failure_count": len(failures),
    }
