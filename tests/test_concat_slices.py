"""A cat whose inputs are costly and that no pointwise op reads is computed input by input
into slices of its memory (ir.ConcatSlice), not as one pointwise kernel that evaluates every
input at every element. Slices of equal sizes share a kernel. Every result is compared
with eager, on every column of the device matrix."""
import re

import pytest
import torch
import torch.nn as nn

import tritonfuse
from tritonfuse.testing import run_and_get_code

from common import assert_same, check, rand


def _slices(wrapper: str) -> int:
    """Cat slices bound to the memory of the one before them."""
    return len(re.findall(r"^\s*buf\d+ = buf\d+  # written in place$", wrapper, re.M))


def _kernels(sources):
    return sources[1:]


def test_costly_inputs_read_by_a_matmul_are_computed_into_slices(device):
    w = rand(128, 16, device=device) / 8

    def f(x, y):
        return torch.cat([torch.sin(x) * 2 + torch.cos(x), torch.exp(y) - 1, y * 3], dim=-1) @ w

    sources = check(f, rand(64, 32, device=device), rand(64, 48, device=device), atol=1e-4, rtol=1e-4)
    assert _slices(sources[0]) == 2, sources[0]
    # the two inputs of 64 x 48 share one kernel, with a store each; the first has its own
    assert len(_kernels(sources)) == 2, sources[0]


def test_equal_inputs_share_one_kernel_that_computes_each_once(device):
    w = rand(96, 8, device=device) / 8

    def f(x):
        s = torch.sigmoid(x)
        return torch.cat([x * s * (1 + x * (1 - s)), x * s, torch.tanh(x)], dim=1) @ w

    sources = check(f, rand(40, 32, device=device), atol=1e-4, rtol=1e-4)
    assert _slices(sources[0]) == 2, sources[0]
    kernel, = _kernels(sources)
    assert len(re.findall(r"sigmoid\(", kernel)) == 1, kernel


def test_a_cat_read_by_a_pointwise_op_stays_one_pointwise_kernel(device):
    def f(x, y):
        return torch.cat([torch.sin(x), torch.exp(y)], dim=0) * 2

    sources = check(f, rand(16, 24, device=device), rand(8, 24, device=device))
    assert _slices(sources[0]) == 0, sources[0]
    assert len(_kernels(sources)) == 1


def test_a_cat_of_cheap_inputs_stays_one_copy_kernel(device):
    w = rand(64, 4, device=device) / 8

    def f(x, y):
        return torch.cat([x.t(), y], dim=1) @ w

    sources = check(f, rand(32, 16, device=device), rand(16, 32, device=device), atol=1e-4, rtol=1e-4)
    assert _slices(sources[0]) == 0, sources[0]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_slices_along_any_dim_as_an_output(device, dim):
    def f(x, y):
        return torch.cat([torch.sin(x) + torch.cos(x), torch.exp(y * 0.5)], dim=dim)

    a = rand(3, 5, 7, device=device)
    shape = [3, 5, 7]
    shape[dim] = 4
    sources = check(f, a, rand(*shape, device=device))
    assert _slices(sources[0]) == 1, sources[0]


def test_slices_cast_to_the_promoted_dtype(device):
    """A bfloat16 input's slice of a float32 cat. (Its value is computed in float32 and not
    rounded to bfloat16 on the way, as Inductor's are: within bfloat16's rounding of eager's.)"""
    def f(x, y):
        return torch.cat([torch.sin(x), torch.exp(y)], dim=1)

    sources = check(f, rand(16, 24, device=device, dtype=torch.bfloat16), rand(16, 16, device=device),
                    atol=1e-2, rtol=1e-2)
    assert _slices(sources[0]) == 1, sources[0]


