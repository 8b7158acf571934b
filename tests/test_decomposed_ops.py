"""Ops that the OpInfo sweep found running as aten calls while Inductor makes kernels for
them: they now go through torch._decomp's decompositions (tritonfuse/decompositions.py)
or a lowering of their own (unfold, empty*, index_add/copy/fill of 0-d tensors), generate kernels
on every column of the device matrix, leave no aten call behind and match eager."""
import pytest
import torch
import torch._decomp
import torch.nn.functional as F

import tritonfuse
from common import check, kernel_count, rand

aten = torch.ops.aten


def _kernels_only():
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    assert kernel_count() >= 1


def _grid(device):
    theta = torch.tensor([[[0.9, -0.2, 0.1], [0.3, 1.1, -0.2]], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], device=device)
    return F.affine_grid(theta, [2, 3, 5, 6], align_corners=False)


# name -> (function of the inputs, input builder(device))
CASES = {
    "glu": (lambda x: F.glu(x, dim=-1), lambda d: [rand(4, 10, device=d)]),
    "celu": (lambda x: F.celu(x, alpha=0.7), lambda d: [rand(5, 7, device=d)]),
    "threshold": (lambda x: F.threshold(x, 0.5, -2.0), lambda d: [rand(5, 7, device=d)]),
    "prelu": (lambda x, w: F.prelu(x, w), lambda d: [rand(2, 3, 4, 5, device=d), rand(3, device=d)]),
    "soft_margin_loss": (lambda x, y: F.soft_margin_loss(x, y), lambda d: [rand(6, 5, device=d),
                                                                           rand(6, 5, device=d).sign()]),
    "native_dropout_backward": (lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 2.0),
                                lambda d: [rand(6, 5, device=d), rand(6, 5, device=d) > 0]),
    "pixel_shuffle": (lambda x: F.pixel_shuffle(x, 2), lambda d: [rand(2, 8, 3, 5, device=d)]),
    "pixel_unshuffle": (lambda x: F.pixel_unshuffle(x, 2), lambda d: [rand(2, 3, 4, 6, device=d)]),
    "channel_shuffle": (lambda x: F.channel_shuffle(x, 2), lambda d: [rand(2, 6, 3, 4, device=d)]),
    "rot90": (lambda x: torch.rot90(x, 1, [0, 2]), lambda d: [rand(3, 4, 5, device=d)]),
    "diag_embed": (lambda x: torch.diag_embed(x, offset=1), lambda d: [rand(3, 4, device=d)]),
    "block_diag": (lambda a, b: torch.block_diag(a, b), lambda d: [rand(2, 3, device=d), rand(3, 2, device=d)]),
    "renorm": (lambda x: torch.renorm(x, 2, 0, 1.5), lambda d: [rand(4, 6, device=d)]),
    "cross": (lambda a, b: torch.linalg.cross(a, b), lambda d: [rand(5, 3, device=d), rand(5, 3, device=d)]),
    "ldexp": (lambda x, e: torch.ldexp(x, e), lambda d: [rand(5, 7, device=d),
                                                           torch.randint(-4, 5, (5, 7), device=d)]),
    "dist": (lambda a, b: torch.dist(a, b, 3), lambda d: [rand(5, 7, device=d), rand(5, 7, device=d)]),
    "im2col": (lambda x: F.unfold(x, (2, 3), padding=1, stride=2), lambda d: [rand(2, 3, 6, 7, device=d)]),
    "unfold_copy": (lambda x: torch.ops.aten.unfold_copy(x, 1, 3, 2), lambda d: [rand(4, 9, device=d)]),
    "max_unpool2d": (lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2),
                     lambda d: [rand(2, 3, 6, 8, device=d)]),
    "grid_sample": (lambda x, g: F.grid_sample(x, g, align_corners=False),
                    lambda d: [rand(2, 3, 5, 6, device=d), _grid(d)]),
    "adaptive_max_pool3d": (lambda x: F.adaptive_max_pool3d(x, 2), lambda d: [rand(2, 3, 4, 4, 6, device=d)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decomposed_op_generates_kernels(device, name):
    fn, inputs = CASES[name]
    if name == "adaptive_max_pool3d" and not torch._decomp.get_decompositions([aten.adaptive_max_pool3d]):
        pytest.skip(f"torch {torch.__version__} has no decomposition of {name}: it runs as an aten call")
    check(lambda *args: fn(*args) * 1.0, *inputs(device))
    _kernels_only()


def test_unfold_is_a_view_read_by_a_kernel(device):
    x = rand(4, 11, device=device)
    check(lambda a: a.unfold(1, 3, 2) + 1.0, x)
    check(lambda a: (a * 2).unfold(0, 2, 1).sum(-1), x)
    _kernels_only()


@pytest.mark.parametrize("op", ["index_add", "index_copy", "index_fill"])
def test_index_writes_into_0d_tensors(device, op):
    x, index, source = torch.tensor(1.5, device=device), torch.tensor([0], device=device), torch.tensor(
        -2.0, device=device)
    calls = {"index_add": lambda a, i, s: torch.index_add(a * 1.0, 0, i, s, alpha=3),
             "index_copy": lambda a, i, s: torch.index_copy(a * 1.0, 0, i, s),
             "index_fill": lambda a, i, s: torch.index_fill(a * 1.0, 0, i, 4.0) + s}
    check(calls[op], x, index, source)
    _kernels_only()


def test_pow_with_a_constant_float_exponent(device):
    """dist(a, b, 3) ends in sum ** (1/3): a Python float exponent in Triton's pow helper
    (the interpreter rejected its bool tests on a scalar)."""
    x = rand(5, 7, device=device)
    check(lambda a: (a.abs() ** 0.37, (-a) ** 3.0, a ** -2.0), x)
    _kernels_only()


def test_empty_tensors_take_eagers_layout(device):
    """empty* are zero-filled buffers (any value is right): no aten allocation between
    kernels, and each output has eager's size, strides and dtype."""
    def fn(x):
        return (torch.empty_permuted((2, 3, 4), (2, 0, 1), device=x.device), x.new_empty_strided((3, 4), (1, 3)),
                torch.empty_like(x.t()), torch.empty(5, dtype=torch.int32, device=x.device))
    x = rand(4, 3, device=device)
    expected = fn(x)
    actual = torch.compile(fn, backend="tritonfuse")(x)
    assert tritonfuse.metrics.eager_graphs == 0
    for a, e in zip(actual, expected):
        assert (a.shape, a.stride(), a.dtype, a.device) == (e.shape, e.stride(), e.dtype, e.device)
    _kernels_only()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outer_product_matmuls_are_pointwise(device, dtype):
    # bmm / mm with k = 1 (a llama's rotary angles: inv_freq @ positions) become a broadcast
    # mul that fuses with its readers: no GEMM call, one kernel
    a, b = rand(2, 32, 1, device=device, dtype=dtype), rand(2, 1, 48, device=device, dtype=dtype)
    # bf16: eager rounds the product to bf16 before cos/sin, the fused kernel does not (an
    # argument of ~4 moves by up to 2^-6 there)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=2e-2)
    check(lambda a, b: torch.cat([torch.bmm(a, b).cos(), torch.mm(a[0], b[1]).sin()[None]]), a, b, **tol)
    _kernels_only()


@pytest.mark.parametrize("make, dim", [
    (lambda d: rand(3, 5, device=d), -1),
    (lambda d: rand(4, 6, device=d).t(), 0),               # a transposed input: the result is contiguous
    (lambda d: rand(2, 3, 4, 5, device=d), 1),
])
def test_cat_of_one_tensor_repeated(device, make, dim):
    x = make(device)
    check(lambda x: (torch.cat([x, x, x], dim) * 2, torch.cat([x, x + 1], dim)), x)
    _kernels_only()


def test_rotary_table_is_recomputed_not_saved(device):
    # a llama's rotary table, cat((angles, angles), -1) of an outer-product bmm, is not saved
    # for the backward (the min-cut partitioner recomputes no cat: the cat of one tensor is
    # a copy of it expanded), and the bmm is no GEMM call
    inv_freq = rand(1, 16, 1, device=device)
    positions = torch.arange(64, device=device, dtype=torch.float32)[None, None, :]
    x = rand(2, 64, 32, device=device).requires_grad_()

    def rotate(x, inv_freq, positions):
        angles = torch.bmm(inv_freq, positions).transpose(1, 2)
        emb = torch.cat([angles, angles], dim=-1)
        return (x * emb.cos() + x.flip(-1) * emb.sin()).sum()

    expected = rotate(x, inv_freq, positions)
    expected.backward()
    grad, x.grad = x.grad, None
    saved_shapes = []

    def pack(t):
        saved_shapes.append(tuple(t.shape))
        return t
    compiled = torch.compile(rotate, backend="tritonfuse", dynamic=False)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        actual = compiled(x, inv_freq, positions)
    actual.backward()
    assert tritonfuse.metrics.eager_graphs == 0
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(x.grad, grad, atol=1e-4, rtol=1e-5)
    assert (1, 64, 32) not in saved_shapes, saved_shapes
    assert "bmm" not in "".join(tritonfuse.metrics.fallbacks), tritonfuse.metrics.fallbacks
