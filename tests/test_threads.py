"""Compiled functions called from many threads at once, while new shapes are compiled.

Threads that meet new shapes make Dynamo recompile (symbolically), or, where a graph
cannot be compiled symbolically, compile it per shape at call time inside a running
compiled frame (specialize.py); a backward graph compiles at the first backward. Other
threads meanwhile run warm compiled functions. Every call must give eager's answer,
nothing may run eagerly, and no compile state may leak out (a later torch.compile must
still work)."""
import threading
import time

import pytest
import torch

import tritonfuse
from common import assert_same, check, rand
from test_dynamic_shapes import _fail_symbolic_compiles


def _softmax_mix(x, y):
    return torch.softmax(x * y + 1, -1).sum(0) + torch.sigmoid(y).mean()


def _warm(a):
    return torch.relu(a) * 2 + 1


def _run_in_threads(count, work):
    """Start ``count`` threads running ``work(i)`` together; return their exceptions."""
    errors = []
    start = threading.Barrier(count)

    def run(i):
        try:
            start.wait()
            work(i)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _is_fx_tracing():
    return torch.fx._symbolic_trace._is_fx_tracing_flag


@pytest.mark.parametrize("per_shape", [False, True], ids=["symbolic", "per_shape"])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_threads_compile_new_shapes_while_warm_functions_run(device, requires_grad, per_shape, monkeypatch):
    if per_shape:
        _fail_symbolic_compiles(monkeypatch)
    new_shape = torch.compile(_softmax_mix, backend="tritonfuse")
    warm = torch.compile(_warm, backend="tritonfuse")
    x0, y0 = rand(8, 32, device=device), rand(8, 32, device=device)
    assert_same(new_shape(x0, y0), _softmax_mix(x0, y0))    # the first shape: a static compile
    a = rand(16, 16, device=device)
    assert_same(warm(a), _warm(a))
    kernels_before = tritonfuse.metrics.generated_kernel_count
    stop = threading.Event()

    def call_warm_until_stopped():
        while not stop.is_set():
            assert_same(warm(a), _warm(a))
            time.sleep(0.001)    # often enough to meet every trace, leaving the CPU to compiles

    def call_new_shapes(i):
        try:
            x = rand(9 + i, 32, device=device).requires_grad_(requires_grad)
            y = rand(9 + i, 32, device=device)
            actual = new_shape(x, y)
            assert_same(actual, _softmax_mix(x, y))
            if requires_grad:
                (grad,) = torch.autograd.grad(actual.sum(), x)
                (expected,) = torch.autograd.grad(_softmax_mix(x, y).sum(), x)
                assert_same(grad, expected)
            assert_same(warm(a), _warm(a))
        finally:
            if i == 0:
                stop.set()

    errors = []
    hammer = threading.Thread(target=lambda: errors.extend(_run_in_threads(1, lambda _: call_warm_until_stopped())))
    hammer.start()
    errors += _run_in_threads(4, call_new_shapes)
    hammer.join()
    assert not errors, errors[0]
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.generated_kernel_count > kernels_before
    assert not _is_fx_tracing()
    check(lambda t: torch.cos(t) + 1, rand(5, 7, device=device))   # compiling still works


def test_threads_meeting_the_same_new_shape_compile_it_once(device, monkeypatch):
    _fail_symbolic_compiles(monkeypatch)

    def fn(x):
        return torch.exp(x).sum(-1) / x.shape[-1]

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    inputs = [rand(rows, 24, device=device) for rows in (3, 5, 7)]
    with torch.no_grad():
        assert_same(compiled(inputs[0]), fn(inputs[0]))
        kernels_per_shape = tritonfuse.metrics.generated_kernel_count

    def call_every_shape(i):
        with torch.no_grad():
            for x in inputs[1:]:
                assert_same(compiled(x), fn(x))

    errors = _run_in_threads(4, call_every_shape)
    assert not errors, errors[0]
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.graph_cache_hits == 0       # no second compile of the same shape
    assert tritonfuse.metrics.static_specializations == 3
    assert tritonfuse.metrics.generated_kernel_count == 3 * kernels_per_shape


def test_a_failing_call_time_compile_leaks_no_compile_state(device, monkeypatch):
    from tritonfuse import compile_fx

    def fail(*args):
        raise RuntimeError("pretend: this graph cannot be compiled")
    monkeypatch.setattr(compile_fx, "_compile_graph", fail)   # symbolic and per-shape compiles fail

    def fn(x):
        return (x * 0.5).sin().sum(-1)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows in (4, 5):
            x = rand(rows, 16, device=device)
            assert_same(compiled(x), fn(x))       # eagerly
    assert not _is_fx_tracing()
    assert not torch.compiler.is_compiling()
    monkeypatch.undo()
    tritonfuse.metrics.reset()      # the graph that could not be compiled counted as eager
    check(lambda t: torch.cos(t) + 1, rand(5, 7, device=device))


def test_threads_make_the_first_call_together(device):
    # Dynamo's compile, then each kernel's first launch (C++ load, Triton load and config
    # choice) happen while other threads wait for them or call in
    compiled = torch.compile(_softmax_mix, backend="tritonfuse")
    inputs = [(rand(8, 16, device=device), rand(8, 16, device=device)) for _ in range(4)]

    def call(i):
        for _ in range(2):
            assert_same(compiled(*inputs[i]), _softmax_mix(*inputs[i]))

    errors = _run_in_threads(4, call)
    assert not errors, errors[0]
    assert tritonfuse.metrics.eager_graphs == 0
    assert not _is_fx_tracing()
