"""Run ops of torch's OpInfo table (``op_db``) through a ``torch.compile`` backend and
say what happened, op by op. Shared by ``tests/test_opinfo.py`` (a fast sample, with
expectations) and ``scripts/opinfo_sweep.py`` (every op, tritonfuse and Inductor side by
side).

Each sample of an op runs twice, compiled and eagerly, in two forms:

    alone       fn(*tensors) = op(*sample)
    sandwiched  fn(*tensors) = op(*[x * 1.0 for floating x]) then y + 0.0 on floating outputs

The sandwich puts generated pointwise kernels on both sides of the op, so a fallback's
outputs feed kernels and kernels feed fallbacks. What the alone run generated says how the
op itself was compiled: kernels, or only aten fallbacks, or nothing (views).

Outcomes, from best to worst (an op's outcome is the worst of its cases):

    pass       results match eager and the op generated kernels
    views      results match; the op needed no kernel and no fallback (views, aliases)
    fallback   results match; the op ran only as aten fallbacks
    skip       eager itself rejects every sample (no case to compare)
    eager      a graph failed to compile and ran eagerly (tritonfuse.metrics.eager_graphs), or
               the backend raised and Dynamo ran the op outside any graph
    wrong      a result differs from eager's
    crash      the compiled call raised
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import traceback
import warnings

import torch
import torch.utils._pytree as pytree

GOOD = ("pass", "views", "fallback")
OUTCOME_ORDER = ("pass", "views", "fallback", "skip", "eager", "wrong", "crash")

# Ops whose result is random or undefined: compared by shape and dtype only (for both
# compilers alike). Draws may differ from eager's (Inductor has its own RNG stream).
UNCHECKED_VALUES = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "bernoulli", "multinomial", "normal", "normal.number_mean", "normal.in_place", "uniform", "cauchy",
    "exponential", "geometric", "log_normal", "rand_like", "randn_like", "randint_like", "randn", "randint",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d", "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train", "nn.functional.rrelu",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "svd_lowrank", "pca_lowrank",
}

# Outputs that hold no result: the attention kernels' philox seed and offset are
# torch.empty when dropout_p is 0 (uninitialized memory in eager too). Compared by shape
# and dtype only; the attention output and logsumexp are compared.
UNCHECKED_OUTPUTS = {
    "torch.ops.aten._efficient_attention_forward": {2, 3},
    "torch.ops.aten._flash_attention_forward": {2, 3},
}

# Per dtype: (atol, rtol) below which a difference from eager is rounding, not a bug.
# float32 is looser than assert_close's default (1e-5, 1.3e-6): a fused kernel may sum in
# another order than eager, and transcendental functions differ in the last ulps.
DEFAULT_TOLERANCE = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def op_table():
    _stand_in_for_expecttest()
    from torch.testing._internal.common_methods_invocations import op_db
    return op_db


def _stand_in_for_expecttest():
    """torch.testing._internal imports ``expecttest`` (the ``[test]`` extra installs it) only
    for its TestCase base class and ACCEPT flag, neither of which the sweep uses: where it
    is missing (a GPU box with only torch), a stand-in lets the OpInfo table load."""
    import sys
    import types
    import unittest
    try:
        import expecttest  # noqa: F401
        return
    except ImportError:
        pass
    stand_in = types.ModuleType("expecttest")
    stand_in.TestCase, stand_in.ACCEPT = unittest.TestCase, False
    sys.modules["expecttest"] = stand_in


def ops_by_name():
    return {op_name(op): op for op in op_table()}


@dataclasses.dataclass
class CaseResult:
    """One sample of one op, one form (alone or sandwiched), one compiler."""
    outcome: str
    sandwiched: bool
    kernels: int = 0
    fallbacks: tuple = ()
    graphs: int = 0
    detail: str = ""


@dataclasses.dataclass
class OpResult:
    name: str
    dtype: str
    outcome: str
    cases: list
    detail: str = ""

    def fallback_ops(self):
        return sorted({f for case in self.cases for f in case.fallbacks})


# ---- compilers ------------------------------------------------------------------------

class Compiler:
    """A torch.compile backend plus how to read what it generated."""
    name = "?"

    def __init__(self):
        self.graphs = 0
        self.errors = []   # what the backend raised back to Dynamo (which then breaks the graph)

    def backend(self):
        inner = self.inner_backend()

        def counting(gm, example_inputs, **kwargs):
            self.graphs += 1
            try:
                return inner(gm, example_inputs, **kwargs)
            except Exception as error:
                self.errors.append(error)
                raise
        return counting

    def reset(self):
        self.graphs = 0
        self.errors = []
        torch._dynamo.reset()

    def inner_backend(self):
        raise NotImplementedError

    def kernels(self) -> int:
        raise NotImplementedError

    def fallbacks(self) -> tuple:
        return ()

    def eager_graphs(self) -> int:
        return 0


class TritonfuseCompiler(Compiler):
    name = "tritonfuse"

    def __init__(self, cpu_backend=None):
        super().__init__()
        self.cpu_backend = cpu_backend

    def inner_backend(self):
        from tritonfuse import config
        from tritonfuse.backend import tritonfuse_backend
        if self.cpu_backend is not None:
            config.cpu_backend = self.cpu_backend
        return tritonfuse_backend

    def reset(self):
        from tritonfuse import metrics
        super().reset()
        metrics.reset()

    def kernels(self):
        from tritonfuse import metrics
        return metrics.generated_kernel_count + len(metrics.cached_kernels)

    def fallbacks(self):
        from tritonfuse import metrics
        return tuple(sorted(metrics.fallbacks))

    def eager_graphs(self):
        from tritonfuse import metrics
        return metrics.eager_graphs


class InductorCompiler(Compiler):
    """The reference. Its CPU code is C++ for both CPU columns of the device matrix."""
    name = "inductor"

    def inner_backend(self):
        from torch._inductor.compile_fx import compile_fx
        return compile_fx

    def reset(self):
        from torch._inductor import metrics
        super().reset()
        metrics.reset()

    def kernels(self):
        from torch._inductor import metrics
        return metrics.generated_kernel_count


# ---- samples and the function under test --------------------------------------------

def samples_for(op, device, dtype, limit):
    """The first ``limit`` samples of ``op`` (deterministic: a fixed seed)."""
    torch.manual_seed(0)
    samples = []
    try:
        for sample in op.sample_inputs(device, dtype, requires_grad=False):
            samples.append(sample)
            if len(samples) >= limit:
                break
    except Exception:   # a sample generator that cannot make this dtype
        pass
    return samples


def _is_floating(value):
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def build_case(op, sample, sandwiched):
    """(fn, tensor inputs): ``fn(*tensors)`` calls the op on the sample, the sample's
    tensors being fn's inputs and everything else constants baked into the graph."""
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    operator = op.op

    def fn(*tensors):
        values = list(leaves)
        for position, tensor in zip(positions, tensors):
            values[position] = tensor * 1.0 if sandwiched and _is_floating(tensor) else tensor
        first, args, kwargs = pytree.tree_unflatten(values, spec)
        result = operator(first, *args, **kwargs)
        if sandwiched:
            result = pytree.tree_map(lambda y: y + 0.0 if _is_floating(y) else y, result)
        return result
    return fn, [leaves[i] for i in positions]


