"""Indirect writes: scatter, scatter_add, scatter_reduce, index_put (and its unsafe and
masked forms), index_add. Each is compared with eager on every column of the device
matrix; where the op must generate code the test also asserts it is no fallback."""
import pytest
import torch

import tritonfuse
from common import assert_same, check, kernel_count, rand
from tritonfuse.codegen.registry import deterministic_scatter, get_scheduling_class
from tritonfuse.lowering.indexing import unordered_writes_allowed

aten = torch.ops.aten


def _triton(device) -> bool:
    """Whether the column generates Triton kernels (atomics) rather than C++ loops."""
    return device == "cuda" or tritonfuse.config.cpu_backend == "triton"


def _ordered(device) -> bool:
    """Whether the column's backend lands colliding writes in a fixed order (C++ loops, the
    Triton interpreter) rather than in the order atomics happen to run (GPUs)."""
    return deterministic_scatter(device)


def _no_fallbacks():
    """No fallback but the one by design: on a GPU, where eager's op lands colliding writes
    in a fixed order, a write that may collide (float accumulation) stays with aten."""
    by_design = {op: why for op, why in tritonfuse.metrics.fallbacks.items() if "land in no fixed order" in why}
    assert tritonfuse.metrics.fallbacks == by_design, tritonfuse.metrics.fallbacks
    assert by_design or kernel_count() > 0


def _unique_index(rows, cols, high, device, dim=0):
    """An int64 index of shape (rows, cols) whose entries along ``dim`` are distinct (no
    two writes to one element: a plain scatter is then deterministic on every backend)."""
    lines = cols if dim == 0 else rows
    picks = torch.stack([torch.randperm(high)[: rows if dim == 0 else cols] for _ in range(lines)])
    return (picks.t() if dim == 0 else picks).contiguous().to(device)


# ---- scatter ------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_src_and_value(device, dim):
    torch.manual_seed(0)
    x = rand(6, 9, device=device)
    d = dim % 2
    index = _unique_index(4, 5, x.shape[d], device, dim=d)
    src = rand(5, 7, device=device)
    check(lambda a, i, s: (torch.scatter(a, dim, i, s), torch.scatter(a, dim, i, 2.5)), x, index, src)
    _no_fallbacks()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_scatter_add_with_duplicate_indices(device, dtype):
    torch.manual_seed(0)
    x = rand(7, 5, dtype=dtype, device=device)
    index = torch.randint(0, 7, (12, 5), device=device)   # many rows land on one
    src = rand(12, 5, dtype=dtype, device=device)
    check(lambda a, i, s: torch.scatter_add(a, 0, i, s), x, index, src)
    _no_fallbacks()


def test_scatter_add_3d_inner_dim(device):
    torch.manual_seed(0)
    x = rand(3, 4, 8, device=device)
    index = torch.randint(0, 8, (3, 4, 11), device=device)
    src = rand(3, 4, 11, device=device)
    check(lambda a, i, s: a.scatter_add(2, i, s) * 2, x, index, src)
    _no_fallbacks()


