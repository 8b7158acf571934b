"""Scans: cumsum, cumprod, logcumsumexp, compared with eager on every column of the device
matrix, and fused with what feeds them and what reads them."""
import pytest
import torch

import tritonfuse
from common import assert_same, check, kernel_count, rand
from tritonfuse.runtime import heuristics


def _no_fallbacks():
    assert tritonfuse.metrics.fallbacks == {}, tritonfuse.metrics.fallbacks
    assert kernel_count() > 0


SHAPES_AND_DIMS = [((17,), 0), ((4, 33), 1), ((4, 33), 0), ((3, 5, 7), 1), ((3, 5, 7), -1), ((2, 1, 6), 1)]


@pytest.mark.parametrize("shape,dim", SHAPES_AND_DIMS)
def test_cumsum_cumprod_logcumsumexp(device, shape, dim):
    torch.manual_seed(0)
    x = rand(*shape, device=device, low=-1, high=1)
    check(lambda a: (torch.cumsum(a, dim), torch.cumprod(a + 1.5, dim), torch.logcumsumexp(a, dim)), x,
          atol=1e-5, rtol=1e-5)
    _no_fallbacks()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_scans_accumulate_in_int64(device, dtype):
    x = rand(5, 12, dtype=dtype, device=device)
    check(lambda a: (torch.cumsum(a, 1), torch.cumprod(a, 0)), x)
    _no_fallbacks()


def test_bfloat16_scans_accumulate_in_float32(device):
    torch.manual_seed(0)
    x = rand(3, 40, dtype=torch.bfloat16, device=device, low=-1, high=1)
    check(lambda a: (torch.cumsum(a, -1), torch.logcumsumexp(a, -1), torch.cumsum(a, 1, dtype=torch.float32)), x)
    _no_fallbacks()


def test_logcumsumexp_infinities_and_nan(device):
    inf = float("inf")
    x = torch.tensor([[-inf, -inf, 0.5, -inf, inf, 1.0, inf],
                      [1.0, float("nan"), 2.0, -inf, 3.0, 0.0, -1.0]], device=device)
    check(lambda a: torch.logcumsumexp(a, 1), x)
    _no_fallbacks()


def test_long_rows_loop_with_a_carried_prefix(device, monkeypatch):
    """Rows longer than a block (forced small here for the Triton backend) scan block by
    block, each combined with the total of the blocks before."""
    monkeypatch.setattr(heuristics, "PERSISTENT_REDUCTION_MAX_RBLOCK", 16)
    torch.manual_seed(0)
    x = rand(3, 70, device=device, low=-1, high=1)
    check(lambda a: (torch.cumsum(a, 1), torch.cumprod(a * 0.1 + 1, 1), torch.logcumsumexp(a, 1)), x,
          atol=1e-5, rtol=1e-5)
    _no_fallbacks()


def test_scan_is_one_kernel_with_its_producer_and_consumer(device):
    torch.manual_seed(0)
    x = rand(6, 50, device=device)
    check(lambda a: torch.cumsum(torch.sigmoid(a) * 2, -1) * 2, x, atol=1e-5, rtol=1e-5)
    _no_fallbacks()
    assert kernel_count() == 1


def test_outer_dim_scan_computes_its_producer(device):
    """A scan along an outer dim takes its producer into its kernel. (Its consumers get
    their own: their loops run over the scanned dim first, the kernel's over the others.)"""
    torch.manual_seed(0)
    x = rand(20, 24, device=device)
    check(lambda a: torch.cumsum(a * 2 + 1, 0), x, atol=1e-5, rtol=1e-5)
    _no_fallbacks()
    assert kernel_count() == 1
    check(lambda a: torch.cumsum(a + 1, 0) - a, x, atol=1e-5, rtol=1e-5)


def test_scans_of_one_input_share_a_kernel(device):
    torch.manual_seed(0)
    x = rand(4, 30, device=device, low=-1, high=1)
    check(lambda a: (torch.cumsum(a, 1), torch.logcumsumexp(a, 1), a.sum(1)), x, atol=1e-5, rtol=1e-5)
    _no_fallbacks()
    assert kernel_count() == 1