def _clone(tensors):
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in tensors]


# ---- comparison -------------------------------------------------------------------------

# OpInfo tolerance overrides of tests that compare the op computed another way (a
# decomposition, a compiler, other strides) with eager: the fair guide for a compiler.
_TOLERANCE_SOURCES = {"TestInductorOpInfo", "TestDecomp", "TestCommon", "TestEagerFusionOpInfo", None}


def tolerance(op, dtype, device_type="cpu"):
    """(atol, rtol) for ``op`` in ``dtype``: the dtype's default, or looser where the
    OpInfo declares a looser tolerance for a test comparing it with eager."""
    atol, rtol = DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    for info in getattr(op, "decorators", ()):
        if getattr(info, "cls_name", None) not in _TOLERANCE_SOURCES:
            continue
        if getattr(info, "device_type", None) not in (None, device_type):
            continue
        for inner in getattr(info, "decorators", ()):
            override = getattr(inner, "d", None)   # toleranceOverride / precisionOverride: {dtype: ...}
            if not isinstance(override, dict) or dtype not in override:
                continue
            found = override[dtype]
            if isinstance(found, (int, float)):      # precisionOverride: an atol
                atol = max(atol, float(found))
            else:
                atol, rtol = max(atol, found.atol), max(rtol, found.rtol)
    return atol, rtol