def test_channels_last_slices_keep_eagers_layout(device):
    def f(x, y):
        return torch.cat([torch.sin(x) * torch.cos(x), torch.exp(y)], dim=1)

    x = rand(2, 3, 5, 6, device=device).to(memory_format=torch.channels_last)
    y = rand(2, 4, 5, 6, device=device).to(memory_format=torch.channels_last)
    sources = check(f, x, y)
    assert _slices(sources[0]) == 1, sources[0]


def test_the_slices_memory_is_not_reused_while_the_cat_lives(device):
    """Buffers of a slice's size die and are allocated around the slices: none of them may
    land on the cat's memory."""
    w = rand(64, 64, device=device) / 8

    def f(x, y):
        c = torch.cat([torch.sin(x), torch.cos(y)], dim=1)
        t = torch.exp(x) + 1          # the size of a slice, computed between the slices
        u = torch.tanh(t) * y         # t dies here
        return c @ w, u * 2

    check(f, rand(16, 32, device=device), rand(16, 32, device=device), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_through_merged_projections_and_rotary_slices(device, dtype):
    """q/k/v merged into one matmul (merge_linears.py): their gradients, through a rotary
    embedding, are cat'ed for the merged weight's gradient, slice by slice."""
    torch.manual_seed(0)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(32, 32, bias=False) for _ in range(3))
            self.o = nn.Linear(32, 32, bias=False)

        def forward(self, x, cos, sin):
            def rotate(t):
                half = t.shape[-1] // 2
                return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin
            b, s, _ = x.shape
            q, k, v = (lin(x).view(b, s, 4, 8).transpose(1, 2) for lin in (self.q, self.k, self.v))
            o = torch.nn.functional.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
            return self.o(o.transpose(1, 2).reshape(b, s, 32))

    model = Attention().to(device=device, dtype=dtype)
    positions = torch.arange(12, device=device, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1, 8, device=device)
    cos, sin = positions.cos().to(dtype), positions.sin().to(dtype)
    x = rand(2, 12, 32, device=device, dtype=dtype)
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]

    def eager_step():
        out = torch.func.functional_call(model, dict(zip([n for n, _ in model.named_parameters()], reference)),
                                         (x, cos, sin))
        out.float().square().mean().backward()
        return out

    expected = eager_step()
    compiled = torch.compile(lambda: model(x, cos, sin), backend="tritonfuse")
    actual, sources = run_and_get_code(lambda: _backward(compiled()))
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.merged_linear_groups == 1
    assert any(_slices(code) >= 2 for code in sources if "def call" in code), "no cat of gradients into slices"
    tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    assert_same(actual, expected.detach(), **tolerance)
    for p, r in zip(model.parameters(), reference):
        assert_same(p.grad, r.grad, **tolerance)


def _backward(out):
    out.float().square().mean().backward()
    return out.detach()


def test_symbolic_sizes_over_several_lengths(device):
    """Slices along a symbolic dim start at symbolic offsets; one compile serves each length."""
    w = rand(24, 6, device=device) / 8

    def f(x, y):
        return torch.cat([torch.sin(x) * torch.cos(x), torch.exp(y)], dim=0).t() @ rand_rows(x, y)

    def rand_rows(x, y):
        return torch.ones(x.shape[0] + y.shape[0], 6, device=x.device)

    def g(x, y):
        return torch.cat([torch.sin(x) * torch.cos(x), torch.exp(y)], dim=1) @ w

    compiled_f = torch.compile(f, backend="tritonfuse", dynamic=True)
    compiled_g = torch.compile(g, backend="tritonfuse", dynamic=True)
    for n in (1, 7, 13, 64):
        x, y = rand(n, 16, device=device), rand(n, 8, device=device)
        assert_same(compiled_g(x, y), g(x, y), atol=1e-4, rtol=1e-4)
        x2, y2 = rand(n, 24, device=device), rand(n + 3, 24, device=device)
        assert_same(compiled_f(x2, y2), f(x2, y2), atol=1e-4, rtol=1e-4)
    assert tritonfuse.metrics.eager_graphs == 0


