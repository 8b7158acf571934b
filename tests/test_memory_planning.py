"""Memory planning in the wrapper (tritonfuse/codegen/memory_planning.py): kernels write in
place over buffers that die in them, dead buffers are reused before allocating, and
inputs, outputs, views, aliases and mutated buffers are never taken over."""
import re

import pytest
import torch

import tritonfuse
from tritonfuse.testing import run_and_get_code

from common import allocation_count, assert_same, check, rand


def _wrapper(sources):
    return sources[0]


def _taken_over(wrapper, kind):
    """Names bound by ``bufN = bufM; del bufM  # kind`` (or through reinterpret_tensor)."""
    return re.findall(rf"^\s*(buf\d+) = (?:reinterpret_tensor\()?(buf\d+)[,;].*# {kind}$", wrapper, re.M)


def test_mlp_allocates_only_the_mm_outputs(device):
    """``x = relu(x @ w) * 2`` over 4 layers: each relu * 2 kernel writes over the mm
    output it reads, so the wrapper allocates nothing itself."""
    ws = [rand(32, 32, device=device) / 8 for _ in range(4)]

    def mlp(x):
        for w in ws:
            x = torch.relu(x @ w) * 2
        return x

    sources = check(mlp, rand(8, 32, device=device))
    wrapper = _wrapper(sources)
    assert allocation_count(wrapper) == 0, wrapper
    assert wrapper.count("torch.mm(") == 4
    assert len(_taken_over(wrapper, "in place")) == 4, wrapper
    assert all("in_out_ptr0" in kernel for kernel in sources[1:])


def test_in_place_reading_the_buffer_several_times(device):
    w = rand(16, 16, device=device)

    def fn(x):
        y = x @ w
        return (y * y + y.sin()) / (y.abs() + 1)

    wrapper = _wrapper(check(fn, rand(16, 16, device=device)))
    assert len(_taken_over(wrapper, "in place")) == 1
    assert allocation_count(wrapper) == 0


def test_no_in_place_over_a_transposed_read(device):
    """A kernel that reads the dying buffer at other elements than it writes must not
    write over it (other programs still read what it overwrites)."""
    w = rand(32, 32, device=device)

    def fn(x):
        y = x @ w
        return y + y.t() * 2

    wrapper = _wrapper(check(fn, rand(32, 32, device=device)))
    assert not _taken_over(wrapper, "in place")
    assert allocation_count(wrapper) == 1


def test_no_in_place_when_another_node_reads_the_buffer(device):
    """Two nodes of one kernel read the dying buffer (a row mean and the subtraction):
    neither may write over it."""
    w = rand(16, 64, device=device)

    def fn(x):
        y = x @ w
        return y - y.mean(1, keepdim=True)

    wrapper = _wrapper(check(fn, rand(8, 16, device=device)))
    assert not _taken_over(wrapper, "in place")


def test_outputs_are_never_reused(device):
    w = rand(16, 16, device=device)

    def fn(x):
        y = x @ w
        z = torch.relu(y) * 2          # y is returned: z must not overwrite it
        return y, z, z @ w

    wrapper = _wrapper(check(fn, rand(16, 16, device=device)))
    assert not _taken_over(wrapper, "in place") and not _taken_over(wrapper, "reuse")


def test_inputs_are_never_written_over(device):
    def fn(x, y):
        return torch.relu(x) * 2 + y

    x, y = rand(64, device=device), rand(64, device=device)
    x_before, y_before = x.clone(), y.clone()
    compiled = torch.compile(fn, backend="tritonfuse")
    result, sources = run_and_get_code(compiled, x, y)
    assert_same(result, fn(x_before, y_before))
    assert_same(x, x_before)
    assert_same(y, y_before)
    assert allocation_count(_wrapper(sources)) == 1


def test_views_of_an_output_are_never_reused(device):
    """An output that is a view of a buffer keeps that buffer's memory."""
    w = rand(16, 16, device=device)

    def fn(x):
        y = x @ w
        t = torch.relu(y) + 1
        return t.t(), (t * 3) @ w

    wrapper = _wrapper(check(fn, rand(16, 16, device=device)))
    for taker, source in _taken_over(wrapper, "in place") + _taken_over(wrapper, "reuse"):
        assert not re.search(rf"return .*\b{source}\b", wrapper), wrapper


