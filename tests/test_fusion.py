"""Fusion decisions of the shared scheduler, checked through kernel counts and code."""
import torch

import tritonfuse
from common import check, kernel_count, rand


def test_no_fusion_through_a_fallback(device):
    # y feeds the fallback (sort) and the final pointwise; fusing y's kernel with the
    # consumer of the sort result would make a cycle
    x = rand(4, 8, device=device)
    check(lambda a: (a + 1).exp() * 2 + torch.sort(a + 1, dim=1).values, x, rtol=1e-5)
    assert kernel_count() == 2


def test_different_iteration_spaces_stay_apart(device):
    x, y = rand(6, 10, device=device), rand(7, 3, device=device)
    check(lambda a, b: (a.sum(1), b.sum(1)), x, y)
    assert kernel_count() == 2


def test_reduction_prologue_and_epilogue_fuse(device):
    x, w = rand(12, 48, device=device), rand(48, device=device)
    # RMS norm: pointwise prologue (square), reduction, epilogue over rows and columns
    check(lambda a, g: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * g, x, w, rtol=1e-4)
    assert kernel_count() == 1
    assert tritonfuse.metrics.fused_node_count >= 2


def test_epilogue_of_a_middle_dim_reduction(device):
    # sum over dim 1 of (4, 32, 64): the reduction keeps its rows as (4, 64) dims, the
    # sigmoid merges them into (256,); the same element at every position, so they fuse
    # (the C++ kernel walks the finer (4, 64) rows for both)
    x, y = rand(4, 32, 64, device=device), rand(4, 32, 64, device=device)
    check(lambda a, b: torch.sigmoid(torch.sum(a + b, dim=1)), x, y, rtol=1e-4, atol=1e-5)
    assert kernel_count() == 1
    # rows that are no multiple of the vector width, and a second epilogue output
    tritonfuse.metrics.reset()
    x, y = rand(3, 7, 37, device=device), rand(3, 7, 37, device=device)
    check(lambda a, b: (torch.sigmoid(torch.sum(a * b, dim=1)), torch.amax(a, dim=1) * 2), x, y,
          rtol=1e-4, atol=1e-5)
    assert kernel_count() == 1


def test_row_dims_merged_differently_in_one_kernel(device):
    # the reduction over the last dim keeps (6, 5) rows (the input is transposed in memory),
    # the pointwise consumer of its result merges them into (30,)
    x = rand(5, 6, 40, device=device).permute(1, 0, 2)
    check(lambda a: torch.exp(a.sum(-1)) + 1, x, rtol=1e-4, atol=1e-5)


def test_realized_value_read_by_two_reductions(device):
    x = rand(5, 40, device=device)
    check(lambda a: ((a * 3).exp().sum(-1), (a * 3).exp().amax(-1), torch.var(a, -1)), x, rtol=1e-4)
    assert kernel_count() == 1


def test_consumer_reading_a_shifted_element_is_not_fused(device):
    x = rand(32, device=device)
    # b[i] reads a[i + 1]: another program computes it, so a must be materialized first
    check(lambda v: (v.exp() * 2, (v.exp() * 2)[1:] + (v.exp() * 2)[:-1]), x)
