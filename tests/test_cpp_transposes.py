"""C++ backend: transposing tile fills and transposed tile writes (8x8 AVX shuffles on
8-lane machines, 16x16 butterflies on AVX-512), and the read caches of lanes-are-rows
reductions (cpu_backend/read_cache.py), against eager: odd sizes, sliced and transposed
views, f32 / bf16 / f16 (and 4-byte integers through the float path)."""
import re

import pytest
import torch

import tritonfuse
from common import check, rand
from conftest import DEVICE_MATRIX

pytestmark = pytest.mark.skipif(not any(e[0] == "cpu" for e in DEVICE_MATRIX),
                                reason="no C++ compiler with OpenMP on this machine")

TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
             torch.float16: dict(atol=2e-3, rtol=2e-3)}


@pytest.fixture(autouse=True)
def cpp_backend(monkeypatch):
    monkeypatch.setattr(tritonfuse.config, "cpu_backend", "cpp")


def _values(shape, dtype):
    if dtype.is_floating_point:
        return rand(*shape, dtype=dtype)
    return torch.randint(-1000, 1000, shape, dtype=dtype)


# (the base tensor's shape, the view the compiled function reads): views are taken inside
# the function, so a sliced view reaches the kernel as one (check() clones its inputs)
VIEWS = [
    ((40, 64), lambda b: b.t()),                        # whole 8x8 / 16x16 blocks, whole tiles
    ((53, 70), lambda b: b.t()),                        # edge tiles: 8-blocks and a scalar rest
    ((9, 131), lambda b: b.t()),                        # fewer columns than a block
    ((90, 80), lambda b: b.t()[5:67, 3:70]),            # a sliced transposed view
    ((2, 35, 24), lambda b: b.transpose(1, 2)),         # a batch dim outside the tiles
    # rows short of a block (masked loads on AVX-512): a 3x3 conv weight made channels-last
    # (9 rows by the input channels), and 2 and 15 rows, with and without a column rest
    ((4, 35, 9), lambda b: b.transpose(1, 2)),
    ((3, 32, 2), lambda b: b.transpose(1, 2)),
    ((2, 48, 15), lambda b: b.transpose(1, 2)),
    ((4, 9, 35), lambda b: b.transpose(1, 2)),          # columns short of a block: 9, 3 and 2
    ((3, 3, 49), lambda b: b.transpose(1, 2)),
    ((2, 2, 37), lambda b: b.transpose(1, 2)),
]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
def test_transposing_tile_fills(view, dtype):
    shape, take = view
    base = _values(shape, dtype)
    y = _values(tuple(take(base).shape), dtype)
    sources = check(lambda a, b: take(a) * 3 + b, base, y, **TOLERANCE.get(dtype, {}))
    assert "_to_tile<" in "\n".join(sources[1:])


@pytest.mark.parametrize("shape", [(64, 48), (37, 21), (40, 8), (19, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_transposed_tile_writes(shape, dtype):
    # layer_norm of a transposed input writes row-major: r steps staged in a tile of up to
    # 16 steps per vector of rows, written transposed (8 steps at a time on AVX2, a scalar
    # rest), every lane of a partial vector of rows too
    x = rand(shape[1], shape[0], dtype=dtype).t()
    sources = check(lambda a: torch.nn.functional.layer_norm(a, a.shape[-1:]) * 2, x, **TOLERANCE[dtype])
    assert "store_tile_transposed" in "\n".join(sources[1:])


def _sub_softmax(a):
    return a - torch.softmax(a, -1), torch.log_softmax(a, -1)


@pytest.mark.parametrize("view", [
    ((128, 256), lambda b: b.t()),                      # power-of-two stride, whole vectors
    ((45, 37), lambda b: b.t()),                        # a partial vector of rows
    ((60, 80), lambda b: b.t()[3:70, 5:50]),            # a sliced transposed view
    ((3, 33, 40), lambda b: b.transpose(1, 2)),         # an outer row dim
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_read_cache_of_a_strided_reduced_dim(view, dtype):
    # softmax-like kernels whose lanes are rows read the input in each of their loops: the
    # first loop keeps its reads in a row per lane, later loops read that copy
    shape, take = view
    sources = check(lambda b: _sub_softmax(take(b)), rand(*shape, dtype=dtype), **TOLERANCE[dtype])
    kernels = "\n".join(sources[1:])
    assert "read again by later loops" in kernels, kernels
    for kernel in kernels.split('extern "C"')[1:]:
        for cache in set(re.findall(r"\b(cache_arg\d+_\d+)\b", kernel)):
            # a cache is written once (the first loop) and read by the later loops
            assert kernel.count(f"tf::vstore<TAIL>({cache} +") == 1, kernel


def test_read_cache_stays_within_its_budget():
    # rows longer than READ_CACHE_BYTES allows: the plain strided rereads, still correct
    from cpu_backend.read_cache import READ_CACHE_BYTES
    long_row = READ_CACHE_BYTES // (16 * 4) + 8
    x = rand(long_row, 24).t()
    sources = check(_sub_softmax, x)
    assert "read again by later loops" not in "\n".join(sources[1:])