def test_scatter_and_gather_at_a_constant_index(device):
    """An index made inside the graph as a constant (every element to row 0) is folded
    into the kernel: Triton's interpreter refused its run-time bounds test beside the
    block mask, and the graph ran eagerly."""
    x = rand(6, 9, device=device)

    def fn(a):
        zeros = torch.zeros(6, 6, dtype=torch.long, device=a.device)
        ones = torch.ones(6, 4, dtype=torch.long, device=a.device)
        return a.clone().scatter_add_(1, zeros, a[:, :6] * 2), torch.gather(a, 1, ones) + 1
    check(fn, x)


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "amax", "amin", "prod"])
def test_scatter_reduce(device, reduce, include_self):
    torch.manual_seed(0)
    x = rand(6, 4, device=device, low=0.5, high=1.5)
    index = torch.randint(0, 6, (9, 4), device=device)
    src = rand(9, 4, device=device, low=0.5, high=1.5)
    check(lambda a, i, s: torch.scatter_reduce(a, 0, i, s, reduce, include_self=include_self), x, index, src)
    if reduce != "sum" and _triton(device):   # no atomic multiply, no NaN-safe float atomic max/min
        assert "aten.scatter_reduce.two" in tritonfuse.metrics.fallbacks
        assert reduce[-3:] in tritonfuse.metrics.fallbacks["aten.scatter_reduce.two"]
    else:
        _no_fallbacks()


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_scatter_reduce_max_min_propagate_nan_of_either_sign(device, reduce):
    """A NaN in the source or in the element written wins, whatever its sign bit (x86 makes
    0/0 a negative NaN; an atomic max/min comparing bits as integers would drop it)."""
    nan, negative_nan = float("nan"), -torch.tensor(float("nan"))
    x = torch.tensor([[1.0, -2.0], [3.0, nan], [0.0, 0.0]], device=device)
    x[2, 1] = negative_nan
    src = torch.tensor([[nan, 5.0], [0.0, 1.0], [2.0, -7.0], [-1.0, 2.0]], device=device)
    src[1, 0] = negative_nan
    index = torch.tensor([[0, 1], [2, 1], [0, 0], [2, 2]], device=device)
    check(lambda a, i, s: torch.scatter_reduce(a, 0, i, s, reduce), x, index, src)


def test_scatter_reduce_int64(device):
    torch.manual_seed(0)
    x = rand(5, 3, dtype=torch.int64, device=device)
    index = torch.randint(0, 5, (8, 3), device=device)
    src = rand(8, 3, dtype=torch.int64, device=device)
    check(lambda a, i, s: (torch.scatter_reduce(a, 0, i, s, "amax"), torch.scatter_reduce(a, 0, i, s, "sum")),
          x, index, src)
    _no_fallbacks()


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_with_reduce_argument(device):
    torch.manual_seed(0)
    x = rand(6, 4, device=device)
    index = torch.randint(0, 6, (9, 4), device=device)
    src = rand(9, 4, device=device)
    check(lambda a, i, s: torch.scatter(a, 0, i, s, reduce="add"), x, index, src)
    _no_fallbacks()


def test_one_index_per_line_scatter_is_pointwise(device):
    """nll_loss_backward's scatter: one index per row along dim 1 needs no write at all."""
    torch.manual_seed(0)
    x = rand(8, 10, device=device)
    index = torch.randint(0, 10, (8, 1), device=device)
    src = rand(8, 1, device=device)
    check(lambda a, i, s: (torch.scatter(torch.zeros_like(a), 1, i, -1.0) * a + 1,
                           torch.scatter_add(a, 1, i, s).exp()), x, index, src)
    _no_fallbacks()
    assert kernel_count() == 1


def test_scatter_empty_index(device):
    x = rand(4, 3, device=device)
    index = torch.zeros(0, 3, dtype=torch.int64, device=device)
    src = rand(0, 3, device=device)
    check(lambda a, i, s: torch.scatter_add(a, 0, i, s) + 1, x, index, src)


# ---- index_put ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_index_put_accumulate_with_duplicate_and_negative_indices(device, dtype):
    torch.manual_seed(0)
    x = rand(10, 6, dtype=dtype, device=device)
    index = torch.tensor([1, 3, 1, -1, 9, -10, 3], device=device)
    values = rand(7, 6, dtype=dtype, device=device)
    check(lambda a, i, v: torch.index_put(a, [i], v, accumulate=True), x, index, values)
    _no_fallbacks()


def test_index_put_overwrite(device):
    torch.manual_seed(0)
    x = rand(10, 6, device=device)
    index = torch.tensor([4, -2, 0, 7], device=device)   # distinct after wrapping
    values = rand(4, 6, device=device)
    check(lambda a, i, v: torch.index_put(a, [i], v) + 1, x, index, values)
    _no_fallbacks()


def test_index_put_overwrite_duplicates_of_equal_values(device):
    x = rand(8, device=device)
    index = torch.tensor([2, 5, 2, 2], device=device)
    check(lambda a, i: torch.index_put(a, [i], torch.ones(4, device=a.device)), x, index)
    _no_fallbacks()


