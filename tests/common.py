"""Shared test helpers: compile with tritonfuse, compare against eager."""
import re

import torch

import tritonfuse
from tritonfuse.testing import run_and_get_code

TOLERANCES = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float64: dict(atol=1e-7, rtol=1e-7),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def tolerance_for(value, atol=None, rtol=None):
    base = TOLERANCES.get(value.dtype, dict(atol=0, rtol=0))
    return dict(atol=base["atol"] if atol is None else atol, rtol=base["rtol"] if rtol is None else rtol)


def assert_same(actual, expected, atol=None, rtol=None):
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, atol, rtol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected
        return
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.device == expected.device
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance_for(expected, atol, rtol))


def check(fn, *inputs, atol=None, rtol=None, check_strides=True):
    """Run ``fn`` eagerly and compiled with tritonfuse; assert equal results and layouts.
    Returns the generated sources."""
    expected = fn(*[_clone(i) for i in inputs])
    compiled = torch.compile(fn, backend="tritonfuse", dynamic=False)
    actual, sources = run_and_get_code(compiled, *[_clone(i) for i in inputs])
    assert tritonfuse.metrics.eager_graphs == 0, "tritonfuse failed to compile the graph (ran it eagerly)"
    assert_same(actual, expected, atol, rtol)
    if check_strides:
        _assert_same_strides(actual, expected)
    return sources


def storage_sharing(tensors):
    """Which pairs of tensors share memory: the aliasing a caller can observe."""
    return [[a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() for b in tensors]
            for a in tensors]


def _assert_same_strides(actual, expected):
    if isinstance(expected, (list, tuple)):
        for a, e in zip(actual, expected):
            _assert_same_strides(a, e)
    elif isinstance(expected, torch.Tensor) and expected.numel() > 1:
        assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def allocation_count(wrapper: str) -> int:
    """Buffers a generated wrapper allocates (empty_strided, or its CPU or CUDA fast path)."""
    return len(re.findall(r"= empty_strided(?:_cpu|_cuda)?\(", wrapper))


def kernel_count():
    return tritonfuse.metrics.generated_kernel_count


def rand(*shape, dtype=torch.float32, device="cpu", low=-3, high=3):
    if dtype == torch.bool:
        return torch.rand(*shape, device=device) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(low, high, shape, device=device, dtype=dtype)
    return (torch.rand(*shape, device=device, dtype=torch.float32) * (high - low) + low).to(dtype)
