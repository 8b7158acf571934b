"""Graph inputs written in place inside the compiled graph (lowering/input_mutation.py):
aot_autograd keeps each mutation of an input that needs no gradient as a ``copy_`` at the
end of the graph, and the kernel computing the new value writes it into the input.

Every test runs the function eagerly and compiled on clones of the same inputs, several
calls in a row, and compares the results and the mutated inputs after each call."""
import pytest
import torch

import tritonfuse
from tests.common import assert_same
from tritonfuse.testing import run_and_get_code


class _CopiesInto:
    """Counts the ``Tensor.copy_`` calls that write into one of ``tensors`` (by storage):
    aot_autograd's runtime wrapper writes a mutated input back so, after the graph (a
    dispatch mode would not do: Dynamo runs the frame eagerly under one)."""

    def __init__(self, tensors):
        self.storages = {t.untyped_storage().data_ptr() for t in tensors}
        self.count = 0

    def __enter__(self):
        self.original = original = torch.Tensor.copy_

        def counting_copy_(dst, *args, **kwargs):
            if dst.untyped_storage().data_ptr() in self.storages:
                self.count += 1
            return original(dst, *args, **kwargs)
        torch.Tensor.copy_ = counting_copy_
        return self

    def __exit__(self, *exc):
        torch.Tensor.copy_ = self.original


def _clones(inputs):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def check_mutation(fn, *inputs, calls=3, dynamic=False, atol=None, rtol=None, make=None):
    """``fn`` eager and compiled, ``calls`` times each on its own copies of ``inputs``
    (``make(inputs)``: how to copy them, for inputs that are views); returns the sources."""
    make = make or _clones
    eager_inputs, compiled_inputs = make(inputs), make(inputs)
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=dynamic)
    sources = None
    for _ in range(calls):
        expected = fn(*eager_inputs)
        if sources is None:
            actual, sources = run_and_get_code(compiled, *compiled_inputs)
        else:
            actual = compiled(*compiled_inputs)
        assert_same(actual, expected, atol, rtol)
        assert_same(list(compiled_inputs), list(eager_inputs), atol, rtol)
    assert tritonfuse.metrics.eager_graphs == 0
    return sources


def test_add_in_place(device):
    def fn(x):
        x.add_(1)
        return x.sum()
    sources = check_mutation(fn, torch.randn(8, 16, device=device))
    assert "MUTATED_INPUTS" in sources[0]


def test_mul_in_place_read_before(device):
    """x is read by another value before it is written (write after read)."""
    def fn(x, y):
        z = x * y + x.flip(0)
        x.mul_(2)
        return z, x.sum()
    check_mutation(fn, torch.randn(6, 10, device=device), torch.randn(6, 10, device=device))


def test_read_of_the_old_value_by_a_fallback(device):
    """An aten call (a matmul) and a view of the input read the old value."""
    def fn(x, w):
        y = x @ w
        t = x.t()[1:]
        x.add_(y[:, :1])
        return y, t * 2
    check_mutation(fn, torch.randn(6, 6, device=device), torch.randn(6, 4, device=device))


def test_read_of_the_old_value_by_a_reduction(device):
    def fn(x):
        total = x.sum(1, keepdim=True)
        x.sub_(1.5)
        return total * 2
    check_mutation(fn, torch.randn(5, 33, device=device))


def test_copy_of_the_transpose(device):
    """The new value reads the input at other elements: never in the same kernel."""
    def fn(x):
        x.copy_(x.t() * 2)
        return x + 1
    check_mutation(fn, torch.randn(7, 7, device=device))


def test_overwritten_without_being_read(device):
    def fn(x, y):
        x.copy_(y * 2)
        return y + 1
    sources = check_mutation(fn, torch.randn(4, 6, device=device), torch.randn(4, 6, device=device))
    assert "MUTATED_INPUTS" in sources[0]


