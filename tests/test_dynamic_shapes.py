"""Dynamic shapes: a graph Dynamo hands over with symbolic sizes is compiled once, with its
sizes as runtime values, and serves every size: forward and backward, the same answers as
eager. Sizes 0/1 specialize as Dynamo decides; a graph that cannot be compiled
symbolically falls back to one compile per input shape, and past a cap to eager, counted."""
import logging
import math

import pytest
import torch

import tritonfuse
from common import assert_same, rand

# sizes that are primes, not multiples of any block, and a power of two
LENGTHS = (7, 33, 13, 64, 97)


def _model(x, w):
    h = torch.softmax(x @ w, -1)
    return (h * torch.sigmoid(x[:, :1])).sum(0), h.reshape(x.shape[0] * 2, -1).mean(-1)


def test_one_symbolic_compile_serves_every_length_in_training(device):
    w = rand(8, 16, device=device).requires_grad_()
    compiled = torch.compile(_model, backend="tritonfuse", dynamic=True)
    kernels = []
    for rows in LENGTHS:
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
        kernels.append(tritonfuse.metrics.generated_kernel_count)
    metrics = tritonfuse.metrics
    assert metrics.eager_graphs == 0 and metrics.static_specializations == 0
    assert metrics.symbolic_graphs == 2           # the forward and the backward, once each
    assert kernels[0] > 0 and len(set(kernels)) == 1, kernels   # no kernel generated after the first length


def _norm_and_reduce(x, y):
    z = torch.nn.functional.layer_norm(x * 2, x.shape[-1:]) + y[: x.shape[0], None]
    return z.sum(0), torch.softmax(z, 0).amax(-1), z.var(-1)


@pytest.mark.parametrize("dynamic_dim", ["rows", "both"])
def test_symbolic_reductions_and_slices_match_eager(device, dynamic_dim):
    compiled = torch.compile(_norm_and_reduce, backend="tritonfuse", dynamic=True)
    y = rand(128, device=device)
    with torch.no_grad():
        for rows in LENGTHS:
            cols = 40 if dynamic_dim == "rows" else rows + 3
            x = rand(rows, cols, device=device)
            assert_same(compiled(x, y), _norm_and_reduce(x, y), atol=1e-4, rtol=1e-4)
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.static_specializations == 0
    assert tritonfuse.metrics.symbolic_graphs >= 1


def test_recompile_after_a_shape_change_is_symbolic_and_then_final(device):
    def fn(x):
        return (torch.sin(x) * 2).sum(-1) / x.shape[-1]

    compiled = torch.compile(fn, backend="tritonfuse")   # dynamic=None: static first, then dynamic
    counts = []
    with torch.no_grad():
        for rows in (4, 6, 9, 31, 2):
            x = rand(rows, 33, device=device)
            assert_same(compiled(x), fn(x))
            counts.append(tritonfuse.metrics.generated_kernel_count)
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.symbolic_graphs == 1
    assert counts[0] == 1 and counts[1] == 2 and counts[-1] == 2, counts   # static, symbolic, then nothing


def test_size_one_specializes_and_a_guard_failure_recompiles(device):
    def fn(x):
        if x.shape[0] > 16:           # a guard on the size: crossing it recompiles
            return torch.relu(x).sum(0)
        return torch.exp(x).sum(0)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows in (3, 5, 1, 40, 23, 1, 7):
            x = rand(rows, 9, device=device)
            assert_same(compiled(x), fn(x), atol=1e-5, rtol=1e-5)
    assert tritonfuse.metrics.eager_graphs == 0


def test_a_runtime_scalar_reaches_the_kernels(device):
    # Dynamo passes a Python float as a 0-d tensor read with .item(): its value is a
    # runtime scalar of the generated kernels
    def fn(x, scale):
        return (x * scale).sin().sum(-1)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows, scale in ((4, 0.5), (5, 0.25), (6, 0.5), (9, -1.5)):
            x = rand(rows, 64, device=device)
            assert_same(compiled(x, scale), fn(x, scale), atol=1e-5, rtol=1e-5)
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.generated_kernel_count >= 1