def test_buffers_aliased_by_a_fallback_are_never_reused(device):
    """A view as another dtype (a fallback) returns a view of the mm output: the mm output
    dies at the fallback, but its memory lives on in the view, so the kernel reading that
    view transposed must not reuse it."""
    w = rand(32, 32, device=device)

    def fn(x):
        a = x @ w
        u = a.view(torch.int32).view(torch.float32)
        return (u.t() * 2 + 1) @ w

    wrapper = _wrapper(check(fn, rand(32, 32, device=device)))
    assert "aten.view.dtype" in wrapper
    assert not _taken_over(wrapper, "in place") and not _taken_over(wrapper, "reuse")


def test_mutated_inputs_keep_their_memory(device):
    w = rand(16, 16, device=device)

    def fn(x, acc):
        y = x @ w
        acc.add_(y)                     # an input mutation: written back after the graph
        return torch.relu(y) * 2, acc * 3

    x, acc = rand(16, 16, device=device), rand(16, 16, device=device)
    expected_acc = acc.clone()
    expected = fn(x.clone(), expected_acc)
    compiled = torch.compile(fn, backend="tritonfuse")
    actual = compiled(x, acc)
    assert_same(actual, expected)
    assert_same(acc, expected_acc)


def _centered(t):
    return t - t.mean(1, keepdim=True)     # two readers of t: never in place


def test_dead_buffer_is_reused(device):
    w1, w2, w3 = (rand(32, 32, device=device) / 4 for _ in range(3))

    def fn(x):
        b = _centered(x @ w1)          # the mm output dies here; b is allocated
        d = _centered(b @ w2)          # takes over a dead buffer of the same size
        return d @ w3

    wrapper = _wrapper(check(fn, rand(32, 32, device=device), atol=1e-4, rtol=1e-4))
    # b over the first mm output, and both later mms into the dead ones (out=)
    assert len(_taken_over(wrapper, "reuse")) == 3, wrapper
    assert allocation_count(wrapper) == 1


def test_matmul_fallback_writes_into_a_dead_buffer(device):
    """A matmul run on aten writes its result through out= into a dead buffer of its
    layout instead of allocating while that buffer waits for a later kernel (an LLM
    backward held one hidden state more than Inductor so: docs/results/memory.md, stop 27)."""
    w1, w2, w3 = (rand(32, 32, device=device) / 4 for _ in range(3))

    def fn(x):
        b = _centered(x @ w1)          # the first mm's output dies here
        c = b @ w2                     # written into it
        return _centered(c) @ w3       # the last mm into b's memory (an output of exact layout)

    wrapper = _wrapper(check(fn, rand(32, 32, device=device), atol=1e-4, rtol=1e-4))
    into = re.findall(r"^\s*torch\.mm\(.*, out=(buf\d+)\)$", wrapper, re.M)
    assert len(into) == 2, wrapper
    reused = dict(_taken_over(wrapper, "reuse"))
    assert all(name in reused for name in into), wrapper


def test_dead_buffer_is_freed_before_a_fallback_allocates(device):
    """A fallback that allocates its own result (a convolution) cannot take a dead buffer:
    the dead buffer is freed where it died rather than held across the fallback for a
    later kernel (that kernel allocates instead; the peak is lower)."""
    w1 = rand(32, 32, device=device) / 4
    k = rand(1, 1, 3, 1, device=device)

    def fn(x):
        y = x @ w1                                   # dies in the next kernel
        s = (y * y).sum(1, keepdim=True)
        c = torch.nn.functional.conv2d(s.view(1, 1, 32, 1), k, padding=(1, 0))
        return x * c.view(32, 1)                     # a (32, 32) result: the dead y would fit

    wrapper = _wrapper(check(fn, rand(32, 32, device=device), atol=1e-4, rtol=1e-4))
    assert "convolution" in wrapper and not _taken_over(wrapper, "reuse"), wrapper
    mm_result = re.search(r"^\s*(buf\d+) = torch\.mm\(", wrapper, re.M).group(1)
    freed = re.search(rf"^\s*del (\w+, )*{mm_result}\b", wrapper, re.M)
    assert freed and freed.start() < wrapper.index("convolution"), wrapper


def test_reuse_across_layouts_of_equal_size(device):
    """A dead (32, 32) buffer holds a (64, 16) result (through reinterpret_tensor)."""
    w1, w2, w3 = (rand(32, 32, device=device) / 4 for _ in range(3))
    w4 = rand(16, 8, device=device)

    def fn(x):
        b = _centered(x @ w1)
        c = b @ w2
        d = _centered(c.reshape(64, 16))
        return d @ w4

    wrapper = _wrapper(check(fn, rand(32, 32, device=device), atol=1e-4, rtol=1e-4))
    assert "reinterpret_tensor(" in wrapper and _taken_over(wrapper, "reuse"), wrapper


