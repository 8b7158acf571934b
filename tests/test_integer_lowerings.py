"""The OpInfo sweep's last integer lowering gaps: gcd, lcm, integer pow (a tensor exponent,
a scalar base: __rpow__) and tril_indices / triu_indices. Each is compared with eager exactly
on every column of the device matrix and must leave no aten call behind
(lowering/integer_math.py, lowering/pointwise.py's pow, lowering/trilu_indices.py; the loops
in cpu_backend/include/tf_int.h and runtime/triton_integer.py)."""
import pytest
import torch

import tritonfuse
from common import check, kernel_count, rand

INT64_MIN = torch.iinfo(torch.int64).min


def _kernels_only():
    assert tritonfuse.metrics.fallbacks == {}, tritonfuse.metrics.fallbacks
    assert kernel_count() > 0


def _pairs(dtype, device):
    """Random operands with zeros, signs and the dtype's extremes (lcm-safe: eager's
    INT_MIN / -1 traps)."""
    torch.manual_seed(0)
    info = torch.iinfo(dtype)
    low, high = (info.min, info.max) if info.bits <= 16 else (-1000, 1000)
    a = rand(6, 7, dtype=dtype, device=device, low=max(low, -1000), high=min(high, 1000))
    b = rand(6, 7, dtype=dtype, device=device, low=max(low, -1000), high=min(high, 1000))
    a[0, :4] = torch.tensor([0, 0, 12, info.max], dtype=dtype)
    b[0, :4] = torch.tensor([0, 18, 0, 2], dtype=dtype)
    if dtype.is_signed:
        a[1, :4] = torch.tensor([-12, 40, info.min, info.min], dtype=dtype)
        b[1, :4] = torch.tensor([-18, 5, 0, 2], dtype=dtype)   # int8 lcm(40, 5): C++ computes 200 in int
    return a, b


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_lcm(device, dtype):
    a, b = _pairs(dtype, device)
    check(lambda x, y: (torch.gcd(x, y), torch.lcm(x, y), torch.gcd(x, y[:1] * 3)), a, b)
    _kernels_only()


def test_gcd_of_int64_min(device):
    """|INT64_MIN| stays INT64_MIN in eager's loop: gcd(INT64_MIN, 6) is -2."""
    a = torch.tensor([INT64_MIN, INT64_MIN, INT64_MIN, 6, 7, 2 ** 40 + 1], device=device)
    b = torch.tensor([0, 6, INT64_MIN, INT64_MIN, -1, 2 ** 40 + 3], device=device)
    check(lambda x, y: (torch.gcd(x, y), torch.gcd(y, x)), a, b)
    _kernels_only()


def test_lcm_wraps_in_int64(device):
    a = torch.tensor([2 ** 40 + 1, INT64_MIN, INT64_MIN, -(2 ** 33)], device=device)
    b = torch.tensor([2 ** 40 + 3, 0, 2, 3 ** 25], device=device)
    check(lambda x, y: torch.lcm(x, y), a, b)
    _kernels_only()


def test_gcd_int32_with_int64(device):
    """Type promotion: an int32 and an int64 operand compute in int64."""
    a, b = _pairs(torch.int64, device)
    check(lambda x, y: (torch.gcd(x.int(), y), torch.lcm(x, y.int())), a, b)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_pow_tensor_exponent(device, dtype):
    """Repeated squaring, wrapping; negative exponents give 0 but for bases 1 and -1."""
    torch.manual_seed(0)
    signed = dtype.is_signed
    base = rand(5, 9, dtype=dtype, device=device, low=-4 if signed else 0, high=5)
    exponent = rand(5, 9, dtype=dtype, device=device, low=-5 if signed else 0, high=70)
    base[0, :6] = torch.tensor([0, 0, 1, 1, 2, 3], dtype=dtype)
    exponent[0, :6] = torch.tensor([0, 7, 0, 100, 63, 41], dtype=dtype)
    if signed:
        base[1, :6] = torch.tensor([0, 1, -1, -1, 2, -1], dtype=dtype)
        exponent[1, :6] = torch.tensor([-1, -7, -3, -4, -1, torch.iinfo(dtype).min], dtype=dtype)
    check(lambda x, e: (torch.pow(x, e), x ** e[:1], torch.pow(x, e[0, 1])), base, exponent)
    _kernels_only()


def test_pow_mixed_integer_dtypes(device):
    torch.manual_seed(0)
    base = rand(4, 6, dtype=torch.int32, device=device, low=-6, high=7)
    exponent = rand(4, 6, dtype=torch.int64, device=device, low=-2, high=40)
    check(lambda x, e: (torch.pow(x, e), torch.pow(e, x.to(torch.int8).abs())), base, exponent)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_rpow_scalar_base(device, dtype):
    """__rpow__: a Python int base (cast to the exponent's dtype), an integer tensor exponent."""
    torch.manual_seed(0)
    signed = dtype.is_signed
    exponent = rand(4, 8, dtype=dtype, device=device, low=-4 if signed else 0, high=66)
    if signed:
        check(lambda e: (2 ** e, (-1) ** e, 0 ** e, 1 ** e, (-3) ** e, 7 ** (e + 1)), exponent)
    else:
        check(lambda e: (2 ** e, 0 ** e, 1 ** e, 3 ** e), exponent)
    _kernels_only()


def test_pow_large_scalar_exponent(device):
    """An integer scalar exponent beyond the unrolled ones (0 .. 8) runs the loop too."""
    torch.manual_seed(0)
    base = rand(3, 5, dtype=torch.int64, device=device, low=-7, high=8)
    check(lambda x: (x ** 13, torch.pow(x.int(), 31), x ** 64), base)
    _kernels_only()


# ---- tril_indices / triu_indices ----------------------------------------------------------

TRILU_CASES = [
    (4, 4, 0), (5, 3, 0), (3, 5, 0), (5, 3, 1), (3, 5, -1), (6, 4, -2), (4, 6, 2), (7, 7, -6), (7, 7, 6),
    (4, 5, 9), (4, 5, -9), (1, 1, 0), (1, 6, 3), (6, 1, -3), (33, 70, -5), (70, 33, 4), (200, 150, 17),
]


@pytest.mark.parametrize("row,col,offset", TRILU_CASES, ids=[f"{r}x{c}{o:+d}" for r, c, o in TRILU_CASES])
def test_trilu_indices(device, row, col, offset):
    x = torch.zeros(1, device=device)
    check(lambda v: (torch.tril_indices(row, col, offset, device=v.device),
                     torch.triu_indices(row, col, offset, device=v.device)), x)
    _kernels_only()


@pytest.mark.parametrize("row,col,offset", [(0, 4, 0), (4, 0, 1), (0, 0, -2), (3, 4, -3), (3, 4, 4)])
def test_trilu_indices_empty(device, row, col, offset):
    """No rows, no columns, or an offset that leaves one triangle empty."""
    x = torch.zeros(1, device=device)
    check(lambda v: (torch.tril_indices(row, col, offset, device=v.device),
                     torch.triu_indices(row, col, offset, device=v.device)), x)
    assert tritonfuse.metrics.fallbacks == {}, tritonfuse.metrics.fallbacks


def test_trilu_indices_int32_in_a_graph(device):
    """int32 indices, and the indices feeding an indexing kernel."""
    x = rand(6, 6, device=device)
    check(lambda v: (torch.tril_indices(6, 6, -1, dtype=torch.int32, device=v.device),
                     torch.triu_indices(5, 7, 2, dtype=torch.int32, device=v.device),
                     v[tuple(torch.triu_indices(6, 6, 1, device=v.device))] * 2), x)
    _kernels_only()