def test_two_inputs_swapped(device):
    def fn(x, y):
        tmp = x.clone()
        x.copy_(y)
        y.copy_(tmp)
        return x + y
    check_mutation(fn, torch.randn(4, 5, device=device), torch.randn(4, 5, device=device))


def test_transposed_input(device):
    def fn(x):
        x.mul_(3).add_(1)
        return x.sum(0)

    def make(inputs):
        return [inputs[0].clone().t()]
    check_mutation(fn, torch.randn(6, 9, device=device), make=make)


def test_slice_with_storage_offset(device):
    def fn(x):
        x.add_(x * 0.5)
        return x.mean()

    def make(inputs):
        return [inputs[0].clone()[2:, 1:7]]
    check_mutation(fn, torch.randn(8, 10, device=device), make=make)


def test_kv_cache_index_copy(device):
    def fn(cache, positions, values):
        cache.index_copy_(1, positions, values)
        return cache.sum(1)
    positions = torch.tensor([3, 0], device=device)
    check_mutation(fn, torch.zeros(2, 6, 4, device=device), positions, torch.randn(2, 2, 4, device=device))


def test_kv_cache_slice_assignment(device):
    def fn(cache, k, pos):
        cache[:, pos] = k
        return cache[:, : pos + 1].sum()
    check_mutation(fn, torch.zeros(2, 8, 4, device=device), torch.randn(2, 4, device=device), 3)


def test_index_put_accumulate(device):
    def fn(buf, index, values):
        buf.index_put_((index,), values, accumulate=True)
        return buf * 2
    index = torch.tensor([1, 3, 1], device=device)
    check_mutation(fn, torch.zeros(5, 3, device=device), index, torch.randn(3, 3, device=device))


def test_mutated_and_returned(device):
    def fn(x):
        x.mul_(2)
        return x, x + 1
    check_mutation(fn, torch.randn(3, 4, device=device))


def test_inputs_that_alias(device):
    def fn(a, b):
        a.add_(1)
        return a * b

    def make(inputs):
        base = inputs[0].clone()
        return [base[:4], base[2:6]]
    check_mutation(fn, torch.randn(6, 5, device=device), make=make)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_dtypes(device, dtype):
    def fn(x, y):
        x.add_(y)
        x.bitwise_and_(63)
        return (x * 3).sum()
    x = torch.randint(0, 50, (4, 9), device=device, dtype=dtype)
    y = torch.randint(0, 50, (4, 9), device=device, dtype=dtype)
    check_mutation(fn, x, y)


def test_dynamic_shapes(device):
    def fn(x):
        x.mul_(0.5).add_(2)
        return x.sum(0)
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    for rows in (5, 7, 9):
        x = torch.randn(rows, 6, device=device)
        expected_x = x.clone()
        expected = fn(expected_x)
        assert_same(compiled(x), expected)
        assert_same(x, expected_x)
    assert tritonfuse.metrics.eager_graphs == 0


def test_no_copy_after_the_graph(device):
    """The new values are written by the graph's kernels, not by aot_autograd's eager
    copy_ after the graph."""
    def fn(x, y):
        x.add_(y)
        y.mul_(2)
        return x.sum()
    x, y = torch.randn(16, device=device), torch.randn(16, device=device)
    compiled = torch.compile(fn, backend="tritonfuse")
    compiled(x.clone(), y.clone())   # compile outside the counting mode
    expected_x, expected_y = x.clone(), y.clone()
    fn(expected_x, expected_y)
    with _CopiesInto([x, y]) as counter:
        compiled(x, y)
    assert counter.count == 0
    assert_same([x, y], [expected_x, expected_y])


