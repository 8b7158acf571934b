"""Graphs with dynamic shapes: one static compile per input shape (tritonfuse/specialize.py),
forward and backward, the same answers as eager."""
import logging

import torch

import tritonfuse
from common import assert_same, rand


def _model(x, w):
    h = torch.softmax(x @ w, -1)
    return (h * torch.sigmoid(x[:, :1])).sum(0), h.reshape(x.shape[0] * 2, -1).mean(-1)


def test_dynamic_true_compiles_each_shape_once(device):
    w = rand(8, 16, device=device).requires_grad_()
    compiled = torch.compile(_model, backend="tritonfuse", dynamic=True)
    kernels_after_first = None
    for rows in (3, 5, 11, 5):
        x = rand(rows, 8, device=device).requires_grad_()
        actual = compiled(x, w)
        sum(o.sum() for o in actual).backward()
        grads = (x.grad.clone(), w.grad.clone())
        x.grad = w.grad = None
        expected = _model(x, w)
        sum(o.sum() for o in expected).backward()
        assert_same(actual, expected, atol=1e-5, rtol=1e-4)
        assert_same(grads, (x.grad, w.grad), atol=1e-5, rtol=1e-4)
        w.grad = None
        if rows == 3:
            kernels_after_first = tritonfuse.metrics.generated_kernel_count
    assert tritonfuse.metrics.eager_graphs == 0
    assert kernels_after_first > 0
    # shapes 3, 5 and 11 each compiled once; the second 5 reused its compile
    assert tritonfuse.metrics.generated_kernel_count == 3 * kernels_after_first


def test_recompile_after_a_shape_change_is_still_compiled(device):
    def fn(x):
        return (torch.sin(x) * 2).sum(-1) / x.shape[-1]

    compiled = torch.compile(fn, backend="tritonfuse")   # dynamic=None: static first, then dynamic
    with torch.no_grad():
        for rows in (4, 6, 9):
            x = rand(rows, 33, device=device)
            assert_same(compiled(x), fn(x))
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.generated_kernel_count == 3


def test_too_many_shapes_run_eagerly_and_say_so(device, monkeypatch, caplog):
    monkeypatch.setattr(tritonfuse.config, "max_shape_specializations", 2)
    compiled = torch.compile(lambda x: torch.exp(x) + 1, backend="tritonfuse", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="tritonfuse"), torch.no_grad():
        for rows in (2, 3, 4, 5):
            x = rand(rows, 7, device=device)
            assert_same(compiled(x), torch.exp(x) + 1)
    assert tritonfuse.metrics.generated_kernel_count == 2
    assert sum("input shapes for one graph" in r.getMessage() for r in caplog.records) == 1


def test_graph_that_cannot_be_specialized_runs_eagerly(device, caplog):
    # Dynamo passes a Python float as a 0-d tensor read with .item(): no static trace exists
    def fn(x, scale):
        return (x * scale).sin().sum(-1)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="tritonfuse"), torch.no_grad():
        for rows, scale in ((4, 0.5), (5, 0.25), (6, 0.5)):
            x = rand(rows, 64, device=device)
            assert_same(compiled(x, scale), fn(x, scale))
    assert any("runs eagerly" in r.getMessage() for r in caplog.records)