def test_symbolic_sizes_reuse_only_equal_sizes(device):
    """Under dynamic shapes a dead buffer is reused only when its size expression is
    provably equal: (s0, 32) for (s0, 32), never for (s1, 32)."""
    w1, w2, w3 = (rand(32, 32, device=device) / 4 for _ in range(3))

    def same(x):
        b = _centered(x @ w1)
        d = _centered(b @ w2)
        return d @ w3

    def different(x, y):
        b = _centered(x @ w1)
        d = _centered(y @ w2)
        return b @ w3, d @ w3

    # same: d over the first mm output, the later mms into dead ones (out=); different: the
    # (s0, 32) mm output dies before y @ w2 (s1 rows), which does not take it (it is freed
    # there, not held)
    for fn, inputs, reuses in ((same, [(6, 32)], 3), (different, [(6, 32), (10, 32)], 0)):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
        for rows in (0, 3):    # a second call with other sizes runs the same symbolic code
            args = [rand(n + rows, m, device=device) for n, m in inputs]
            result, sources = run_and_get_code(compiled, *args)
            assert_same(result, fn(*args), atol=1e-4, rtol=1e-4)
            if sources:
                wrapper = _wrapper(sources)
                assert len(_taken_over(wrapper, "reuse")) == reuses, wrapper
        assert tritonfuse.metrics.symbolic_graphs == 1, "not compiled symbolically"
        tritonfuse.metrics.reset()


def test_scatter_target_is_never_taken_over(device):
    """A scatter writes into its target's memory and its result keeps that memory: the
    target's name dies at the scatter, but no later kernel may take its memory while the
    result lives (here the next kernel: it reads the result and needs a buffer of the
    target's size)."""
    w1, w2 = rand(16, 16, device=device), rand(16, 16, device=device)

    def fn(x, idx, v):
        scattered = ((x @ w1) * 2).index_add(0, idx, v)   # a kernel on every column (unordered in eager too)
        other = _centered(torch.sigmoid(scattered)) @ w2
        return scattered + other

    idx = torch.tensor([1, 3, 3, 7], device=device)
    wrapper = _wrapper(check(fn, rand(16, 16, device=device), idx, rand(4, 16, device=device), atol=1e-4, rtol=1e-4))
    targets = re.findall(r"^\s*buf\d+ = (buf\d+)  # written in place$", wrapper, re.M)
    assert targets, wrapper
    sources = {source for _, source in _taken_over(wrapper, "in place") + _taken_over(wrapper, "reuse")}
    assert not sources & set(targets), wrapper


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_training_step_with_planned_memory(device, dtype):
    if dtype == torch.float16 and device == "cpu":
        pytest.skip("float16 matmuls on CPU tensors are slow and imprecise")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device=device, dtype=dtype)
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    x = rand(8, 16, device=device, dtype=dtype)
    compiled = torch.compile(model, backend="tritonfuse")
    compiled(x).square().sum().backward()
    names = [name for name, _ in model.named_parameters()]
    eager = torch.func.functional_call(model, dict(zip(names, reference)), (x,))
    eager.square().sum().backward()
    for param, ref in zip(model.parameters(), reference):
        assert_same(param.grad, ref.grad, atol=5e-2 if dtype == torch.float16 else 1e-4,
                    rtol=5e-2 if dtype == torch.float16 else 1e-4)


def test_mlp_peak_memory_is_at_most_eager(device):
    """With each relu * 2 written over its mm result, the compiled MLP holds at most what
    eager holds at once (eager keeps the mm result, the relu and the product)."""
    if device != "cuda":
        pytest.skip("peak memory is measured with torch.cuda.max_memory_allocated")
    from tritonfuse.testing import peak_memory
    ws = [rand(1024, 1024, device=device) / 32 for _ in range(4)]

    def mlp(x):
        for w in ws:
            x = torch.relu(x @ w) * 2
        return x

    compiled = torch.compile(mlp, backend="tritonfuse")
    x = rand(1024, 1024, device=device)
    compiled(x)                                     # compile and autotune first
    expected, eager_peak = peak_memory(mlp, x)
    actual, compiled_peak = peak_memory(compiled, x)
    assert_same(actual, expected, atol=1e-3, rtol=1e-3)
    assert compiled_peak <= eager_peak, (compiled_peak, eager_peak)