def test_scan_of_size_one_and_zero_d(device):
    x = rand(4, 1, device=device)
    check(lambda a, b: (torch.cumsum(a, 1), torch.cumprod(b, 0), torch.logcumsumexp(a, 0)), x,
          torch.randn((), device=device))


def test_cumsum_backward(device):
    torch.manual_seed(0)
    x = rand(5, 9, device=device)
    w = rand(5, 9, device=device)
    x_eager = x.clone().requires_grad_()
    (torch.cumsum(x_eager, 1) * w).sum().backward()
    x_compiled = x.clone().requires_grad_()
    fn = torch.compile(lambda a, b: (torch.cumsum(a, 1) * b).sum(), backend="tritonfuse")
    fn(x_compiled, w).backward()
    assert tritonfuse.metrics.eager_graphs == 0
    torch.testing.assert_close(x_compiled.grad, x_eager.grad, atol=1e-5, rtol=1e-5)
    assert not any("cumsum" in op for op in tritonfuse.metrics.fallbacks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_cummax_cummin_with_ties(device, dtype, monkeypatch):
    """Ties take the later position, as in eager; also across the blocks of a looped kernel."""
    monkeypatch.setattr(heuristics, "PERSISTENT_REDUCTION_MAX_RBLOCK", 16)
    torch.manual_seed(0)
    x = rand(3, 37, dtype=dtype, device=device, low=-4, high=4)   # many equal values
    if dtype.is_floating_point:
        x = x.round()
    check(lambda a: (torch.cummax(a, 1), torch.cummin(a, 0), torch.cummax(a * 2, -1).indices + 1), x)
    _no_fallbacks()


def test_cummax_nan_takes_over(device):
    nan = float("nan")
    x = torch.tensor([[1.0, nan, 3.0, nan, 0.5], [2.0, 2.0, -1.0, 5.0, 5.0]], device=device)
    check(lambda a: (torch.cummax(a, 1), torch.cummin(a, 1)), x)
    _no_fallbacks()


def test_cummax_nan_and_ties_across_the_blocks_of_a_looped_kernel(device, monkeypatch):
    """The carried (value, position) of earlier blocks meets NaNs and equal values of later
    ones: the last NaN's position, else the last position of the extremum, as eager."""
    monkeypatch.setattr(heuristics, "PERSISTENT_REDUCTION_MAX_RBLOCK", 16)
    x = torch.tensor([1.0, 3.0, 3.0, 0.0] * 10, device=device).repeat(3, 1)
    x[1, 5] = x[1, 21] = x[1, 22] = float("nan")
    x[2, 30] = 3.0
    x[2, 17] = -x[1, 5]   # a NaN with the sign bit set
    check(lambda a: (torch.cummax(a, 1), torch.cummin(a, 1)), x)
    _no_fallbacks()


LENGTHS = (7, 33, 13, 200)


def test_scans_over_a_symbolic_length(device, monkeypatch):
    """One symbolic compile serves every length of the scanned dim (and of the rows), the
    long ones in a looped kernel that carries the prefix from block to block."""
    monkeypatch.setattr(heuristics, "PERSISTENT_REDUCTION_MAX_RBLOCK", 16)
    def fn(a):
        return a.cumsum(-1) * 2, torch.logcumsumexp(a, 0), torch.cummax(a, -1).indices, a.cumprod(0)
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    torch.manual_seed(0)
    for n in LENGTHS:
        x = rand(3, n, device=device, low=-1, high=1).round(decimals=1)   # ties for cummax
        assert_same(compiled(x), fn(x), atol=1e-4, rtol=1e-4)
    assert tritonfuse.metrics.eager_graphs == 0 and tritonfuse.metrics.static_specializations == 0
    assert tritonfuse.metrics.symbolic_graphs == 1
    _no_fallbacks()