def _bn_model(channels_last, dtype, device):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8))
    model = model.to(device=device, dtype=dtype).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_batch_norm_training_steps(device, channels_last, dtype):
    """Running mean, variance and num_batches_tracked after 3 training steps."""
    torch.manual_seed(0)
    eager = _bn_model(channels_last, dtype, device)
    compiled_model = _bn_model(channels_last, dtype, device)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model, backend="tritonfuse")
    tolerance = dict(atol=5e-2, rtol=5e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    for step in range(3):
        x = torch.randn(4, 3, 6, 6, device=device, dtype=dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        expected = eager(x)
        expected.float().square().mean().backward()
        actual = compiled(x)
        actual.float().square().mean().backward()
        assert_same(actual, expected, **tolerance)
        for name, buffer in eager.named_buffers():
            assert_same(dict(compiled_model.named_buffers())[name], buffer, **tolerance)
        for name, parameter in eager.named_parameters():
            assert_same(dict(compiled_model.named_parameters())[name].grad, parameter.grad, **tolerance)
    assert tritonfuse.metrics.eager_graphs == 0


def test_batch_norm_statistics_without_copy_kernels(device):
    """The running statistics are written by the kernels that compute them: the forward
    graph has no kernel of its own for them."""
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(16)).to(device).train()
    compiled = torch.compile(model, backend="tritonfuse")
    x = torch.randn(32, 16, device=device, requires_grad=True)
    _, sources = run_and_get_code(compiled, x)
    forward = next(s for s in sources if "MUTATED_INPUTS" in s)
    assert "copy_(" not in forward.split("def call")[1].replace("_given.copy_(", "")
    buffers = [model[0].running_mean, model[0].running_var, model[0].num_batches_tracked]
    with _CopiesInto(buffers) as counter:
        compiled(x)
    assert counter.count == 0


def test_cuda_graph_replays_write_the_input(device, monkeypatch):
    """Under mode="reduce-overhead" an input the graph writes into is used where it is (a
    replay writes the caller's tensor), and the capture's extra run does not write it twice."""
    from tritonfuse.runtime import cudagraphs
    if device != "cuda":
        from tests.cudagraph_emulation import EmulatedDriver
        monkeypatch.setitem(cudagraphs.DRIVERS, "cpu", EmulatedDriver())

    def fn(x, y):
        x.mul_(2).add_(y)
        return x.sum()
    x, y = torch.randn(32, device=device), torch.randn(32, device=device)
    expected_x = x.clone()
    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    for _ in range(4):
        expected = fn(expected_x, y)
        assert_same(compiled(x, y), expected, atol=1e-4, rtol=1e-4)
        assert_same(x, expected_x, atol=1e-4, rtol=1e-4)
    assert tritonfuse.metrics.cudagraph_replays >= 2


def test_first_call_failing_after_a_write_runs_eagerly_from_the_old_values(device, monkeypatch):
    """Generated code that fails on its first call after writing an input: the input gets
    its old value back, and the eager graph (which holds the copy_) writes it once."""
    from tritonfuse import compile_fx
    original_init = compile_fx.CompiledGraph.__init__

    def failing_after_the_call(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        real_call = self.call

        def call(inputs):
            real_call(inputs)
            raise RuntimeError("injected failure after the kernels ran")
        self.call = call
    monkeypatch.setattr(compile_fx.CompiledGraph, "__init__", failing_after_the_call)

    def fn(x):
        x.add_(1)
        return x * 2
    x = torch.randn(10, device=device)
    expected_x = x.clone()
    compiled = torch.compile(fn, backend="tritonfuse")
    for _ in range(2):
        assert_same(compiled(x), fn(expected_x))
        assert_same(x, expected_x)
    assert tritonfuse.metrics.eager_graphs == 1


def test_graph_loaded_from_the_cache_writes_the_input(device):
    def fn(x):
        x.mul_(3)
        return x + 1
    for expect_hit in (False, True):
        torch._dynamo.reset()
        hits = tritonfuse.metrics.graph_cache_hits
        check_mutation(fn, torch.randn(12, device=device), calls=2)
        assert (tritonfuse.metrics.graph_cache_hits > hits) == expect_hit
