"""Layout ops as index remappings (lowering/layout.py): flip, roll, tril/triu, reflection
and replication padding and their backwards, repeat and tile. Each matches eager on every
column of the device matrix, forward and backward, generates kernels and no fallback, and
fuses with its neighbours."""
import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import check, kernel_count, rand


def _no_fallbacks():
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    assert kernel_count() >= 1


def _check_against_eager(compiled, fn, x):
    """Forward and backward against eager (the input gradient of sum(fn(x) * weight))."""
    weight = torch.randn_like(fn(x.detach()))

    def loss_and_grad(model):
        leaf = x.detach().clone().requires_grad_()
        out = model(leaf)
        (out * weight).sum().backward()
        return out.detach(), leaf.grad

    expected = loss_and_grad(fn)
    actual = loss_and_grad(compiled)
    assert tritonfuse.metrics.eager_graphs == 0
    for a, e in zip(actual, expected):
        # a backward sums several mixed-sign products into one element (a padded border's
        # gradient, a roll's wrap), so fp32 loses digits to cancellation: its error bound is
        # eps * sum(|terms|), which scales with the largest value rather than each element's
        scale = e.abs().max().item() if e.numel() else 0.0
        torch.testing.assert_close(a, e, atol=1e-5 + 1e-6 * scale, rtol=1e-5)


def check_with_grad(fn, x):
    _check_against_eager(torch.compile(fn, backend="tritonfuse", dynamic=False), fn, x)


# each shape's dims differ from one another (Dynamo gives equal sizes one symbol) and from
# the other shapes' (every dim is symbolic)
SYMBOLIC_SHAPES = [(2, 3, 7, 9), (3, 4, 10, 6), (4, 5, 13, 15)]


def check_symbolic_with_grad(fn, device, shapes=SYMBOLIC_SHAPES):
    """One symbolic compile (dynamic=True) of the forward and of the backward serves every
    shape, with eager's answers; no kernel is generated after the first shape."""
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    kernels = []
    for shape in shapes:
        _check_against_eager(compiled, fn, rand(*shape, device=device))
        kernels.append(kernel_count())
    metrics = tritonfuse.metrics
    assert metrics.symbolic_graphs == 2 and metrics.static_specializations == 0, \
        (metrics.symbolic_graphs, metrics.static_specializations)
    assert kernels[0] >= 1 and len(set(kernels)) == 1, kernels


SHAPES = [(5, 7), (2, 3, 9, 11), (4, 1, 6)]

LAYOUT = {
    "flip_last": lambda x: torch.flip(x, [-1]),
    "flip_all": lambda x: torch.flip(x, list(range(x.dim()))),
    "roll": lambda x: torch.roll(x, 2, -1),
    "roll_two_dims": lambda x: torch.roll(x, (-3, 1), (0, -1)),
    "roll_flat": lambda x: torch.roll(x, 5),
    "roll_more_than_size": lambda x: torch.roll(x, 23, 0),
    "tril": lambda x: torch.tril(x),
    "tril_above": lambda x: torch.tril(x, 2),
    "triu": lambda x: torch.triu(x),
    "triu_below": lambda x: torch.triu(x, -1),
    "repeat": lambda x: x.repeat(*([2] + [1] * (x.dim() - 2) + [3])),
    "repeat_new_dims": lambda x: x.repeat(2, *([1] * x.dim())),
    "tile": lambda x: torch.tile(x, (3, 2)),
}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(LAYOUT))
def test_layout_op(device, name, shape):
    check_with_grad(LAYOUT[name], rand(*shape, device=device))
    _no_fallbacks()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("name", ["flip_all", "roll_two_dims", "tril", "triu_below", "tile"])
def test_layout_op_dtypes(device, name, dtype):
    check(LAYOUT[name], rand(6, 9, dtype=dtype, device=device))
    _no_fallbacks()


def test_layout_op_on_a_transposed_input(device):
    x = rand(9, 6, device=device).t()
    check(lambda a: (torch.flip(a, [0]), torch.roll(a, 1, 1), torch.triu(a, 1)), x)
    _no_fallbacks()


PADS = {
    "reflect1d": (lambda x: F.pad(x, (2, 3), mode="reflect"), (3, 9)),
    "reflect1d_batched": (lambda x: F.pad(x, (4, 1), mode="reflect"), (2, 3, 7)),
    "reflect2d": (lambda x: F.pad(x, (2, 3, 1, 2), mode="reflect"), (2, 3, 5, 7)),
    "reflect2d_unbatched": (lambda x: F.pad(x, (1, 1, 3, 0), mode="reflect"), (3, 6, 5)),
    "reflect3d": (lambda x: F.pad(x, (1, 2, 2, 1, 1, 1), mode="reflect"), (1, 2, 4, 5, 6)),
    "replicate1d": (lambda x: F.pad(x, (2, 3), mode="replicate"), (3, 9)),
    "replicate2d": (lambda x: F.pad(x, (2, 3, 1, 4), mode="replicate"), (2, 3, 5, 7)),
    "replicate2d_wide": (lambda x: F.pad(x, (6, 5, 0, 7), mode="replicate"), (1, 2, 4, 3)),
    "replicate3d": (lambda x: F.pad(x, (1, 2, 2, 1, 1, 1), mode="replicate"), (1, 2, 4, 5, 6)),
}


@pytest.mark.parametrize("name", sorted(PADS))
def test_pad(device, name):
    fn, shape = PADS[name]
    check_with_grad(fn, rand(*shape, device=device))
    _no_fallbacks()


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
def test_pad_bfloat16(device, mode):
    x = rand(2, 3, 6, 7, dtype=torch.bfloat16, device=device)
    check(lambda a: F.pad(a, (3, 2, 2, 1), mode=mode), x)
    _no_fallbacks()


def test_flip_fuses_into_one_kernel(device):
    """relu(flip(x)) + 1: the flip is a read with another index, not a pass of its own."""
    x = rand(8, 33, device=device)
    sources = check(lambda a: torch.relu(torch.flip(a, [1])) + 1, x)
    _no_fallbacks()
    assert kernel_count() == 1
    assert sources[-1].count("in_ptr0") >= 1


def test_layout_chain_fuses_into_one_kernel(device):
    x = rand(2, 3, 6, 9, device=device)
    check(lambda a: torch.tril(torch.roll(F.pad(a.sigmoid(), (2, 2, 1, 1), mode="reflect"), 1, -1)) * 3, x)
    _no_fallbacks()
    assert kernel_count() == 1


def test_pad_backward_fuses_with_its_consumer(device):
    x = rand(2, 3, 6, 9, device=device)
    check_with_grad(lambda a: F.pad(a * a, (2, 1, 1, 2), mode="replicate").exp(), x)
    _no_fallbacks()


SYMBOLIC = {
    "flip": lambda x: torch.flip(x, [0, -1]),
    "roll": lambda x: torch.roll(x, (3, -2, 11), (-1, 0, 2)),
    "roll_flat": lambda x: torch.roll(x, 5),
    "tril_triu": lambda x: torch.tril(x, 1) - torch.triu(x, -1),
    "reflection_pad": lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"),
    "reflection_pad1d": lambda x: F.pad(x[0], (0, 3), mode="reflect"),
    "replication_pad": lambda x: F.pad(x, (2, 1, 0, 3), mode="replicate"),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC))
def test_layout_op_with_symbolic_sizes(device, name):
    check_symbolic_with_grad(SYMBOLIC[name], device)
    _no_fallbacks()