def test_index_put_several_index_tensors_and_slices(device):
    torch.manual_seed(0)
    x = rand(5, 6, 7, device=device)
    rows = torch.tensor([0, 4, 4, 2], device=device)
    cols = torch.tensor([[1], [6], [6], [0]], device=device)   # broadcasts with rows to (4, 4)
    inner = torch.tensor([3, 3, 5], device=device)

    def fn(a, r, c, i):
        both = aten.index_put(a, [r, None, c], torch.ones(4, 4, 6, device=a.device), True)
        middle = aten.index_put(a, [None, None, i], torch.full((5, 6, 3), 2.0, device=a.device), True)
        return both, middle
    check(fn, x, rows, cols, inner)
    _no_fallbacks()


def test_index_put_broadcast_values(device):
    x = rand(6, 4, device=device)
    index = torch.tensor([5, 0, 5], device=device)
    check(lambda a, i: torch.index_put(a, [i], torch.tensor([1.0, 2.0, 3.0, 4.0], device=a.device),
                                       accumulate=True), x, index)
    _no_fallbacks()


def test_unsafe_index_put(device):
    x = rand(9, 3, device=device)
    index = torch.tensor([8, 0, 8, 2], device=device)
    values = rand(4, 3, device=device)
    check(lambda a, i, v: aten._unsafe_index_put(a, [i], v, True), x, index, values)
    _no_fallbacks()


def test_unsafe_masked_index_put_accumulate(device):
    """Indices may be out of range where the mask is off (nothing lands there)."""
    x = torch.zeros(6, 4, device=device)
    index = torch.tensor([1, 99, 5, -40, 1], device=device)
    mask = (index >= 0) & (index < 6)
    values = rand(5, 4, device=device)
    check(lambda a, m, i, v: aten._unsafe_masked_index_put_accumulate(a, m[:, None], [i], v), x, mask, index,
          values)
    _no_fallbacks()


def test_index_put_with_boolean_mask_and_one_value(device):
    x = rand(5, 6, device=device)
    mask = x > 0

    def fn(a, m):
        return (torch.index_put(a, [m], torch.tensor(0.0, device=a.device)),
                torch.index_put(a, [m[:, 0]], torch.tensor([2.0], device=a.device), accumulate=True))
    check(fn, x, mask)
    _no_fallbacks()


def test_index_put_result_read_twice_and_written_again(device):
    """A scatter writes a copy of its input: the input and the first result stay intact
    when a second scatter writes the first result."""
    x = rand(8, 3, device=device)
    i1, i2 = torch.tensor([0, 7, 0], device=device), torch.tensor([3, 3], device=device)

    def fn(a, i, j):
        y = torch.index_put(a, [i], torch.ones(3, 3, device=a.device), accumulate=True)
        z = torch.index_put(y, [j], torch.full((2, 3), 5.0, device=a.device), accumulate=True)
        return z * 2 + y, y.sum(0), a + 1
    check(fn, x, i1, i2)
    _no_fallbacks()


def test_index_put_transposed_input_keeps_eager_strides(device):
    x = rand(6, 5, device=device).t()
    index = torch.tensor([0, 4], device=device)
    check(lambda a, i: torch.index_put(a, [i], torch.ones(2, 6, device=a.device), accumulate=True), x, index)


# ---- index_add ----------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1])
def test_index_add(device, dim):
    torch.manual_seed(0)
    x = rand(6, 7, device=device)
    index = torch.tensor([5, 0, 5, -1] if dim == 0 else [6, 6, 1, 0], device=device) % x.shape[dim]
    source = rand(4, 7, device=device) if dim == 0 else rand(6, 4, device=device)
    check(lambda a, i, s: torch.index_add(a, dim, i, s, alpha=2), x, index, source)
    _no_fallbacks()