def test_unequal_inputs_of_plain_arithmetic_stay_one_kernel(device):
    """Inputs of several loads but no costly math, of different sizes: slices would add a
    launch each, so the cat stays one pointwise kernel."""
    w = rand(40, 4, device=device) / 8

    def f(a, b, c, d):
        return torch.cat([a + b + c, d * 2 + a[:, :16] - b[:, :16]], dim=1) @ w

    sources = check(f, rand(8, 24, device=device), rand(8, 24, device=device), rand(8, 24, device=device),
                    rand(8, 16, device=device), atol=1e-4, rtol=1e-4)
    assert _slices(sources[0]) == 0, sources[0]


def test_equal_inputs_of_plain_arithmetic_share_one_slice_kernel(device):
    w = rand(48, 4, device=device) / 8

    def f(a, b, c):
        return torch.cat([a + b + c, a * b - c], dim=1) @ w

    sources = check(f, rand(8, 24, device=device), rand(8, 24, device=device), rand(8, 24, device=device),
                    atol=1e-4, rtol=1e-4)
    assert _slices(sources[0]) == 1, sources[0]
    assert len(_kernels(sources)) == 1


def test_the_knob_turns_slices_off(device, monkeypatch):
    from tritonfuse import config
    monkeypatch.setattr(config, "cat_slices", False)
    w = rand(56, 4, device=device) / 8

    def f(x, y):
        return torch.cat([torch.sin(x), torch.exp(y)], dim=1) @ w

    sources = check(f, rand(8, 24, device=device), rand(8, 32, device=device), atol=1e-4, rtol=1e-4)
    assert _slices(sources[0]) == 0, sources[0]
    assert len(_kernels(sources)) == 1


def test_a_gemm_templates_epilogue_writes_its_slice(device):
    """Under max-autotune a slice computed from a matmul is the GEMM template's epilogue,
    stored straight into the cat's memory (where the column has a template)."""
    w1, w2 = rand(32, 24, device=device) / 4, rand(40, 8, device=device) / 4

    def f(x, y):
        return torch.cat([torch.sin(x @ w1) * 2, torch.exp(y)], dim=1) @ w2

    x, y = rand(16, 32, device=device), rand(16, 16, device=device)
    expected = f(x, y)
    compiled = torch.compile(f, backend="tritonfuse", options={"max_autotune": True})
    actual, sources = run_and_get_code(compiled, x, y)
    assert tritonfuse.metrics.eager_graphs == 0
    assert_same(actual, expected, atol=1e-3, rtol=1e-3)
    assert _slices(sources[0]) == 1, sources[0]


def test_a_cat_output_of_slices_is_its_own_tensor(device):
    """The cat is an output: its memory is allocated or reused at its exact layout (never a
    reinterpreted dead buffer), and the output matches eager's strides."""
    def f(x, y):
        t = torch.exp(x.t().contiguous() * 2)       # dies before the cat is allocated
        z = torch.sigmoid(t).sum(0)
        return torch.cat([torch.sin(y), torch.cos(y)], dim=1), z

    sources = check(f, rand(24, 32, device=device), rand(32, 12, device=device))
    assert _slices(sources[0]) == 1, sources[0]


@pytest.mark.parametrize("pieces", ["split", "unbind"])
def test_a_cat_split_into_pointwise_readers_stays_pointwise(device, pieces):
    """Views of the cat (a split's or an unbind's pieces) pass its readers on: a pointwise
    reader behind them keeps the cat pointwise."""
    def f(x, y):
        c = torch.cat([torch.sin(x), torch.exp(y)], dim=1)
        a, b = c.split([5, 19], dim=1) if pieces == "split" else c.t().unbind(0)[:2]
        return a * 2, b + 1

    sources = check(f, rand(8, 12, device=device), rand(8, 12, device=device))
    assert _slices(sources[0]) == 0, sources[0]
