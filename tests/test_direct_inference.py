"""Inference graphs called without aot_autograd's runtime wrapper (tritonfuse/direct_inference.py):
taken only when that wrapper would have nothing to do, and always the same answer as eager."""
import pytest
import torch

import tritonfuse
from common import assert_same, rand, storage_sharing


def _compile_and_compare(fn, *inputs):
    """Run fn eagerly and compiled on clones of inputs; compare results and mutated inputs."""
    def clones():
        return [i.clone() if isinstance(i, torch.Tensor) else i for i in inputs]

    eager_inputs = clones()
    expected = fn(*eager_inputs)
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=False)
    for _ in range(2):   # the first call and a steady-state call
        compiled_inputs = clones()
        actual = compiled(*compiled_inputs)
        assert_same(actual, expected)
        assert_same(compiled_inputs, eager_inputs)   # input mutations land as in eager
    assert tritonfuse.metrics.eager_graphs == 0
    return actual


def test_plain_inference_graph_is_called_directly(device):
    def fn(x, y):
        return torch.sigmoid(x * 2 + y).sum(-1), torch.softmax(x, -1)

    with torch.no_grad():
        _compile_and_compare(fn, rand(8, 33, device=device), rand(8, 33, device=device))
    assert tritonfuse.metrics.direct_inference_graphs == 1


def test_module_parameters_under_no_grad(device):
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.GELU()).to(device)
    with torch.no_grad():
        out = _compile_and_compare(model, rand(4, 16, device=device))
    assert not out.requires_grad
    assert tritonfuse.metrics.direct_inference_graphs == 1


def test_grad_mode_on_without_inputs_needing_grad(device):
    def fn(x):
        return torch.tanh(x) * 3

    assert torch.is_grad_enabled()
    out = _compile_and_compare(fn, rand(5, 7, device=device))
    assert not out.requires_grad and out.grad_fn is None
    assert torch.is_grad_enabled()   # restored after the call
    assert tritonfuse.metrics.direct_inference_graphs == 1


def _mutates_input(x):
    x.mul_(2)
    return x + 1


def _returns_a_view_of_an_input(x):
    return x.view(-1), x * 2


@pytest.mark.parametrize("fn", [_mutates_input, _returns_a_view_of_an_input], ids=lambda fn: fn.__name__.strip("_"))
def test_graphs_that_need_the_runtime_wrapper_keep_it(device, fn):
    with torch.no_grad():
        _compile_and_compare(fn, rand(6, 5, device=device))
    assert tritonfuse.metrics.direct_inference_graphs == 0


def _returns_an_input(x):
    return x, torch.exp(x)


def _returns_one_tensor_twice(x):
    y = torch.exp(x)
    return y, y


def _returns_a_view_of_an_intermediate(x):
    y = torch.exp(x)
    return y, y.t()


def _multiply_add(x, y):   # called with the same tensor twice
    return x * y + 1


@pytest.mark.parametrize("fn", [_returns_an_input, _returns_one_tensor_twice, _returns_a_view_of_an_intermediate,
                                _multiply_add], ids=lambda fn: fn.__name__.strip("_"))
def test_aliasing_that_dynamo_resolves_is_kept(device, fn):
    """Dynamo returns inputs and repeated outputs itself, and dedups inputs; a view of an
    intermediate is returned as a view by the generated code. The caller sees eager's aliasing."""
    x = rand(6, 5, device=device)
    args = (x, x) if fn is _multiply_add else (x,)
    with torch.no_grad():
        expected = fn(*args)
        actual = torch.compile(fn, backend="tritonfuse", dynamic=False)(*args)
    assert_same(actual, expected)
    if isinstance(expected, tuple):
        assert storage_sharing([x, *actual]) == storage_sharing([x, *expected])


def test_autocast_keeps_the_wrapper():
    def fn(x, w):
        return torch.relu(x @ w) + 1

    x, w = rand(8, 16), rand(16, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = fn(x, w)
        actual = torch.compile(fn, backend="tritonfuse", dynamic=False)(x, w)
    assert_same(actual, expected)
    assert tritonfuse.metrics.direct_inference_graphs == 0


def test_training_graphs_keep_the_wrapper(device):
    x = rand(4, 6, device=device).requires_grad_()
    out = torch.compile(lambda t: torch.sin(t) * 2, backend="tritonfuse", dynamic=False)(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(x.detach()))
    assert tritonfuse.metrics.direct_inference_graphs == 0


def test_switch_off(device, monkeypatch):
    monkeypatch.setattr(tritonfuse.config, "direct_inference", False)
    with torch.no_grad():
        _compile_and_compare(lambda x: torch.exp(x) - 1, rand(3, 3, device=device))
    assert tritonfuse.metrics.direct_inference_graphs == 0