def test_index_copy_and_index_fill(device):
    x = rand(5, 6, device=device)
    index = torch.tensor([4, 0, 2], device=device)
    check(lambda a, i: (a.index_copy(1, i, torch.arange(15.0, device=a.device).view(5, 3)),
                        a.index_fill(0, i, -1.5), a.index_fill(1, i[1], a[0, 0])), x, index)
    _no_fallbacks()


def test_take(device):
    x = rand(4, 6, device=device).t()   # take reads in row-major order of the (transposed) view
    index = torch.tensor([[0, 23], [-1, 7], [11, -24]], device=device)
    check(lambda a, i: torch.take(a * 2, i), x, index)
    _no_fallbacks()


def test_scatter_in_a_reduction_kernel_with_an_index_constant_along_the_row(device):
    """The scatter reads softmax's rows (one kernel on Triton) through an index that is the
    same for the whole row: every lane of a row adds into one element."""
    torch.manual_seed(0)
    x, w = torch.zeros(7, device=device), rand(5, 6, device=device)
    index = torch.tensor([[3], [0], [3], [6], [1]], device=device)
    check(lambda a, i, b: torch.index_put(a, [i.expand_as(b)], torch.softmax(b, -1), accumulate=True), x, index, w)
    _no_fallbacks()


# ---- fusion, determinism ------------------------------------------------------------------

def test_scatter_kernel_computes_its_values_and_index(device):
    """The values (and the index) are computed inside the scatter's kernel; the copy of
    the input runs first; a reader of the result gets its own kernel."""
    torch.manual_seed(0)
    x, v = rand(12, 16, device=device), rand(20, 16, device=device)
    index = torch.randint(0, 12, (20,), device=device)
    # index_add: its colliding float sums land in no fixed order in eager on every column that
    # has atomics, so it is a kernel everywhere (index_put's accumulate is sorted on CUDA)
    check(lambda a, i, w: torch.index_add(a, 0, i * 1, torch.sigmoid(w) * 2 + 1), x, index, v)
    _no_fallbacks()
    assert kernel_count() == 2   # copy of x, scatter
    tritonfuse.metrics.reset()
    torch._dynamo.reset()
    check(lambda a, i, w: torch.index_add(a, 0, i, w).relu(), x, index, v)
    assert kernel_count() == 3   # copy, scatter, relu: relu must not read while others write


def test_deterministic_mode_falls_back_for_atomic_float_sums(device):
    """Also when the same graph was compiled (and cached) before the mode was turned on."""
    x = rand(6, 4, device=device)
    index = torch.tensor([1, 1, 3], device=device)
    values = rand(3, 4, device=device)
    add = lambda a, i, v: torch.scatter_add(a, 0, i[:, None].expand_as(v), v)   # noqa: E731
    check(add, x, index, values)
    _no_fallbacks()   # eager's scatter_add is unordered on CUDA too
    torch.use_deterministic_algorithms(True)
    try:
        check(add, x, index, values)
    finally:
        torch.use_deterministic_algorithms(False)
    if _ordered(device):   # C++ loops and the interpreter give every element its writes in order
        _no_fallbacks()
    else:
        assert "deterministic" in tritonfuse.metrics.fallbacks["aten.scatter_add.default"]


