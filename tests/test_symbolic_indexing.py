"""Kernels over symbolic sizes index memory as simply as static ones: range-aware index
simplification (tritonfuse/range_simplify.py), slice_scatter / slice_backward lowered as
one pointwise kernel, and tails of symbolic-length rows written with masked vector moves
(never past the row's end)."""
import itertools
import re

import pytest
import sympy
import torch

import tritonfuse
from common import assert_same, rand
from tritonfuse.range_simplify import simplify_with_ranges
from tritonfuse.sym import FloorDiv, ModularIndexing, index_vars
from tritonfuse.testing import run_and_get_code

# primes, a length below one vector and a power of two
LENGTHS = (7, 13, 3, 32)


# ---- the simplifier ---------------------------------------------------------------------

x0, x1, x2, x3 = index_vars("x", 4)
s0 = sympy.Symbol("s0", integer=True, positive=True)
A = 32 * s0 * x0 + 16 * s0 * x1 + 16 * x2 + x3      # (b, 2, s0, 16) flattened

FOLDS = [
    # (index, ranges, folded)
    (FloorDiv(A, 32 * s0), {x0: 3, x1: 2, x2: s0, x3: 16}, x0),
    (ModularIndexing(A, 16, s0), {x0: 3, x1: 2, x2: s0, x3: 16}, x2),
    (ModularIndexing(A, 16 * s0, 2), {x0: 3, x1: 2, x2: s0, x3: 16}, x1),
    (ModularIndexing(x3, 1, 16), {x3: 16}, x3),
    (ModularIndexing(ModularIndexing(x2, 1, s0), 1, s0), {x2: s0}, x2),
    (FloorDiv(x2, s0), {x2: s0}, sympy.Integer(0)),
    (ModularIndexing(16 * s0 * x1 + 16 * x2 + x3, 32 * s0, 2), {x1: 4, x2: s0, x3: 16}, FloorDiv(x1, 2)),
    (ModularIndexing(x2 + 8, 1, s0), {x2: s0 - 8}, x2 + 8),
]
KEPT = [
    # the ranges do not allow folding: the index must stay as it is
    (FloorDiv(x2, s0), {x2: s0 + 1}),
    (ModularIndexing(x2, 1, s0), {x2: 2 * s0}),
    (ModularIndexing(x2 + 8, 1, s0), {x2: s0}),
    (FloorDiv(x1 * s0 + x2, 2 * s0), {x1: 5, x2: s0}),
]


def _values(expr, ranges, size):
    env = {s0: size}
    extents = {v: int(sympy.sympify(n).xreplace(env)) for v, n in ranges.items()}
    for point in itertools.product(*(range(n) for n in extents.values())):
        yield int(expr.xreplace({**env, **dict(zip(extents, point))}))


@pytest.mark.parametrize("case", range(len(FOLDS)))
def test_ranges_fold_divisions_and_modulos(case):
    expr, ranges, folded = FOLDS[case]
    simplified = simplify_with_ranges(expr, ranges)
    assert sympy.expand(simplified - folded) == 0, simplified
    for size in (2, 3, 5, 9):   # sizes are >= 2: Dynamo specializes 0 and 1
        assert list(_values(simplified, ranges, size)) == list(_values(expr, ranges, size))


@pytest.mark.parametrize("case", range(len(KEPT)))
def test_ranges_that_allow_no_fold_keep_the_index_exact(case):
    expr, ranges = KEPT[case]
    simplified = simplify_with_ranges(expr, ranges)
    for size in (2, 3, 5, 9):
        assert list(_values(simplified, ranges, size)) == list(_values(expr, ranges, size))


# ---- generated kernels ----------------------------------------------------------------------

def _cpp_kernels(sources):
    return [s for s in sources if 'extern "C"' in s]


def _divided_vars(source):
    """Loop variables that some `/` or `%` in the C++ applies to (``x3`` or ``x3_lanes``)."""
    found = set()
    for operand in re.findall(r"\(([^()]*)\)\s*[/%]|(\w+)\s*[/%]", source):
        found |= set(re.findall(r"\b([xr]\d+)(?:_lanes)?\b", " ".join(operand)))
    return found


def _inner_vars(source):
    """The vector loop variables of a C++ kernel (those stepped by kVecLanes)."""
    return set(re.findall(r"\b([xr]\d+) \+= tf::kVecLanes", source))


