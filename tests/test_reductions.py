"""Reductions over any dims, keepdim, every dtype, and their fused epilogues."""
import pytest
import torch

from common import check, kernel_count, rand

SHAPES = {"small_rows": (5, 37), "long_rows": (3, 2500), "3d": (4, 6, 9)}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("op", ["sum", "prod", "amax", "amin", "mean", "argmax", "argmin"])
def test_reduction_last_dim(device, op, shape):
    x = rand(*SHAPES[shape], device=device, low=0.5, high=1.5) if op == "prod" else rand(*SHAPES[shape],
                                                                                             device=device)
    if op == "prod" and shape == "long_rows":
        x = x[:, :40]
    # a float32 sum of 2500 values in [-3, 3] in another order differs by up to ~n*eps*3 =
    # 4.5e-4 (typically ~1e-5): absolute, so it matters when the sum cancels to near 0
    check(lambda a: getattr(torch, op)(a, -1), x, rtol=1e-4 if op == "mean" else None,
          atol=5e-4 if shape == "long_rows" and op in ("sum", "mean", "nansum") else None)


@pytest.mark.parametrize("dims,keepdim", [((0,), False), ((1,), True), ((0, 2), False), ((0, 1, 2), True),
                                          ((2, 0), True)])
def test_sum_over_dims(device, dims, keepdim):
    x = rand(4, 6, 9, device=device)
    check(lambda a: (a.sum(dims, keepdim=keepdim), a.amax(dims, keepdim=keepdim)), x, rtol=1e-4, atol=1e-4)


def test_full_reductions(device):
    x = rand(7, 13, device=device)
    check(lambda a: (a.sum(), a.mean(), a.amax(), a.argmax(), a.argmin(), a.max(), a.min()), x, rtol=1e-4)


def test_reductions_on_transposed_and_sliced(device):
    x = rand(20, 12, device=device).t()
    y = rand(9, 30, device=device)[1::2, ::3]
    check(lambda a, b: (a.sum(1), a.sum(0), b.amax(1), b.mean(0), a.argmax(0)), x, y, rtol=1e-4)


def test_column_sum_outer_reduction(device):
    x = rand(300, 17, device=device)
    check(lambda a: a.sum(0), x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("correction", [0, 1])
def test_var_std_mean(device, correction):
    x = rand(6, 300, device=device) + 100  # offset: naive one-pass variance would lose digits
    check(lambda a: (torch.var(a, -1, correction=correction), torch.std(a, 0, correction=correction),
                     torch.var_mean(a, -1, correction=correction, keepdim=True)), x, rtol=1e-4, atol=1e-4)


def test_var_mean_long_rows(device):
    x = rand(3, 3000, device=device)
    check(lambda a: torch.var_mean(a, dim=-1), x, rtol=1e-4, atol=1e-5)


def test_any_all(device):
    x = rand(5, 8, device=device)
    check(lambda a: ((a > 2).any(1), (a > -2.9).all(0), (a > 0).any(), a.to(torch.int64).all(1)), x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_reductions(device, dtype):
    x = rand(4, 300, device=device, dtype=dtype)
    check(lambda a: (a.sum(-1), a.amax(-1), a.mean(0), a.argmax(-1), torch.softmax(a, -1)), x, atol=5e-2, rtol=2e-2)


def test_integer_and_bool_sums(device):
    x = rand(5, 7, device=device, dtype=torch.int64, low=-5, high=5)
    b = rand(5, 7, device=device, dtype=torch.bool)
    check(lambda a, m: (a.sum(1), a.amax(0), m.sum(1), a.argmin(1), a.prod(0)), x, b)


def test_argmax_ties_and_nans(device):
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 1.0, float("nan"), 2.0], [-1.0, -1.0, -1.0, -1.0]],
                     device=device)
    check(lambda a: (a.argmax(1), a.argmin(1), a.amax(1), a.amin(1)), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8, torch.int16, torch.int64,
                                   torch.bool])
def test_max_min_propagate_nan_in_every_dtype(device, dtype):
    """amax / amin (and max over a dim) keep eager's NaN propagation and the input's dtype:
    rows with one NaN, with only NaNs, with -inf / +inf, signed zeros, and ints at their edges."""
    if dtype.is_floating_point:
        nan, inf = float("nan"), float("inf")
        x = torch.tensor([[1.0, nan, 3.0, -2.0], [nan, nan, nan, nan], [-inf, -inf, -inf, -inf],
                          [inf, 0.5, -inf, 2.0], [-0.0, -0.0, -0.0, -0.0], [0.25, -7.0, 6.5, 6.5]], dtype=dtype)
    elif dtype == torch.bool:
        x = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([[info.min, 0, info.max], [info.min, info.min, info.min], [-1, 5, 3]], dtype=dtype)
    fns = (lambda a: (a.amax(1), a.amin(1), a.amax(0), a.amin(0))) if dtype == torch.bool else \
        (lambda a: (a.amax(1), a.amin(1), a.max(1).values, a.amax(0), a.amin(0), a.amax(1) * 3 + 1))
    check(fns, x.to(device))   # (the last: a narrow int max keeps its dtype and wraps as eager's)


def test_sigmoid_of_sum_is_one_kernel(device):
    x, y = rand(8, 33, device=device), rand(8, 33, device=device)
    sources = check(lambda a, b: torch.sigmoid(torch.sum(a + b, dim=1)), x, y)
    assert kernel_count() == 1
    if device != "cpu" or "triton" in sources[-1]:
        assert "fused_add_sum_sigmoid" in "\n".join(sources)


@pytest.mark.parametrize("cols", [37, 2000])
def test_softmax_is_one_kernel(device, cols):
    x = rand(6, cols, device=device)
    check(lambda a: torch.softmax(a, -1), x)
    assert kernel_count() == 1