def test_loads_that_no_row_indexes_have_no_row_mask(device):
    # the rows (symbolic, and 7, 13: no block divides them) need xmask; a 0-d scale and a
    # weight read along the reduced dim do not: their addresses are valid in every row
    from tritonfuse.testing import run_and_get_code

    def fn(x, w, scale):
        return ((x * w) * scale).sum(-1), (x + scale).amax(-1)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    w, scale = rand(300, device=device), rand((), device=device)
    sources = []
    with torch.no_grad():
        for rows in (7, 13, 64):
            x = rand(rows, 300, device=device)
            actual, code = run_and_get_code(compiled, x, w, scale)
            assert_same(actual, fn(x, w, scale), atol=1e-4, rtol=1e-5)
            sources += code
    assert tritonfuse.metrics.eager_graphs == 0
    kernels = "\n".join(s for s in sources if "@triton.jit" in s)
    if not kernels:
        pytest.skip("the C++ column makes no Triton kernels, so there are no masks to check (its results were compared above)")
    row_free = [line for line in kernels.splitlines() if "tl.load(" in line
                and "x" not in line.split("tl.load(")[1].split(")")[0].split("+", 1)[1]]
    assert row_free, kernels
    assert not [line for line in row_free if "xmask" in line], kernels
    assert "xmask" in kernels


@pytest.mark.parametrize("cols, masked", [(768, False), (96, True)])
def test_static_columns_of_a_symbolic_reduction_need_no_row_mask(device, cols, masked):
    # a column sum over a symbolic row count (a norm weight's gradient over batch x length):
    # 768 columns, every XBLOCK up to 256 divides them (the launcher keeps to that): no xmask;
    # 96 (32 x 3) keeps it
    from tritonfuse.testing import run_and_get_code

    def fn(x, y):
        return (x * y).sum(0), x.amax(0)

    compiled = torch.compile(fn, backend="tritonfuse")
    sources = []
    with torch.no_grad():
        for rows in (7, 13, 64, 97):
            x, y = rand(rows, cols, device=device), rand(rows, cols, device=device)
            torch._dynamo.mark_dynamic(x, 0)   # the rows only: the columns stay static
            torch._dynamo.mark_dynamic(y, 0)
            actual, code = run_and_get_code(compiled, x, y)
            assert_same(actual, fn(x, y), atol=1e-4, rtol=1e-5)
            sources += code
    assert tritonfuse.metrics.eager_graphs == 0 and tritonfuse.metrics.symbolic_graphs == 1
    kernels = "\n".join(s for s in sources if "@triton.jit" in s or "source=" in s)
    if "@triton.jit" not in kernels:
        pytest.skip("the C++ column makes no Triton kernels, so there are no masks to check (its results were compared above)")
    assert ("xmask" in kernels) == masked, kernels


def _fail_symbolic_compiles(monkeypatch):
    """Make the symbolic compile fail, as an op that needs a concrete size would."""
    from tritonfuse import compile_fx
    real = compile_fx._compile_graph

    def only_static(gm, example_inputs, graph_id, sizevars, *options):
        if sizevars.shape_env is not None and not sizevars.specialize:
            raise NotImplementedError("pretend: this graph needs concrete sizes")
        return real(gm, example_inputs, graph_id, sizevars, *options)
    monkeypatch.setattr(compile_fx, "_compile_graph", only_static)


def test_integer_division_by_a_symbolic_size(device):
    """// and % by a size that is a runtime scalar of the kernel: its zero check (eager's
    error) combines a scalar with the block's mask; Triton's interpreter took that mask for
    ints and the graph ran eagerly."""
    def fn(x):
        i = torch.arange(x.numel(), device=x.device).view(x.shape)
        return x + torch.div(i, x.shape[-1], rounding_mode="floor") + torch.remainder(i, x.shape[-1])

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for shape in ((3, 5), (4, 7), (2, 9)):
            x = rand(*shape, device=device)
            assert_same(compiled(x), fn(x))
    assert tritonfuse.metrics.eager_graphs == 0


def _rounded_ratio_sizes(x):
    """Sizes from math.ceil / math.floor / int() of a size ratio, as HF models compute
    their bucket and window counts (BART's graph held CeilToInt and ran eagerly on a GPU,
    with a NameError from its wrapper)."""
    n = x.shape[0]
    head = x[: math.ceil(n / 3)] * 2
    pooled = x.new_ones(math.floor(n / 2), x.shape[1]) * x[: math.floor(n / 2)].sum(0)
    return head.sum(0) + pooled.sum(0), x.reshape(-1)[: int(n * x.shape[1] / 4)].cumsum(0)