def test_inputs_are_freed_after_their_last_use(device):
    """A graph input is released (its name deleted) after the kernel that reads it last,
    not at the end of the graph: the backward's inputs are the saved activations."""
    w = rand(16, 16, device=device)

    def fn(a, b):
        x = (a.sin() @ w).cos()       # the last read of a
        return (x @ w) * b

    wrapper = _wrapper(check(fn, rand(16, 16, device=device), rand(16, 16, device=device)))
    first_mm = wrapper.index("torch.mm(")
    assert re.search(r"^\s*del (\w+, )*arg0\b", wrapper[:wrapper.index("torch.mm(", first_mm + 1)], re.M), \
        wrapper


def test_training_backward_releases_saved_activations(device):
    """A deep MLP's backward frees each saved activation once its layer's gradient is
    computed: the step's peak stays well under all activations plus all gradients (it
    held every saved input to the end of the backward graph before)."""
    from tritonfuse import config
    if device != "cpu" or config.cpu_backend != "cpp":
        pytest.skip("measured on CPU tensors with the profiler's memory events (the Triton interpreter "
                    "copies every kernel argument)")
    from tritonfuse.testing import peak_cpu_memory
    torch.manual_seed(0)
    width, depth, rows = 256, 8, 512
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width, bias=False), torch.nn.Tanh())
                                  for _ in range(depth)]).to(device)
    x = rand(rows, width, device=device)
    compiled = torch.compile(model, backend="tritonfuse")

    def step():
        model.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
    step()
    grads = [p.grad.clone() for p in model.parameters()]
    _, peak = peak_cpu_memory(step)
    for param, grad in zip(model.parameters(), grads):
        assert_same(param.grad, grad)
    activation = rows * width * 4
    weight_grads = depth * width * width * 4
    # the forward saves about one activation per layer; freed as the backward walks down,
    # they and the gradients never all live at once (5.0 MB measured; 10.3 MB when the
    # backward held its inputs to its end)
    assert peak <= depth * activation + weight_grads, (peak, depth * activation + weight_grads)


def _backward_wrapper(sources):
    return next(s for s in sources if s.startswith("# tritonfuse generated code for backward"))


def test_backward_writes_over_a_donated_saved_tensor(device):
    """The backward's gradient of ``sin(x @ w)`` is written in place over the saved mm
    output, which aot_autograd donates (bw_donated_idxs): no allocation for it."""
    w = rand(32, 32, device=device).requires_grad_()
    x = rand(16, 32, device=device).requires_grad_()

    def fn(x, w):
        return (x @ w).sin().sum()

    expected = torch.autograd.grad(fn(x, w), (x, w))
    compiled = torch.compile(fn, backend="tritonfuse")
    loss, sources = run_and_get_code(lambda: torch.autograd.grad(compiled(x, w), (x, w)))
    for got, want in zip(loss, expected):
        assert_same(got, want)
    backward = _backward_wrapper(sources)
    assert re.search(r"^\s*buf\d+ = arg\d+; del arg\d+  # in place$", backward, re.M), backward
    assert "OVERWRITTEN_INPUTS = " in backward
    again = torch.autograd.grad(compiled(x, w), (x, w))   # the donated memory is the step's own
    for got, want in zip(again, expected):
        assert_same(got, want)


def test_retained_graph_donates_nothing(device):
    """A first backward with retain_graph=True compiles a backward that keeps its inputs
    (aot_autograd donates nothing then): a second backward sees them intact."""
    w = rand(32, 32, device=device).requires_grad_()
    x = rand(16, 32, device=device)

    def fn(x):
        return (x @ w).sin().sum()

    fn(x).backward()
    expected = w.grad.clone() * 2
    w.grad = None
    compiled = torch.compile(fn, backend="tritonfuse")
    loss, sources = run_and_get_code(lambda: compiled(x))
    backward_sources = run_and_get_code(lambda: loss.backward(retain_graph=True))[1]
    loss.backward()
    assert_same(w.grad, expected)
    assert "OVERWRITTEN_INPUTS" not in _backward_wrapper(backward_sources)


def test_in_place_over_a_buffer_of_another_shape(device):
    """A pointwise kernel writes its [4, 4, 32] result over the [16, 32] mm output it
    reads element for element: the same memory, read where it is written."""
    w = rand(32, 32, device=device) / 4

    def fn(x):
        a = (x @ w).view(4, 4, 32).sin() * 2
        return torch.bmm(a, a.transpose(1, 2))

    wrapper = _wrapper(check(fn, rand(16, 32, device=device)))
    assert re.search(r"^\s*buf\d+ = reinterpret_tensor\(buf\d+, .*# in place$", wrapper, re.M), wrapper
    assert allocation_count(wrapper) == 0, wrapper