def test_log_softmax_and_layer_norm(device):
    x = rand(6, 50, device=device)
    w, b = rand(50, device=device), rand(50, device=device)
    check(lambda a, w, b: (torch.log_softmax(a, -1), torch.nn.functional.layer_norm(a, (50,), w, b)), x, w, b,
          atol=1e-4, rtol=1e-4)


def test_reduction_epilogue_over_rows(device):
    x = rand(10, 64, device=device)
    check(lambda a: a - a.mean(-1, keepdim=True) * 2, x, rtol=1e-4)
    assert kernel_count() == 1


@pytest.mark.parametrize("cols", [37, 2000])
def test_softmax_family_special_values(device, cols):
    # exercises the online (one-pass) softmax sum on Triton: -inf, nan, inf, an all -inf row
    x = rand(6, cols, device=device) * 5
    x[1, 3] = float("-inf")
    x[2, :] = float("-inf")
    x[3, 5] = float("nan")
    x[4, 7] = float("inf")
    target = torch.arange(6, device=device) % cols
    check(lambda a: (torch.softmax(a, -1), torch.log_softmax(a, -1),
                     torch.nn.functional.cross_entropy(a, target, reduction="none")), x, atol=1e-5, rtol=1e-4)


def _splits_on_this_device(device):
    import tritonfuse
    return device == "cuda" or tritonfuse.config.cpu_backend == "triton"


@pytest.mark.parametrize("numel", [65536, 65537])   # splits evenly / with a masked last chunk
def test_split_full_reduction(device, numel):
    """One output from many elements: two kernels on the Triton backend (partials, then
    their combination), one C++ kernel; eager's result either way."""
    x = rand(numel, device=device)
    check(lambda a: (a.sum(), a.amax(), (a * 2).abs().mean(), (a > 2.9).any()), x, atol=1e-2, rtol=1e-4)
    if _splits_on_this_device(device):
        assert kernel_count() == 2   # stage 1 of all four, stage 2 of all four


def test_split_outer_and_inner_reductions(device):
    # a tall column sum (few outputs, long reduction) with a fused prologue and epilogue,
    # and rows that each reduce 8k elements; int64 and bf16 sources
    x = rand(8200, 40, device=device)
    check(lambda a: torch.sigmoid((a * a).sum(0)) + 1, x, atol=1e-3, rtol=1e-4)
    y = rand(3, 8192, device=device)
    check(lambda a: (a.sum(-1), a.amin(-1), a.prod(-1) == 0), y, atol=1e-2, rtol=1e-4)
    i = rand(70000, dtype=torch.int64, device=device, low=-5, high=5)
    check(lambda a: (a.sum(), a.amax()), i)
    # a bf16 sum of 131k values: eager itself is off from the exact sum by up to a few units
    # (it rounds partial sums; seen 6.2 with values in [-3, 3]), so the check against eager
    # allows 8 (one bf16 ulp at 1024); the compiled sum must be the exact sum rounded once
    h = rand(128, 1024, dtype=torch.bfloat16, device=device)
    check(lambda a: a.sum(), h, atol=8.0, rtol=2e-2)
    compiled = torch.compile(lambda a: a.sum(), backend="tritonfuse", dynamic=False)
    exact = h.double().sum().to(torch.bfloat16)
    torch.testing.assert_close(compiled(h), exact, atol=float(exact.abs()) * 2 ** -7 + 1e-2, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_statistics_split(device, dtype):
    """var_mean over all but the channels of an NHWC-held batch (batch norm's statistics):
    few outputs, a long reduction. On the Triton backend the mean and the squared
    deviations are two split sums (four kernels with the normalization), not one Welford
    pass over a handful of programs; values far from zero keep the two-pass form exact."""
    x = (rand(16, 8, 24, 24, device=device) + 40.0).to(memory_format=torch.channels_last).to(dtype)

    def fn(a):
        var, mean = torch.var_mean(a.float(), dim=(0, 2, 3), correction=0, keepdim=True)
        return var, mean, ((a - mean) * torch.rsqrt(var + 1e-5)).to(dtype)
    check(fn, x, atol=2e-2 if dtype == torch.bfloat16 else 1e-3, rtol=1e-3)
    if _splits_on_this_device(device):
        assert kernel_count() >= 4, kernel_count()


def test_reduction_of_a_value_constant_along_the_row(device):
    """A reduced value that is the same in every vector lane (a constant, a row's scalar)
    counts once per element: the C++ backend once added it once per vector chunk
    (masked.var's count of elements came out 16 instead of 125)."""
    x = rand(5, 37, device=device)
    check(lambda a: (a.new_ones(5, 37).sum(1), a.new_ones(125).sum() + a.sum(),
                     a.new_ones(5, 37).sum(1, dtype=torch.int64),
                     torch.full((40,), 1.01, device=a.device).prod() + a.amax(),
                     (a + a.new_ones(5, 37).sum(-1, keepdim=True)).amax(-1), a.new_ones(5, 37).argmax(1),
                     a.new_ones(5, 37, dtype=torch.bool).all(1), a.new_zeros(5, 37).any(1)), x, rtol=1e-5, atol=1e-4)
    check(lambda a: torch.masked._ops.var(a, mask=None), rand(5, 5, 5, device=device), rtol=1e-4, atol=1e-5)


def test_nansum_and_count_nonzero(device):
    x = rand(5, 9, device=device)
    x[1, 3] = float("nan")
    x[2, 0] = 0.0
    check(lambda a: (torch.nansum(a, 1), torch.nansum(a), torch.count_nonzero(a, 0), torch.count_nonzero(a),
                     torch.count_nonzero(a > 1, (0, 1))), x, rtol=1e-5, atol=1e-5)