def _sizes_as_tuples(value):
    """torch.Size as a plain tuple: Dynamo returns a tuple where eager gives a Size (equal values)."""
    if isinstance(value, torch.Size):
        return tuple(value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_sizes_as_tuples(v) for v in value)
    return value


def _at_least_rounding_of(result_dtype, atol, rtol):
    """The tolerance for one result: the op's, but never tighter than rounding in the result's
    own dtype. An integer op's tolerance is exact, yet sin or true_divide of integers gives
    float32 results that a kernel may round in the last ulp as any float32 op does."""
    own_atol, own_rtol = DEFAULT_TOLERANCE.get(result_dtype, (0.0, 0.0))
    return max(atol, own_atol), max(rtol, own_rtol)


def compare(actual, expected, atol, rtol, values=True, unchecked_outputs=()) -> str:
    """'' when ``actual`` matches ``expected``, else what differs (the values of the
    outputs numbered in ``unchecked_outputs`` are not compared)."""
    actual_leaves, actual_spec = pytree.tree_flatten(_sizes_as_tuples(actual))
    expected_leaves, expected_spec = pytree.tree_flatten(_sizes_as_tuples(expected))
    if actual_spec != expected_spec:
        return f"structure {actual_spec} != {expected_spec}"
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        where = f"output {i}: " if len(expected_leaves) > 1 else ""
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return f"{where}{type(a).__name__} instead of a tensor"
            if a.shape != e.shape or a.dtype != e.dtype or a.device != e.device:
                return f"{where}{tuple(a.shape)} {a.dtype} {a.device} != {tuple(e.shape)} {e.dtype} {e.device}"
            if not values or e.layout != torch.strided or i in unchecked_outputs:
                continue
            leaf_atol, leaf_rtol = _at_least_rounding_of(e.dtype, atol, rtol)
            try:
                torch.testing.assert_close(a, e, atol=leaf_atol, rtol=leaf_rtol, equal_nan=True)
            except AssertionError as error:
                lines = [line for line in str(error).splitlines() if line.strip()]
                return where + "; ".join(lines[1:4])
        elif isinstance(e, float) and isinstance(a, float):
            if not (a == e or (math.isnan(a) and math.isnan(e)) or abs(a - e) <= atol + rtol * abs(e)):
                return f"{where}{a} != {e}"
        elif values and a != e:
            return f"{where}{a!r} != {e!r}"
    return ""


# ---- running ----------------------------------------------------------------------------

class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _quiet():
    """Silence the compilers' logs and warnings; yield the list of tritonfuse's warnings."""
    loggers = [logging.getLogger(n) for n in ("tritonfuse", "torch._dynamo", "torch._inductor")]
    levels = [logger.level for logger in loggers]
    collect = _Collect()
    loggers[0].addHandler(collect)
    propagate = loggers[0].propagate
    loggers[0].propagate = False
    for logger in loggers[1:]:
        logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield collect.messages
        finally:
            loggers[0].removeHandler(collect)
            loggers[0].propagate = propagate
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


