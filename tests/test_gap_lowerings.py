"""The OpInfo sweep's lowering gaps (ops Inductor makes kernels for that ran as aten calls):
isin, put, scatter_reduce / index_reduce mean, diagonal_scatter, as_strided_copy /
as_strided_scatter, adaptive_max_pool1d/2d, frexp, eye. Each is compared with eager on every
column of the device matrix and must leave no aten call of its own behind
(tritonfuse/extra_decompositions.py, lowering/scatter_views.py, lowering/pooling.py)."""
import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import check, kernel_count, rand

aten = torch.ops.aten


def _kernels_only():
    """Kernels generated and no fallback, but the one by design: on a GPU a float sum whose
    writes may collide stays with eager's ordered kernel (lowering/indexing.py)."""
    by_design = {op: why for op, why in tritonfuse.metrics.fallbacks.items() if "land in no fixed order" in why}
    assert tritonfuse.metrics.fallbacks == by_design, tritonfuse.metrics.fallbacks
    assert by_design or kernel_count() > 0


# ---- isin ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_isin(device, dtype):
    torch.manual_seed(0)
    elements = rand(5, 7, dtype=dtype, device=device, low=-4, high=4).round()
    tests = rand(13, dtype=dtype, device=device, low=-4, high=4).round()
    check(lambda e, t: (torch.isin(e, t), torch.isin(e * 1, t, invert=True), torch.isin(e, 2)), elements, tests)
    _kernels_only()


# ---- put ----------------------------------------------------------------------------------

@pytest.mark.parametrize("accumulate", [False, True])
def test_put(device, accumulate):
    torch.manual_seed(0)
    x = rand(4, 5, device=device)
    index = torch.randperm(20, device=device)[:6] - 10           # distinct, some negative
    if accumulate:
        index = torch.randint(-20, 20, (3, 4), device=device)     # collisions add up
    source = rand(*index.shape, device=device)
    # (a transposed self: the result is contiguous, as Inductor's; eager's clone keeps the strides)
    check(lambda a, i, s: torch.put(a.t(), i, s, accumulate=accumulate), x, index, source, check_strides=False)
    _kernels_only()


# ---- scatter_reduce / index_reduce mean -----------------------------------------------------

@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_reduce_mean(device, include_self, dtype):
    torch.manual_seed(0)
    x = rand(6, 4, dtype=dtype, device=device, low=-9, high=9)
    index = torch.randint(0, 6, (5, 3), device=device)            # some rows get nothing
    src = rand(5, 4, dtype=dtype, device=device, low=-9, high=9)
    check(lambda a, i, s: torch.scatter_reduce(a, 0, i, s, "mean", include_self=include_self), x, index, src)
    _kernels_only()


@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_mean(device, include_self):
    torch.manual_seed(0)
    x = rand(3, 7, device=device)
    index = torch.tensor([1, 4, 1, 6, 1], device=device)
    source = rand(3, 5, device=device)
    check(lambda a, i, s: a.index_reduce(1, i, s, "mean", include_self=include_self), x, index, source)
    _kernels_only()


# ---- scatters into views ----------------------------------------------------------------

@pytest.mark.parametrize("offset,dims", [(0, (0, 1)), (2, (0, 1)), (-1, (0, 1)), (1, (2, 0)), (-2, (-1, 1))])
def test_diagonal_scatter(device, offset, dims):
    torch.manual_seed(0)
    x = rand(4, 5, 6, device=device)
    src = torch.diagonal(x, offset, *dims).clone().uniform_(-1, 1)
    check(lambda a, s: torch.diagonal_scatter(a * 2, s, offset, *dims), x, src)
    _kernels_only()


def test_as_strided_copy_and_scatter(device):
    torch.manual_seed(0)
    x = rand(5, 6, device=device)
    src = rand(3, 2, device=device)

    def fn(a, s):
        return aten.as_strided_copy(a, (3, 2), (5, 2), 3), torch.as_strided_scatter(a * 2, s, (3, 2), (7, 1), 2)
    check(fn, x, src)
    _kernels_only()


# ---- adaptive max pooling ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adaptive_max_pool_uneven_windows(device, dtype):
    torch.manual_seed(0)
    x = rand(2, 3, 7, 10, dtype=dtype, device=device)
    x[0, 0, 1, 2] = float("nan")
    x[1, 2, :4, :4] = float("-inf")
    check(lambda a: F.adaptive_max_pool2d(a, (3, 4), return_indices=True), x)
    check(lambda a: F.adaptive_max_pool1d(a[0], 4, return_indices=True), x)
    _kernels_only()


# ---- frexp -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp(device, dtype):
    special = [0.0, -0.0, 1.0, 0.5, -0.75, 3.0, 1e-3, 1024.0, float("inf"), float("-inf"), float("nan")]
    limits = torch.finfo(dtype)
    special += [limits.max, -limits.max, limits.tiny, limits.tiny / 8, limits.eps]
    x = torch.cat([torch.tensor(special, dtype=dtype), rand(40, dtype=dtype, low=-1e4, high=1e4)]).to(device)
    check(lambda a: torch.frexp(a), x)
    _kernels_only()


# ---- eye ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_eye(device, dtype):
    """torch.eye (square and n x m) inside a graph: two ranges compared, fused with its users."""
    x = rand(6, 4, device=device)
    check(lambda v: (v * torch.eye(6, 4, dtype=dtype, device=v.device), torch.eye(3, dtype=dtype, device=v.device),
                     torch.eye(4, 7, dtype=dtype, device=v.device)), x)
    _kernels_only()
