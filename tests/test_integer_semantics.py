"""Integer arithmetic as eager computes it, at the edges of each dtype.

Signed overflow wraps as two's complement (C++ kernels are built with -fwrapv; int8,
int16 and uint8 scalars are wrapped back to their dtype), shifts by amounts outside
[0, bits) give eager's values, floor division and remainder round like Python,
truncating division and fmod like C, INT_MIN // -1 wraps, and an integer division by
zero raises eager's error on CPU tensors (eager on CUDA raises none)."""
import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import assert_same, check

DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
IDS = [str(d).split(".")[-1] for d in DTYPES]


def _edges(dtype, device):
    info = torch.iinfo(dtype)
    values = [info.min, info.min + 1, -7, -1, 0, 1, 7, info.max - 1, info.max]
    return torch.tensor([v for v in values if info.min <= v <= info.max], dtype=dtype, device=device)


def _all_pairs(dtype, device, nonzero_divisor=False):
    """Every pair of edge values (81 for signed dtypes: a vector tail in every kernel)."""
    values = _edges(dtype, device)
    a, b = values.repeat_interleave(len(values)), values.repeat(len(values))
    if nonzero_divisor:
        a, b = a[b != 0], b[b != 0]
    return a, b


def _arithmetic(a, b):
    return a + b, a - b, a * b, -a, torch.abs(a), (a * 4) // 4 + (a + a) // 2


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_arithmetic_wraps_like_eager(device, dtype):
    check(_arithmetic, *_all_pairs(dtype, device))


@pytest.mark.parametrize("dtype, value", [(torch.int32, 2**30), (torch.int64, 2**62)], ids=["int32", "int64"])
def test_the_overflow_of_the_issue(device, dtype, value):
    check(lambda x: (x * 4) // 4 + (x + x) // 2, torch.full((64,), value, dtype=dtype, device=device))


def _python_rounding(a, b):
    return (a // b, a % b, torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), torch.fmod(a, b))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_division_rounds_like_eager(device, dtype):
    check(_python_rounding, *_all_pairs(dtype, device, nonzero_divisor=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_truncating_division_like_eager(device, dtype):
    def trunc(a, b):
        return torch.div(a, b, rounding_mode="trunc")

    a, b = _all_pairs(dtype, device, nonzero_divisor=True)
    # eager's CPU kernel dies of SIGFPE on INT_MIN / -1 for int32 and int64; its int8 and
    # int16 kernels, its floor division and two's complement all give INT_MIN there
    overflow = (a == torch.iinfo(dtype).min) & (b == -1)
    expected = trunc(a, torch.where(overflow, torch.ones_like(b), b))
    actual = torch.compile(trunc, backend="tritonfuse", dynamic=False)(a, b)
    assert tritonfuse.metrics.eager_graphs == 0
    assert_same(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_shifts_out_of_range_like_eager(device, dtype):
    bits = torch.iinfo(dtype).bits
    amounts = [0, 1, bits - 1, bits, bits + 1, 2 * bits] + ([-1, -bits] if dtype.is_signed else [])
    values, shifts = _edges(dtype, device), torch.tensor(amounts, dtype=dtype, device=device)
    a, s = values.repeat_interleave(len(shifts)), shifts.repeat(len(values))

    def fn(a, s):   # amounts in a tensor, and literal ones (spelled apart by the Triton backend)
        literal = [torch.bitwise_left_shift(a, k) for k in (3, bits + 3)]
        return [a << s, a >> s] + literal + [torch.bitwise_right_shift(a, k) for k in (3, bits + 3)]

    check(fn, a, s)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_negative_and_out_of_range_literals_like_eager(device, dtype):
    """A Python scalar takes the value the tensor's dtype holds (-3 as uint8 is 253): the
    Triton column sent every uint8 graph with a negative literal to eager ("Cannot perform
    a binary operation between an unsigned tensor and a negative scalar")."""
    def fn(x):
        return (x + (-5), x * -2, x // -3, x % -3, torch.fmod(x, -3), x & -3, x | -128,
                torch.where(x > 3, x, -1), torch.div(x, -3, rounding_mode="trunc"))
    check(fn, _edges(dtype, device))


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32], ids=["int8", "uint8", "int32"])
def test_row_values_wrap_like_eager(device, dtype):
    # values computed once per row (after a reduction) are scalars in C++ kernels, where
    # C++ computes int8/uint8 in int
    def fn(a, b):
        top = a.amax(-1)
        return (top * 4) // 4 + (top + top) // 2, top // b.amin(-1), -a.amin(-1), (top << 3) >> 1

    info = torch.iinfo(dtype)
    a = torch.tensor([[info.max, 1, 2, 3], [info.min, 5, 6, 7], [100, 3, 2, 9]], dtype=dtype, device=device)
    b = torch.tensor([[7, 3, 5, 3], [2, 3, 4, 5], [9, 7, 9, 9]], dtype=dtype, device=device)
    if dtype.is_signed:
        b = -b
    check(fn, a, b)


def _reports_zero_division(device) -> bool:
    return device == "cpu"   # eager's CPU kernels raise, its CUDA kernels do not


DIVISIONS = {
    "floor_divide": lambda a, b: a // b + 1,
    "remainder": lambda a, b: a % b,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "fmod": lambda a, b: torch.fmod(a, b) * 2,
}


def _division_by_zero(device, fn, dtype):
    a = torch.arange(1, 41, device=device).to(dtype)
    good, bad = torch.full_like(a, 3), torch.full_like(a, 3)
    bad[37] = 0
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=False)
    assert_same(compiled(a, good), fn(a, good))
    if _reports_zero_division(device):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(a, bad)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            compiled(a, bad)
    else:
        compiled(a, bad)    # no error, as eager; the value at the zero divisor is unspecified
    assert_same(compiled(a, good), fn(a, good))     # still the compiled graph
    assert tritonfuse.metrics.eager_graphs == 0


@pytest.mark.parametrize("op", list(DIVISIONS), ids=list(DIVISIONS))
def test_division_by_zero_behaves_like_eager(device, op):
    _division_by_zero(device, DIVISIONS[op], torch.int32)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int64, torch.uint8],
                         ids=["int8", "int16", "int64", "uint8"])
def test_division_by_zero_of_each_dtype(device, dtype):
    _division_by_zero(device, DIVISIONS["floor_divide"], dtype)


def test_lanes_without_elements_never_report_zero_division(device):
    # the tail of a vector and masked-off lanes (padding, cat) hold no element: a zero
    # loaded there is not a divisor of anything
    def fn(a, b):
        q = a // b
        return torch.cat([q, a % b]), F.pad(q, (3, 5), value=7), F.pad(a, (2, 2)) // F.pad(b, (2, 2), value=1)

    a = torch.arange(-20, 17, device=device, dtype=torch.int32)
    b = torch.arange(1, 38, device=device, dtype=torch.int32) * torch.where(a % 2 == 0, 1, -1)
    check(fn, a, b)
