"""Pooling and resampling (lowering/pooling.py, lowering/resampling.py): max/avg/adaptive
pooling and nearest/bilinear upsampling, forward and backward, against eager on every
column of the device matrix; pools fuse with their neighbours; windows too large to
unroll fall back (logged), as in Inductor."""
import math

import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import check, kernel_count, rand
from test_layout_ops import check_with_grad


def _no_fallbacks():
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    assert kernel_count() >= 1


def image(*shape, device, dtype=torch.float32, nan=False):
    x = rand(*shape, device=device, dtype=dtype)
    if nan:
        x.view(-1)[3] = math.nan
    return x


MAX_POOL = {
    "k2": (lambda x: F.max_pool2d(x, 2), (2, 3, 8, 10)),
    "k3_s2_p1": (lambda x: F.max_pool2d(x, 3, 2, 1), (2, 3, 9, 11)),
    "k3_s1_ceil": (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), (1, 2, 8, 7)),
    "k3_dilation": (lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2), (1, 2, 9, 8)),
    "rect_window": (lambda x: F.max_pool2d(x, (2, 3), (2, 1), (1, 0)), (2, 2, 7, 6)),
    "unbatched": (lambda x: F.max_pool2d(x, 3, 2), (3, 7, 9)),
    "1d": (lambda x: F.max_pool1d(x, 3, 2, 1), (2, 3, 11)),
    "3d": (lambda x: F.max_pool3d(x, 2, 2, 1), (1, 2, 5, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(MAX_POOL))
def test_max_pool(device, name):
    fn, shape = MAX_POOL[name]
    check_with_grad(fn, image(*shape, device=device))
    _no_fallbacks()


WITH_INDICES = {
    "k3_s2_p1": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 9, 11)),
    "k3_dilation": (lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2, return_indices=True), (1, 2, 9, 8)),
    "ceil": (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True, return_indices=True), (1, 2, 8, 7)),
    "1d": (lambda x: F.max_pool1d(x, 3, 2, 1, return_indices=True), (2, 3, 11)),
    "3d": (lambda x: F.max_pool3d(x, 2, 2, 1, return_indices=True), (1, 2, 5, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(WITH_INDICES))
def test_max_pool_indices(device, name):
    """The indices too: the first maximum, or the last NaN, as in eager."""
    fn, shape = WITH_INDICES[name]
    x = image(*shape, device=device, nan=True)
    x.view(-1)[10:14] = 2.5   # ties
    check(fn, x)
    _no_fallbacks()


def test_max_pool_bfloat16_and_special_values(device):
    x = image(2, 3, 8, 9, device=device, dtype=torch.bfloat16, nan=True)
    x[0, 1, 2, :] = -math.inf
    check(lambda a: F.max_pool2d(a, 3, 2, 1, return_indices=True), x)
    _no_fallbacks()


AVG_POOL = {
    "k2": (lambda x: F.avg_pool2d(x, 2), (2, 3, 8, 10)),
    "k3_s2_p1": (lambda x: F.avg_pool2d(x, 3, 2, 1), (2, 3, 9, 11)),
    "ceil_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (1, 2, 8, 7)),
    "ceil_include_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), (1, 2, 8, 7)),
    "divisor_override": (lambda x: F.avg_pool2d(x, (2, 3), (1, 2), 1, divisor_override=4), (2, 2, 7, 6)),
    "unbatched": (lambda x: F.avg_pool2d(x, 3, 2), (3, 7, 9)),
    "1d": (lambda x: F.avg_pool1d(x, 3, 2, 1), (2, 3, 11)),
    "3d": (lambda x: F.avg_pool3d(x, 2, 2, 1), (1, 2, 5, 6, 7)),
    "3d_exclude_pad": (lambda x: F.avg_pool3d(x, (3, 3, 2), 2, 1, count_include_pad=False), (1, 2, 5, 6, 7)),
}


@pytest.mark.parametrize("name", sorted(AVG_POOL))
def test_avg_pool(device, name):
    fn, shape = AVG_POOL[name]
    check_with_grad(fn, image(*shape, device=device))
    _no_fallbacks()


ADAPTIVE = {
    "divisible": (lambda x: F.adaptive_avg_pool2d(x, (4, 5)), (2, 3, 8, 10)),
    "global": (lambda x: F.adaptive_avg_pool2d(x, 1), (2, 3, 7, 7)),
    "uneven": (lambda x: F.adaptive_avg_pool2d(x, (3, 4)), (2, 3, 8, 10)),
    "upscaling": (lambda x: F.adaptive_avg_pool2d(x, (5, 7)), (1, 2, 3, 4)),
    "unbatched": (lambda x: F.adaptive_avg_pool2d(x, (2, 3)), (3, 7, 9)),
    "1d": (lambda x: F.adaptive_avg_pool1d(x, 4), (2, 3, 11)),
}


@pytest.mark.parametrize("name", sorted(ADAPTIVE))
def test_adaptive_avg_pool(device, name):
    fn, shape = ADAPTIVE[name]
    check_with_grad(fn, image(*shape, device=device))
    _no_fallbacks()


@pytest.mark.parametrize("name", ["avg", "adaptive", "max"])
def test_pools_bfloat16(device, name):
    fn = {"avg": lambda a: F.avg_pool2d(a, 3, 2, 1), "adaptive": lambda a: F.adaptive_avg_pool2d(a, (3, 4)),
          "max": lambda a: F.max_pool2d(a, 3, 2, 1)}[name]
    check(fn, image(2, 3, 8, 10, device=device, dtype=torch.bfloat16))
    _no_fallbacks()


def test_avg_pool_fuses_with_its_producer(device):
    """avg_pool2d(relu(x)): the relu is computed in the pool's kernel."""
    check(lambda a: F.avg_pool2d(torch.relu(a), 3, 2, 1), image(2, 3, 9, 11, device=device))
    _no_fallbacks()
    assert kernel_count() == 1


def test_max_pool_then_relu_is_one_kernel(device):
    check(lambda a: torch.relu(F.max_pool2d(a, 3, 2, 1)) + 1, image(2, 3, 9, 11, device=device))
    _no_fallbacks()
    assert kernel_count() == 1


def test_pool_of_a_costly_input_reads_it_from_memory(device):
    """An input with several loads is computed once, not once per window position."""
    x, y = image(2, 3, 9, 11, device=device), image(2, 3, 9, 11, device=device)
    check(lambda a, b: F.max_pool2d(a * b + a.exp(), 3, 2, 1), x, y)
    _no_fallbacks()
    assert kernel_count() == 2


def test_large_window_falls_back(device):
    """More than 25 window positions: aten's kernel, as in Inductor (logged)."""
    check(lambda a: F.max_pool2d(a, 6) + 1, image(1, 2, 12, 12, device=device))
    assert "aten.max_pool2d_with_indices.default" in tritonfuse.metrics.fallbacks
    assert "more than 25" in tritonfuse.metrics.fallbacks["aten.max_pool2d_with_indices.default"]