def _repeat_kv_rotary(x, cos):
    """Llama's key path: heads split off a projection, scaled, repeated for grouped-query
    attention (a reshape of an expanded tensor: the copy whose index unflattens over s)."""
    b, s, _ = x.shape
    k = x.view(b, s, 2, 16).transpose(1, 2) * cos
    return k[:, :, None].expand(b, 2, 2, s, 16).reshape(b, 4, s, 16) + 1


def test_symbolic_sizes_index_memory_without_divisions(device):
    compiled = torch.compile(_repeat_kv_rotary, backend="tritonfuse", dynamic=True)
    sources = []
    for length in LENGTHS:
        x, cos = rand(3, length, 32, device=device), rand(length, 16, device=device)
        actual, generated = run_and_get_code(compiled, x, cos)
        assert_same(actual, _repeat_kv_rotary(x, cos))
        sources += generated
    assert tritonfuse.metrics.static_specializations == 0 and tritonfuse.metrics.eager_graphs == 0
    for kernel in _cpp_kernels(sources):
        inner = _inner_vars(kernel)
        assert inner and not inner & _divided_vars(kernel), kernel
        assert "gather" not in kernel, kernel


def _rotate_half_backward(x, w):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1) * w


@pytest.mark.parametrize("dynamic", [False, True])
def test_slice_backward_is_one_pointwise_kernel(device, dynamic):
    compiled = torch.compile(_rotate_half_backward, backend="tritonfuse", dynamic=dynamic)
    for length in LENGTHS[:3]:
        torch._dynamo.reset() if not dynamic else None
        x = rand(2, length, 16, device=device).requires_grad_()
        w = rand(length, 16, device=device)
        actual, sources = run_and_get_code(lambda: compiled(x, w).sum().backward() or x.grad.clone())
        x.grad = None
        _rotate_half_backward(x, w).sum().backward()
        assert_same(actual, x.grad)
        x.grad = None
        assert not any("slice" in op or "masked_index" in op for op in tritonfuse.metrics.fallbacks), \
            tritonfuse.metrics.fallbacks
        for kernel in _cpp_kernels(sources):
            assert "gather" not in kernel and "div_trunc" not in kernel, kernel


def _scatter_slices(base, a, b):
    base = torch.slice_scatter(base, a, dim=1, start=1, end=None, step=3)
    return torch.slice_scatter(base, b, dim=0, start=-2)


@pytest.mark.parametrize("dynamic", [False, True])
def test_slice_scatter_with_steps_and_negative_starts(device, dynamic):
    compiled = torch.compile(_scatter_slices, backend="tritonfuse", dynamic=dynamic)
    for cols in (7, 11, 16):
        base = rand(5, cols, device=device)
        a = rand(5, len(range(1, cols, 3)), device=device)
        b = rand(2, cols, device=device)
        assert_same(compiled(base, a, b), _scatter_slices(base, a, b))
    assert not any("slice" in op for op in tritonfuse.metrics.fallbacks), tritonfuse.metrics.fallbacks


def _write_prefix(out, x):
    out[:, : x.shape[1]].copy_(torch.exp(x) * 2)
    return out


def test_tails_of_symbolic_rows_stay_inside_the_row(device):
    """Rows of a prime length written into the first part of wider rows: the masked tail
    of each row must leave the elements behind it as they were."""
    compiled = torch.compile(_write_prefix, backend="tritonfuse", dynamic=True)
    for cols in (13, 5, 19, 24):
        x = rand(3, cols, device=device)
        out = torch.full((3, cols + 11), float("nan"), device=device)
        expected = _write_prefix(out.clone(), x)
        actual = compiled(out, x)
        assert_same(actual, expected)
        assert torch.isnan(out[:, cols:]).all()


def test_exact_div_of_sizes_holding_a_floor_division():
    """A view's -1 dim over a pool's output length (FloorDiv of an input size): the
    quotient is the polynomial when it cancels, a FloorDiv otherwise, never a rational."""
    from tritonfuse.sym import exact_div
    s, t = sympy.symbols("s t", integer=True, positive=True)
    pooled = FloorDiv(s - 1, 2) + 1
    assert exact_div(pooled, 1) == pooled
    assert exact_div(2 * pooled * t, 2) == sympy.expand(pooled * t)
    assert exact_div(pooled * t, t) == pooled
    odd = exact_div(pooled, 2)
    assert isinstance(odd, FloorDiv), odd