def test_sizes_rounded_from_a_ratio_compile_symbolically(device):
    compiled = torch.compile(_rounded_ratio_sizes, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows in (7, 33, 13, 64):
            x = rand(rows, 5, device=device)
            assert_same(compiled(x), _rounded_ratio_sizes(x), atol=1e-4, rtol=1e-4)
    metrics = tritonfuse.metrics
    assert metrics.eager_graphs == 0 and metrics.static_specializations == 0
    assert metrics.symbolic_graphs == 1


def test_a_size_no_printer_can_write_compiles_per_shape_not_eagerly(device):
    """round() of a size (Dynamo's RoundToInt) has no exact integer form here: the graph is
    compiled per shape, and nothing fails when it runs."""
    def fn(x):
        return x[: round(x.shape[0] * 0.5)] + 1

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows in (7, 10, 13):
            x = rand(rows, device=device)
            assert_same(compiled(x), fn(x))
    metrics = tritonfuse.metrics
    assert metrics.eager_graphs == 0 and metrics.symbolic_graphs == 0
    assert metrics.static_specializations == 3


def test_a_graph_that_cannot_be_symbolic_compiles_per_shape(device, monkeypatch):
    _fail_symbolic_compiles(monkeypatch)
    w = rand(8, 16, device=device).requires_grad_()
    compiled = torch.compile(_model, backend="tritonfuse", dynamic=True)
    for rows in (3, 5, 3):
        x = rand(rows, 8, device=device).requires_grad_()
        actual = compiled(x, w)
        sum(o.sum() for o in actual).backward()
        expected = _model(x.detach(), w.detach())
        assert_same(actual, expected, atol=1e-5, rtol=1e-4)
    metrics = tritonfuse.metrics
    assert metrics.eager_graphs == 0 and metrics.symbolic_graphs == 0
    assert metrics.static_specializations == 4      # (forward + backward) x two distinct shapes


def test_past_the_cap_shapes_run_eagerly_counted_and_logged(device, monkeypatch, caplog):
    _fail_symbolic_compiles(monkeypatch)
    monkeypatch.setattr(tritonfuse.config, "max_shape_specializations", 2)
    compiled = torch.compile(lambda x: torch.exp(x) + 1, backend="tritonfuse", dynamic=True)
    with caplog.at_level(logging.WARNING, logger="tritonfuse"), torch.no_grad():
        for rows in (2, 3, 4, 5):
            x = rand(rows, 7, device=device)
            assert_same(compiled(x), torch.exp(x) + 1)
    assert tritonfuse.metrics.static_specializations == 2
    assert tritonfuse.metrics.eager_graphs == 2         # shapes 4 and 5
    assert sum("input shapes for" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_a_cpu_scalar_tensor_is_read_on_the_host(device, dtype, monkeypatch):
    # on a GPU, a 0-d CPU tensor input (how Dynamo passes an unspecialized Python float)
    # reaches kernels as a host-read scalar; forced here on every column
    from tritonfuse.graph import GraphLowering
    monkeypatch.setattr(GraphLowering, "_is_host_scalar", lambda self, t: t.dim() == 0 and t.device.type == "cpu")

    def fn(x, scale):
        return (scale * x).sin().sum(-1) + scale

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows, value in ((4, 3), (5, -2), (7, 5)):
            x = rand(rows, 64, device=device)
            scale = torch.tensor(value, dtype=dtype)
            assert_same(compiled(x, scale), fn(x, scale), atol=1e-5, rtol=1e-5)
    assert tritonfuse.metrics.eager_graphs == 0


def test_a_host_scalars_cast_that_eager_keeps_on_the_cpu_is_made_there(device, monkeypatch):
    # aot_autograd saves eps.to(float32) of an RMSNorm's epsilon (a 0-d CPU tensor under
    # dynamic=True) for the backward: made on the GPU and copied back, it made the host
    # wait for every kernel queued before it, once per training step
    from tritonfuse.graph import GraphLowering
    monkeypatch.setattr(GraphLowering, "_is_host_scalar", lambda self, t: t.dim() == 0 and t.device.type == "cpu")

    def fn(x, eps):
        e = eps.to(torch.float32)
        return x.sin() * e, e, eps.to(torch.float16)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for rows, value in ((4, 1e-6), (5, 0.1), (5, 1 / 3)):
            x = rand(rows, 64, device=device)
            eps = torch.tensor(value, dtype=torch.float64)
            expected = fn(x, eps)
            if device.startswith("cuda") and rows == 5:       # compiled at rows 4 and 5
                torch.cuda.set_sync_debug_mode("error")
            try:
                actual = compiled(x, eps)
            finally:
                if device.startswith("cuda"):
                    torch.cuda.set_sync_debug_mode(0)
            for a, e in zip(actual, expected):
                assert a.device == e.device and a.dtype == e.dtype
                assert_same(a, e, atol=1e-6, rtol=1e-6)
    assert tritonfuse.metrics.eager_graphs == 0