def run_case(compiler: Compiler, op, sample, sandwiched, atol, rtol) -> CaseResult | None:
    """One compiled call against eager; None if eager itself rejects the sample."""
    fn, inputs = build_case(op, sample, sandwiched)
    check_values = op_name(op) not in UNCHECKED_VALUES
    compiler.reset()
    with _quiet() as logged:
        try:
            torch.manual_seed(0)
            expected = fn(*_clone(inputs))
        except Exception:
            return None
        compiled = torch.compile(fn, backend=compiler.backend(), dynamic=False)
        try:
            torch.manual_seed(0)
            actual = compiled(*_clone(inputs))
        except Exception as error:
            detail = _first_line(error)
            if os.environ.get("TRITONFUSE_OPINFO_TRACEBACK"):
                detail += "\n" + traceback.format_exc()
            return CaseResult("crash", sandwiched, detail=detail)
    result = CaseResult("pass", sandwiched, kernels=compiler.kernels(), fallbacks=compiler.fallbacks(),
                        graphs=compiler.graphs)
    unchecked = UNCHECKED_OUTPUTS.get(op_name(op), ())
    mismatch = compare(actual, expected, atol, rtol, values=check_values, unchecked_outputs=unchecked)
    if mismatch and check_values and _matches_float32_reference(fn, inputs, actual, expected, atol, rtol, unchecked):
        mismatch = ""
        result.detail = "matches the op computed in float32 (eager rounds to 16 bits inside the op)"
    if mismatch:
        result.outcome, result.detail = "wrong", mismatch
    elif compiler.errors:
        result.outcome = "eager"
        result.detail = f"the backend raised {_first_line(compiler.errors[0])}: Dynamo ran the op outside the graph"
    elif compiler.eager_graphs():
        reasons = " / ".join(m.splitlines()[0][:300] for m in logged) or "no reason logged"
        result.outcome, result.detail = "eager", f"{compiler.eager_graphs()} graph(s) ran eagerly: {reasons}"
    elif not sandwiched:
        if result.kernels == 0:
            result.outcome = "fallback" if result.fallbacks else "views"
    return result


def _matches_float32_reference(fn, inputs, actual, expected, atol, rtol, unchecked) -> bool:
    """For float16/bfloat16 inputs: whether ``actual`` matches the op computed from the same
    inputs upcast to float32, its results cast back to eager's dtypes. The reference that
    Inductor's OpInfo test uses for 16-bit dtypes: eager's CUDA cumsum or cross round every
    partial result to 16 bits, a compiler that keeps float32 inside the op is closer."""
    low = (torch.float16, torch.bfloat16)
    if not any(isinstance(t, torch.Tensor) and t.dtype in low for t in inputs):
        return False
    upcast = [t.float() if isinstance(t, torch.Tensor) and t.dtype in low else t for t in _clone(inputs)]
    try:
        torch.manual_seed(0)
        reference = fn(*upcast)
        reference_leaves = pytree.tree_leaves(reference)
        expected_leaves, spec = pytree.tree_flatten(expected)
        if len(reference_leaves) != len(expected_leaves):
            return False
        reference = pytree.tree_unflatten(
            [r.to(e.dtype) if isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) else r
             for r, e in zip(reference_leaves, expected_leaves)], spec)
    except Exception:   # the op has no float32 form of this sample
        return False
    return not compare(actual, reference, atol, rtol, unchecked_outputs=unchecked)


def run_op(compiler: Compiler, op, device, dtype, samples=2, sandwich=True) -> OpResult:
    """Every chosen sample of ``op`` alone and (if ``sandwich``) sandwiched."""
    atol, rtol = tolerance(op, dtype, torch.device(device).type)
    cases = []
    for sample in samples_for(op, device, dtype, samples):
        for sandwiched in ((False, True) if sandwich else (False,)):
            case = run_case(compiler, op, sample, sandwiched, atol, rtol)
            if case is not None:
                cases.append(case)
    dtype_name = str(dtype).replace("torch.", "")
    if not cases:
        return OpResult(op_name(op), dtype_name, "skip", cases, "no sample that eager accepts")
    worst = max(cases, key=lambda c: OUTCOME_ORDER.index(_op_level(c)))
    outcome = _op_level(worst)
    if outcome in GOOD:
        alone = [c.outcome for c in cases if not c.sandwiched]
        outcome = min(alone, key=GOOD.index) if alone else outcome
    return OpResult(op_name(op), dtype_name, outcome, cases, worst.detail)


def _op_level(case):
    # a sandwiched case that passed says nothing about kernels of the op itself
    return "views" if case.sandwiched and case.outcome == "pass" else case.outcome


def supported_dtypes(op, device_type):
    return set(op.supported_dtypes(device_type))