def test_unordered_writes_are_lowered_only_where_eager_is_unordered(device, monkeypatch):
    """A backend whose colliding writes land in no fixed order (float atomics on a GPU)
    lowers an op only on devices where eager's kernel is as unordered (scatter_add on CUDA,
    index_put(accumulate=True) on the CPU; EAGER_UNORDERED_WRITES) or where torch.compile's
    default compiler lowers it so too (index_put(accumulate=True) on CUDA;
    UNORDERED_AS_TORCH_COMPILE); elsewhere eager's deterministic kernel runs. Writes whose order cannot matter are always lowered.
    The column's backend is made unordered here, so CI checks the GPU's rule."""
    monkeypatch.setattr(get_scheduling_class(device), "deterministic_scatter", False)
    x, values = rand(7, 3, device=device), rand(5, 3, device=device)
    index = torch.tensor([6, 0, 6, -1, 2], device=device)

    def fn(a, i, v):   # (ops unlike the other tests': a graph of its own in the graph cache)
        rows = i % 7
        return (torch.index_put(a * 3, [i], v, accumulate=True),
                torch.scatter_add(a - 1, 0, rows[:, None].expand_as(v), v),
                torch.index_put(a.int(), [i], v.int(), accumulate=True), a.index_fill(0, i, 0.25))
    check(fn, x, index, values)
    fallbacks = tritonfuse.metrics.fallbacks
    device_type = torch.device(device).type
    assert ("aten.index_put.default" in fallbacks) != unordered_writes_allowed(device_type, "index_put_accumulate")
    assert ("aten.scatter_add.default" in fallbacks) != unordered_writes_allowed(device_type, "scatter_add")
    assert "aten.index_fill.int_Scalar" not in fallbacks, fallbacks
    assert all("deterministic" in reason for reason in fallbacks.values()), fallbacks
    tritonfuse.metrics.reset()
    torch.use_deterministic_algorithms(True)
    try:
        check(lambda a, i, v: torch.index_put(a * 3, [i], v, accumulate=True), x, index, values)
    finally:
        torch.use_deterministic_algorithms(False)
    assert "deterministic algorithms" in tritonfuse.metrics.fallbacks["aten.index_put.default"]


def test_scatter_writes_are_guarded_by_the_index_bounds(device):
    """An index out of range writes nothing (eager raises; a GPU compiles device_assert out,
    and a write outside the tensor would corrupt memory): the store's mask, or the C++
    guard, holds the bounds check of every indirect index it writes through."""
    x, values = rand(9, 4, device=device), rand(3, 4, device=device)
    index = torch.tensor([8, 0, 8], device=device)   # (scatter_add: no negative indices)
    sources = check(lambda a, i, v: torch.scatter_add(a, 0, (i + 0)[:, None].expand_as(v), v * 2), x, index, values)
    kernels = [s for s in sources[1:] if "atomic" in s or "if (0 <=" in s]
    assert kernels, sources
    if _triton(device):
        line = next(line for line in kernels[0].splitlines() if "tl.atomic_add(" in line)
        assert "(0 <= tmp" in line and " < 9)" in line, line


# ---- symbolic sizes -----------------------------------------------------------------------

LENGTHS = (7, 33, 13, 64)


def _symbolic_scatters(a, i, v, rows, targets):
    m = (rows >= 0) & (rows < a.shape[0])
    return (torch.scatter_add(a, 0, targets[:, None].expand_as(v), v),
            torch.index_put(a, [i], v, accumulate=True),                  # negative indices wrap
            aten._unsafe_masked_index_put_accumulate(torch.zeros_like(a), m[:, None], [rows], v),
            torch.scatter(torch.zeros_like(a), 1, targets[: a.shape[0], None] % 3, -1.0),   # one-hot
            torch.index_put(a, [a > 0], torch.tensor(0.5, device=a.device)),
            a.index_fill(1, targets[:2] % 3, 2.0), torch.take(a, i))


def test_scatters_over_symbolic_sizes(device):
    """One symbolic compile serves every length: index bounds, clamps, the one-hot and
    boolean-mask forms and the C++ loop bounds all follow the sizes at run time."""
    compiled = torch.compile(_symbolic_scatters, backend="tritonfuse", dynamic=True)
    torch.manual_seed(0)
    for n in LENGTHS:
        x, values = rand(n, 3, device=device), rand(n + 2, 3, device=device)
        index = torch.randint(-n, n, (n + 2,), device=device)
        rows = torch.randint(-n, 2 * n, (n + 2,), device=device)      # out of range where masked off
        targets = torch.randint(0, n, (n + 2,), device=device)
        inputs = (x, index, values, rows, targets)
        assert_same(compiled(*inputs), _symbolic_scatters(*inputs))
    metrics = tritonfuse.metrics
    assert metrics.eager_graphs == 0 and metrics.static_specializations == 0 and metrics.symbolic_graphs == 1
    _no_fallbacks()     # on a GPU the float sums of index_put add with atomics, as torch.compile's do
